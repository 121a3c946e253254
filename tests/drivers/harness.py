"""Test set-up for the drivers: fixture host trees, the in-test API, claims, drivers in or out of process."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc

from eks_dra.drivers import families, fixture
from eks_dra.drivers.framework.driver import Driver, DriverConfig
from eks_dra.drivers.framework.kube import KubeApi, api_client
from eks_dra.drivers.gpu.host import GpuHost

from .fake_kube import FakeKube
from .kubelet import Kubelet

REPO = Path(__file__).resolve().parents[2]
DRIVERS = {"gpu": "gpu.nvidia.com", "efa": "dra.net", "neuron": "neuron.aws.com"}


def short_tmp() -> Path:
    """A short directory: Unix socket paths are limited to 107 bytes (pytest's tmp_path is too long)."""
    return Path(tempfile.mkdtemp(prefix="dra", dir="/tmp"))


class Node:
    """One simulated node: a fixture host tree and the kubelet's directories."""

    def __init__(self, base: Path, instance_type: str, name: str, mig_profile: str | None = None,
                 without_driver: bool = False, os_layout: str = "al2023") -> None:
        self.name = name
        self.base = base
        self.host = fixture.write_fixture(instance_type, base / "host", name, mig_profile,
                                          without_driver=without_driver, os_layout=os_layout)
        self.plugins = base / "plugins"
        self.registry = base / "registry"
        self.cdi = base / "cdi"

    def config(self, family: str, **overrides) -> DriverConfig:
        cfg = DriverConfig(family=family, driver_name=DRIVERS[family], node_name=self.name, host_root=self.host,
                           plugins_dir=self.plugins, registry_dir=self.registry, cdi_root=self.cdi,
                           health_interval_s=0.2, rediscover_interval_s=0.5, resync_interval_s=2.0,
                           reconcile_interval_s=1.0, durable=False)
        for k, v in overrides.items():
            setattr(cfg, k, v)
        return cfg

    def args(self, family: str, kubeconfig: Path, *extra: str) -> list[str]:
        return [family, "--node-name", self.name, "--kubeconfig", str(kubeconfig), "--host-root", str(self.host),
                "--plugins-dir", str(self.plugins), "--registry-dir", str(self.registry), "--cdi-root", str(self.cdi),
                "--health-port", "-1", "--metrics-port", "-1", "--health-interval", "0.2",
                "--rediscover-interval", "0.5", "--resync-interval", "2", "--reconcile-interval", "1", *extra]


def sources(family: str, host: Path, node: str):
    monitor = families.health_monitor(family, host)
    gpu_host = GpuHost.for_node(host) if family == "gpu" else None  # one per driver, as main.py makes it

    def inventory():
        return families.discover(family, host, node, host=gpu_host)

    def health(fresh):
        if fresh is not None:
            monitor.refresh(fresh)
        return monitor.poll()

    return inventory, health


def start_driver(kube: FakeKube, node: Node, family: str, **overrides) -> Driver:
    api = KubeApi(api_client(str(kube.write_kubeconfig(node.base / "kubeconfig"))))
    inventory, health = sources(family, node.host, node.name)
    driver = Driver(node.config(family, **overrides), families.get_family(family), api, inventory, health)
    driver.start()
    return driver


class Sandbox:
    """A fake API server, simulated nodes under one short temp dir, and every driver started on them.

    `close()` stops the drivers (in-process and child processes), the API server and removes the files.
    """

    def __init__(self) -> None:
        self.base = short_tmp()
        self.kube = FakeKube()
        self.kubeconfig = self.kube.write_kubeconfig(self.base / "kubeconfig")  # for driver processes
        self._drivers: list[Driver] = []
        self._procs: list[DriverProcess] = []

    def node(self, name: str = "node-a", instance_type: str = "p5.48xlarge", *, taints: list | None = None,
             directory: str | None = None, **kw) -> Node:
        node = Node(self.base / (directory or name), instance_type, name, **kw)
        self.kube.add_node(name, taints=taints)
        return node

    def start(self, node: Node, family: str = "gpu", **overrides) -> Driver:
        driver = start_driver(self.kube, node, family, **overrides)
        self._drivers.append(driver)
        return driver

    def spawn(self, node: Node, family: str, *extra: str, env: dict | None = None,
              preexec_fn: Callable[[], None] | None = None) -> DriverProcess:
        proc = DriverProcess(node, family, self.kubeconfig, *extra, env=env, preexec_fn=preexec_fn)
        self._procs.append(proc)
        return proc

    def close(self, grace_s: float = 0.5) -> None:
        for driver in self._drivers:
            driver.stop(grace_s)
        for proc in self._procs:
            proc.close()
        self.kube.close()
        shutil.rmtree(self.base, ignore_errors=True)


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def make_claim(driver: str, node: str, devices: list[str], *, namespace: str = "default", name: str | None = None,
               requests: list[str] | None = None, configs: list[dict] | None = None, pool: str | None = None,
               uid: str | None = None, admin_access: bool = False, reserved: bool = True) -> dict:
    """An allocated ResourceClaim as the scheduler leaves it (status.allocation, reservedFor)."""
    name = name or f"claim-{uuid.uuid4().hex[:8]}"
    results = [{"request": (requests or ["req"] * len(devices))[i], "driver": driver, "pool": pool or node,
                "device": d, **({"adminAccess": True} if admin_access else {})} for i, d in enumerate(devices)]
    claim = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())},
        "spec": {"devices": {"requests": [{"name": r, "exactly": {"deviceClassName": driver}}
                                          for r in sorted(set(requests or ["req"]))]}},
        "status": {"allocation": {
            "devices": {"results": results, "config": configs or []},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                                      "values": [node]}]}]}}},
    }
    if reserved:
        claim["status"]["reservedFor"] = [{"resource": "pods", "name": "pod-" + name, "uid": str(uuid.uuid4())}]
    return claim


