"""Nobody on the pod network can get the driver restarted through its health or metrics port.

A real `eks-dra-driver` process with the usual 1,024 open-files soft limit; from this test, over 127.0.0.1
only: 2,000 idle connections to each port (half of them slowloris: a request head started, never ended)
and 2,400 queued requests to each (sent, the response never read). Meanwhile three kubelet-style liveness
probes, as the shipped DaemonSet declares them, must each pass within 1 s, a scrape must answer within 1 s,
the driver's RSS must grow by less than RSS_GROWTH_BOUND and its threads by at most one (the metrics pool's
second worker). Then the idle connections must be closed by the driver within its idle timeout.
"""

from __future__ import annotations

import http.client
import resource
import selectors
import socket
import threading
import time
from pathlib import Path

import cdk8s
import pytest
from drivers.harness import DRIVERS, Sandbox, connect, wait_for

from eks_dra.charts.driver_chart import DriverChart, DriverSettings
from eks_dra.drivers.framework.http_server import IDLE_TIMEOUT_S, BoundedHttpServer, Response

GPU = DRIVERS["gpu"]
DRIVER_NOFILE = 1024  # the usual soft default of a container's open-files limit
IDLE_PER_PORT = 2000
QUEUED_PER_PORT = 2400
PROBE_TIMEOUT_S = 1.0
# Measured: under 1 MiB here; prometheus_client's server (a thread per connection) grew by 11-17 MiB before
# the open-files limit stopped it.
RSS_GROWTH_BOUND = 4 * 2**20
CONNECT_WINDOW_S = 5.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def limit_open_files() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (DRIVER_NOFILE, hard))


def chart_liveness_probe() -> dict:
    chart = DriverChart(cdk8s.App(), "gpu", settings=DriverSettings(family="gpu", driver_name=GPU))
    ds = next(o for o in chart.to_json() if o["kind"] == "DaemonSet")
    return ds["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]


def kubelet_probe(port: int, path: str) -> tuple[int, float]:
    """(status, seconds) of one HTTP probe as the kubelet's prober makes it: a fresh connection, no keep-alive
    (k8s.io/kubernetes pkg/probe/http/http.go); status 0 when it did not answer within PROBE_TIMEOUT_S."""
    t0 = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT_S)
    try:
        conn.request("GET", path, headers={"User-Agent": "kube-probe/1.34", "Accept": "*/*", "Connection": "close"})
        resp = conn.getresponse()
        resp.read(10 * 1024)  # the prober reads at most 10 KiB of the body
        status = resp.status
    except OSError:
        status = 0
    finally:
        conn.close()
    return status, time.monotonic() - t0


def proc_status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def open_connections(port: int, count: int, payload: bytes) -> list[socket.socket]:
    """`count` connections to 127.0.0.1:port, each sent `payload` once connected (within CONNECT_WINDOW_S;
    the rest stay as they are: SYNs still queued)."""
    socks, sel = [], selectors.DefaultSelector()
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
        sel.register(s, selectors.EVENT_WRITE)
    deadline = time.monotonic() + CONNECT_WINDOW_S
    pending = count
    while pending and time.monotonic() < deadline:
        for key, _ in sel.select(0.2):
            sel.unregister(key.fileobj)
            pending -= 1
            if payload:
                try:
                    key.fileobj.send(payload)
                except OSError:
                    pass  # closed by the server already: that is its right
    sel.close()
    return socks


def closed_by_peer(s: socket.socket) -> bool:
    """Whether the driver has closed `s` (reading and dropping any answer it sent first)."""
    for _ in range(64):  # a queued request's answer, at most a scrape's size, comes before the close
        try:
            if s.recv(65536) == b"":
                return True
        except BlockingIOError:
            return False
        except OSError:
            return True  # reset
    return False


