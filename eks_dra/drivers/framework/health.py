"""Liveness: HTTP GET `/livez` on TCP (`--health-port`), answered from a check of the plugin end to end.

The check dials the plugin's own Unix sockets as the kubelet would: `GetInfo` on the registration socket
(it must name this driver) and an empty `NodePrepareResources` on the DRA socket (it must succeed with no
entries). Anything else answers 503, so a wedged gRPC server or a deleted socket restarts the pod. The DRA
resource-health stream (v1alpha1) lives in plugin.py.

Why HTTP and not the `grpc.health.v1` probe the upstream example driver uses: the port is reachable from
the pod network, and the kubelet's probe must keep being answered while anyone there holds thousands of
connections open. gRPC's C core can refuse connections beyond a limit, but a refused connection is the
next probe; it cannot close the longest-idle one instead, and it keeps half-open handshakes for
`grpc.server_handshake_timeout_ms`. The bounded HTTP server (http_server.py) can, and the kubelet's HTTP
prober needs nothing more: a fresh connection per probe, keep-alives off, 200-399 is success
(k8s.io/kubernetes pkg/probe/http/http.go).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http import HTTPStatus

import grpc

from .http_server import BoundedHttpServer, Request, Response
from .proto import dra_v1_pb2, dra_v1_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc

log = logging.getLogger(__name__)
LIVENESS_PATH = "/livez"
CHECK_TIMEOUT_S = 2.0  # per socket; a check takes at most twice this
REFRESH_INTERVAL_S = 2.0
# A verdict is replaced at most a pause and one slowest check after the last; past that and a margin, the
# refresher is stuck.
STALE_AFTER_S = REFRESH_INTERVAL_S + 2 * CHECK_TIMEOUT_S + 2.0


def check_plugin(driver: str, reg_path: str, dra_path: str, timeout_s: float = CHECK_TIMEOUT_S) -> str:
    """'' when both sockets answer correctly, else why not."""
    try:
        with grpc.insecure_channel(f"unix://{reg_path}") as ch:
            info = pluginregistration_pb2_grpc.RegistrationStub(ch).GetInfo(
                pluginregistration_pb2.InfoRequest(), timeout=timeout_s)
        if info.name != driver:
            return f"registration socket answers for {info.name!r}, not {driver!r}"
        with grpc.insecure_channel(f"unix://{dra_path}") as ch:
            resp = dra_v1_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(), timeout=timeout_s)
        if len(resp.claims):
            return "an empty NodePrepareResources returned claims"
    except grpc.RpcError as exc:
        return f"{exc.code().name}: {exc.details()}"
    return ""


class LivenessCache:
    """The liveness verdict, computed by a background refresher every `interval_s`; a request only reads it.

    The check dials the plugin's sockets and can take up to twice `CHECK_TIMEOUT_S`, so it must never run per
    request: a queue of probes (or of anyone's requests) would each wait for it. A verdict older than
    `stale_after_s` counts as unhealthy: the refresher itself is stuck, and nothing vouches for the plugin.
    """

    def __init__(self, check: Callable[[], str], interval_s: float = REFRESH_INTERVAL_S,
                 stale_after_s: float = STALE_AFTER_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.check, self.interval_s, self.stale_after_s, self.clock = check, interval_s, stale_after_s, clock
        self._verdict: tuple[str, float] | None = None  # (problem or "", when checked); replaced whole
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._refresh_loop, name="liveness-refresh", daemon=True)

    def start(self) -> LivenessCache:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def refresh(self) -> None:
        try:
            problem = self.check()
        except Exception as exc:  # noqa: BLE001 - an unexpected failure is a failed check, not a dead refresher
            problem = f"{type(exc).__name__}: {exc}"
        previous = self._verdict
        if problem and (previous is None or previous[0] != problem):
            log.warning("liveness check failed", extra={"error": problem})
        elif not problem and previous is not None and previous[0]:
            log.info("liveness check passes again")
        self._verdict = (problem, self.clock())

    def _refresh_loop(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.interval_s)

    def verdict(self) -> tuple[bool, str]:
        """(alive, why) from the cached check and its age; never waits for a check."""
        cached = self._verdict
        if cached is None:
            return False, "not checked yet"
        problem, checked_at = cached
        age = self.clock() - checked_at
        if age > self.stale_after_s:
            return False, f"last check {age:.1f} s ago, older than {self.stale_after_s:g} s: the checker is stuck"
        if problem:
            return False, f"{problem} (checked {age:.1f} s ago)"
        return True, f"ok (checked {age:.1f} s ago)"


class LivenessServer:
    """GET `LIVENESS_PATH` on the health port: 200 alive, 503 not, from the cached verdict."""

    def __init__(self, cache: LivenessCache, address: str, port: int) -> None:
        self.cache = cache
        self.http = BoundedHttpServer("liveness", address, port, {LIVENESS_PATH: self._answer}, workers=1)
        self.port = self.http.port

    def _answer(self, request: Request) -> Response:
        alive, why = self.cache.verdict()
        return Response(int(HTTPStatus.OK if alive else HTTPStatus.SERVICE_UNAVAILABLE), (why + "\n").encode())

    def start(self) -> LivenessServer:
        self.cache.start()
        self.http.start()
        return self

    def stop(self) -> None:
        self.cache.stop()
        self.http.stop()


def serve_liveness(driver: str, reg_path: str, dra_path: str, port: int, address: str = "0.0.0.0") -> LivenessServer:
    """Start the refresher and the liveness endpoint; `.port` is the bound port."""
    return LivenessServer(LivenessCache(lambda: check_plugin(driver, reg_path, dra_path)), address, port).start()