def registration_socket(node: Node, family: str, pod_uid: str | None = None) -> Path:
    name = f"{DRIVERS[family]}-{pod_uid}-reg.sock" if pod_uid else f"{DRIVERS[family]}-reg.sock"
    return node.registry / name


def kubelet_for(node: Node, family: str, pod_uid: str | None = None, timeout: float = 10.0) -> Kubelet:
    sock = registration_socket(node, family, pod_uid)
    wait_for(sock.exists, timeout, what=f"{sock}")
    return Kubelet(sock)


def prepare_claim(kube, node: Node, family: str, devices: list[str], **claim_fields) -> dict:
    """Store a claim of `devices` allocated on `node` and prepare it through the family's plugin; it must succeed."""
    claim = kube.put_claim(make_claim(DRIVERS[family], node.name, devices, **claim_fields))
    k = kubelet_for(node, family)
    try:
        entry = k.prepare([claim])[claim["metadata"]["uid"]]
    finally:
        k.close()
    assert entry.error == "", entry.error
    return claim


def connect(node: Node, family: str = "gpu", pod_uid: str | None = None, timeout: float = 15.0) -> Kubelet:
    """A kubelet client as soon as the plugin answers on its registration socket (retries while it starts)."""
    sock = registration_socket(node, family, pod_uid)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if sock.exists():
                return Kubelet(sock, timeout=10)
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"no plugin on {sock}")
        time.sleep(0.02)


class DriverProcess:
    """`eks-dra-driver` as a child process (the real entry point)."""

    def __init__(self, node: Node, family: str, kubeconfig: Path, *extra: str, env: dict | None = None,
                 preexec_fn: Callable[[], None] | None = None) -> None:
        self.log = open(node.base / f"driver-{family}.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "eks_dra.drivers.main", *node.args(family, kubeconfig, *extra)],
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO,
                                     env={**os.environ, **(env or {})}, preexec_fn=preexec_fn)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 15) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill9()
        self.log.close()