@pytest.fixture
def hostile_env():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 4 * (IDLE_PER_PORT + QUEUED_PER_PORT)
    if hard < need:
        pytest.skip(f"this test opens {need} sockets; the hard open-files limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    box = Sandbox()
    node = box.node(directory="a")
    opened: list[socket.socket] = []
    yield box, node, opened
    for s in opened:
        s.close()
    box.close()
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_probes_pass_within_1s_under_idle_and_queued_connections(hostile_env):
    box, node, opened = hostile_env
    probe = chart_liveness_probe()
    assert "httpGet" in probe, f"the shipped liveness probe is {sorted(probe)}; this test probes as the kubelet does"
    path = probe["httpGet"]["path"]
    health_port, metrics_port = free_port(), free_port()
    proc = box.spawn(node, "gpu", "--health-port", str(health_port), "--health-address", "127.0.0.1",
                     "--metrics-port", str(metrics_port), preexec_fn=limit_open_files).proc
    connect(node).close()
    wait_for(lambda: kubelet_probe(health_port, path)[0] == 200, timeout=20, what="liveness passes")
    wait_for(lambda: kubelet_probe(metrics_port, "/metrics")[0] == 200, timeout=10, what="metrics answer")
    assert proc_status(proc.pid, "Threads") and Path(f"/proc/{proc.pid}/limits").read_text().count(
        f"Max open files            {DRIVER_NOFILE}")
    rss_before, threads_before = proc_status(proc.pid, "VmRSS") * 1024, proc_status(proc.pid, "Threads")

    slowloris = b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nX-Slow: "
    for port, query in ((health_port, path), (metrics_port, "/metrics")):
        idle = open_connections(port, IDLE_PER_PORT // 2, b"") + open_connections(port, IDLE_PER_PORT // 2, slowloris)
        opened += idle
        opened += open_connections(port, QUEUED_PER_PORT, f"GET {query} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert len(opened) == 2 * (IDLE_PER_PORT + QUEUED_PER_PORT)

    probes = []
    for _ in range(3):
        probes.append(kubelet_probe(health_port, path))
        time.sleep(0.5)
    scrape = kubelet_probe(metrics_port, "/metrics")
    rss_during, threads_during = proc_status(proc.pid, "VmRSS") * 1024, proc_status(proc.pid, "Threads")
    assert proc.poll() is None, "the driver died under the connections"
    assert all(status == 200 and took < PROBE_TIMEOUT_S for status, took in probes), probes
    assert scrape[0] == 200 and scrape[1] < PROBE_TIMEOUT_S, scrape
    assert rss_during - rss_before < RSS_GROWTH_BOUND, (rss_before, rss_during)
    # no thread per connection (the metrics pool may start its second worker)
    assert threads_during <= threads_before + 1, (threads_before, threads_during)

    # the idle and slowloris connections are the driver's to close, within its idle timeout
    deadline = time.monotonic() + IDLE_TIMEOUT_S + 3
    while time.monotonic() < deadline and not all(closed_by_peer(s) for s in opened):
        time.sleep(0.25)
    assert all(closed_by_peer(s) for s in opened), sum(not closed_by_peer(s) for s in opened)
    assert kubelet_probe(health_port, path)[0] == 200


def test_a_new_connection_beyond_the_cap_closes_the_longest_idle():
    answered = threading.Event()

    def hello(_request):
        answered.set()
        return Response(200, b"hi\n")

    server = BoundedHttpServer("test", "127.0.0.1", 0, {"/": hello}, max_connections=4, idle_timeout_s=30).start()
    try:
        idle = []
        for count in range(1, 5):  # one at a time: their age order is the order of acceptance
            idle.append(socket.create_connection(("127.0.0.1", server.port)))
            wait_for(lambda n=count: server.open_connections == n, timeout=5, what="accepted")
        with socket.create_connection(("127.0.0.1", server.port), timeout=2) as newcomer:
            newcomer.sendall(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
            assert newcomer.recv(1024).startswith(b"HTTP/1.1 200 OK")
        assert answered.is_set()
        idle[0].settimeout(2)
        assert idle[0].recv(1) == b""  # the oldest idle one was closed for it
        # the newcomer, answered and closed by its client, is gone too; the three younger idle ones stay
        wait_for(lambda: server.open_connections == 3, timeout=5, what="three connections left")
        for s in idle:
            s.close()
    finally:
        server.stop()


def test_a_request_head_over_the_limit_is_refused_and_closed():
    server = BoundedHttpServer("test", "127.0.0.1", 0, {"/": lambda r: Response(200, b"")},
                               max_request_bytes=1024).start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=2) as s:
            s.sendall(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 5000)
            reply = s.recv(1024)
            assert reply.startswith(b"HTTP/1.1 431 "), reply
            assert s.recv(1024) == b""
    finally:
        server.stop()
