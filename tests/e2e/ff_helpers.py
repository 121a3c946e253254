"""Field-failure scenarios (the known failure modes of DRA drivers) against the real control plane: simulated nodes, driver processes,
slice watches, metrics and Events.

A `SimNode` is one simulated accelerator node: a kubelet stand-in (the kubelet's plugin manager), a fixture
host tree written by `eks_dra.drivers.fixture`, a CDI directory, and `eks-dra-driver` processes that run as
the ServiceAccount `eks-dra-ff/eks-dra-driver` (token bound to a pod on that node) with the RBAC a chart
would grant. Counts are scaled down for the test tier; `EKS_DRA_FF_FULL=1` runs the issue's full counts
(bench/field_failures.py sets it and prints the figures).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from controlplane import PREPARED_ANNOTATION, wait_until
from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from eks_dra.drivers import fixture
from eks_dra.drivers.framework.kube import json_lines

FULL = os.environ.get("EKS_DRA_FF_FULL") == "1"
DRIVERS = {"gpu": "gpu.nvidia.com", "efa": "dra.net", "neuron": "neuron.aws.com"}
RBAC_NAMESPACE = "eks-dra-ff"
SERVICE_ACCOUNT = "eks-dra-driver"
FIGURES_FILE = os.environ.get("EKS_DRA_FF_FIGURES")  # bench/field_failures.py collects figures through it


def scaled(test_tier: int, full: int) -> int:
    """The scaled-down count of the test tier, or the issue's full count under EKS_DRA_FF_FULL=1."""
    return full if FULL else test_tier


def record_figure(scenario: str, **values) -> None:
    """Print a measured figure (visible with -s) and append it to EKS_DRA_FF_FIGURES when set."""
    line = {"scenario": scenario, "full": FULL, **values}
    print(f"FIGURE {json.dumps(line, sort_keys=True)}")
    if FIGURES_FILE:
        with open(FIGURES_FILE, "a") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def raw(call, *args, **kwargs) -> dict:
    """A kubernetes-client call's raw JSON (no model round-trip)."""
    return json.loads(call(*args, _preload_content=False, **kwargs).data)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ignore_conflict(call, *args, **kwargs) -> None:
    try:
        call(*args, **kwargs)
    except ApiException as exc:
        if exc.status != 409:
            raise


# ----- cluster-side set-up -------------------------------------------------------------------------

def ensure_driver_rbac(api: client.ApiClient) -> None:
    """What the drivers chart grants the driver's ServiceAccount (the minimum the drivers need)."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    ignore_conflict(core.create_namespace, {"metadata": {"name": RBAC_NAMESPACE}})
    ignore_conflict(core.create_namespaced_service_account, RBAC_NAMESPACE, {"metadata": {"name": SERVICE_ACCOUNT}})
    ignore_conflict(rbac.create_cluster_role, {
        "metadata": {"name": "eks-dra-ff-driver"},
        "rules": [
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["*"]},
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        ],
    })
    ignore_conflict(rbac.create_cluster_role_binding, {
        "metadata": {"name": "eks-dra-ff-driver"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "eks-dra-ff-driver"},
        "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": RBAC_NAMESPACE}],
    })


def ensure_device_class(api: client.ApiClient, driver: str, mig: bool | None = None) -> str:
    """A DeviceClass selecting one driver's devices (optionally only MIG / only full GPUs)."""
    expr = f"device.driver == '{driver}'"
    name = f"ff-{driver}"
    if mig is not None:
        expr += f" && device.attributes['{driver}'].type == '{'mig' if mig else 'gpu'}'"
        name = f"ff-{'mig' if mig else 'full'}-{driver}"
    ignore_conflict(client.ResourceV1Api(api).create_device_class, {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expr}}]}})
    return name


def make_namespace(api: client.ApiClient, prefix: str) -> str:
    core = client.CoreV1Api(api)
    name = unique(prefix)
    core.create_namespace({"metadata": {"name": name}})
    wait_until(lambda: core.read_namespaced_service_account("default", name), 60, what=f"default SA in {name}")
    return name


def claim_template(api: client.ApiClient, ns: str, name: str, device_class: str, count: int = 1,
                   opaque: tuple[str, dict] | None = None) -> str:
    """A ResourceClaimTemplate of one request `dev`; `opaque` = (driver, parameters) adds an opaque config."""
    devices: dict = {"requests": [{"name": "dev", "exactly": {"deviceClassName": device_class, "count": count}}]}
    if opaque:
        devices["config"] = [{"requests": ["dev"], "opaque": {"driver": opaque[0], "parameters": opaque[1]}}]
    client.ResourceV1Api(api).create_namespaced_resource_claim_template(ns, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
        "spec": {"spec": {"devices": devices}}})
    return name


def create_pod(api: client.ApiClient, ns: str, name: str, node: str, template: str) -> None:
    client.CoreV1Api(api).create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                 "containers": [{"name": "ctr", "image": "registry.k8s.io/pause:3.10",
                                 "resources": {"claims": [{"name": "dev"}]}}],
                 "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": template}],
                 "terminationGracePeriodSeconds": 1}})


def pod_state(api: client.ApiClient, ns: str, name: str) -> dict | None:
    try:
        return raw(client.CoreV1Api(api).read_namespaced_pod, name, ns)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def prepared(pod: dict | None) -> dict:
    """The stand-in's per-claim prepare results of a pod ({claimUID: {driver, devices, error}})."""
    text = ((pod or {}).get("metadata", {}).get("annotations") or {}).get(PREPARED_ANNOTATION)
    return json.loads(text) if text else {}


def wait_running(api: client.ApiClient, ns: str, name: str, timeout: float = 60) -> dict:
    def running():
        pod = pod_state(api, ns, name)
        return pod if pod and pod.get("status", {}).get("phase") == "Running" else None

    return wait_until(running, timeout, what=f"pod {ns}/{name} Running")


def delete_pod(api: client.ApiClient, ns: str, name: str) -> None:
    try:
        client.CoreV1Api(api).delete_namespaced_pod(name, ns)
    except ApiException as exc:
        if exc.status != 404:
            raise


class PodChurn:
    """Load for a scenario: a pod on `node` every `interval_s`, each deleted after `lifetime_s`.

    With `lifetime_s == interval_s` the previous pod is deleted just before the next is created (one pod at a
    time). Use as a context manager: leaving it stops the churn and deletes the pods still alive.
    """

    def __init__(self, api: client.ApiClient, ns: str, node: str, template: str, *, prefix: str,
                 interval_s: float, lifetime_s: float, join_s: float = 15) -> None:
        self.api, self.ns, self.node, self.template = api, ns, node, template
        self.prefix, self.interval_s, self.lifetime_s, self.join_s = prefix, interval_s, lifetime_s, join_s
        self.created: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PodChurn:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(self.join_s)

    def _run(self) -> None:
        live: list[tuple[float, str]] = []
        next_at = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            while live and now - live[0][0] >= self.lifetime_s:
                delete_pod(self.api, self.ns, live.pop(0)[1])
            if now >= next_at:
                name = f"{self.prefix}-{len(self.created)}"
                create_pod(self.api, self.ns, name, self.node, self.template)
                self.created.append(name)
                live.append((now, name))
                next_at += self.interval_s
            self._stop.wait(min(0.1, max(0.0, next_at - time.monotonic())))
        for _, name in live:
            delete_pod(self.api, self.ns, name)


def node_events(api: client.ApiClient, node: str, reason: str | None = None) -> list[dict]:
    selector = f"involvedObject.kind=Node,involvedObject.name={node}"
    if reason:
        selector += f",reason={reason}"
    return raw(client.CoreV1Api(api).list_namespaced_event, "default", field_selector=selector).get("items") or []


def slices(api: client.ApiClient, node: str, driver: str) -> list[dict]:
    return raw(client.ResourceV1Api(api).list_resource_slice,
               field_selector=f"spec.nodeName={node},spec.driver={driver}").get("items") or []


def device_names(api: client.ApiClient, node: str, driver: str) -> list[str]:
    return sorted(d["name"] for s in slices(api, node, driver) for d in s["spec"].get("devices") or [])


def pool_complete(items: list[dict]) -> bool:
    """All slices of the newest generation are present (what the scheduler needs to use a pool)."""
    if not items:
        return False
    generation = max(s["spec"]["pool"]["generation"] for s in items)
    current = [s for s in items if s["spec"]["pool"]["generation"] == generation]
    return len(current) == current[0]["spec"]["pool"]["resourceSliceCount"]


# ----- watching slices -----------------------------------------------------------------------------

@dataclass
class SliceEvent:
    at: float  # time.monotonic()
    type: str  # ADDED / MODIFIED / DELETED
    name: str
    resource_version: str
    devices: int
    driver: str


class SliceWatch:
    """Records every watch event of one node's ResourceSlices (all drivers) from a list's resourceVersion
    on, resuming from the last version when a watch ends: nothing published is missed."""

    def __init__(self, api: client.ApiClient, node: str) -> None:
        self.resource = client.ResourceV1Api(api)
        self.node = node
        self.events: list[SliceEvent] = []
        self.gaps = 0  # relists after a 410 (a window in which events may have been missed)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"slice-watch-{node}", daemon=True)
        self._started = threading.Event()

    def start(self) -> SliceWatch:
        self._thread.start()
        if not self._started.wait(30):
            raise TimeoutError(f"slice watch of {self.node} did not start")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def snapshot(self) -> list[SliceEvent]:
        with self._lock:
            return list(self.events)

    def _run(self) -> None:
        selector = f"spec.nodeName={self.node}"
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    listed = raw(self.resource.list_resource_slice, field_selector=selector)
                    rv = listed["metadata"]["resourceVersion"]
                    self._started.set()
                resp = self.resource.list_resource_slice(
                    field_selector=selector, watch=True, resource_version=rv, allow_watch_bookmarks=True,
                    timeout_seconds=2, _preload_content=False, _request_timeout=(3, 10))
                for event in json_lines(resp):
                    rv = self._handle(event, rv)
                resp.release_conn()
            except Exception:  # noqa: BLE001 - the API restarting in a test: resume from rv
                if self._stop.wait(0.2):
                    return

    def _handle(self, event: dict, rv: str) -> str:
        obj = event.get("object") or {}
        kind = event.get("type")
        if kind == "ERROR":
            if obj.get("code") == 410:
                self.gaps += 1
                return ""
            return rv
        new_rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
        if kind == "BOOKMARK":
            return new_rv
        spec = obj.get("spec") or {}
        with self._lock:
            self.events.append(SliceEvent(time.monotonic(), kind, obj["metadata"]["name"], new_rv,
                                          len(spec.get("devices") or []), spec.get("driver", "")))
        return new_rv


# The driver as release N-1 of the checkpoint format: it reads and writes version 1 only (no boot id, no
# device settings), as the previous release did; everything else is the current code.
PREVIOUS_CHECKPOINT_VERSION_DRIVER = """
import sys
import eks_dra.drivers.framework.checkpoint as checkpoint
checkpoint.encode.__defaults__ = (1,)
checkpoint.decode.__defaults__ = (1,)
checkpoint.CheckpointStore.__init__.__defaults__ = (1, True)
checkpoint.CheckpointStore.save.__defaults__ = (1, True)
from eks_dra.drivers.main import main
sys.exit(main(sys.argv[1:]))
"""


# ----- simulated nodes and driver processes --------------------------------------------------------

class DriverProc:
    """One `eks-dra-driver` process (the real entry point) with a metrics port and a log file."""

    def __init__(self, node: SimNode, family: str, pod_uid: str | None, extra: list[str],
                 env: dict[str, str] | None = None, previous_version: bool = False) -> None:
        self.node, self.family, self.pod_uid = node, family, pod_uid
        self.driver = DRIVERS[family]
        self.metrics_port = free_port()
        suffix = f"-{pod_uid[:8]}" if pod_uid else ""
        self.log_path = node.root / f"driver-{family}{suffix}.log"
        entry = ["-c", PREVIOUS_CHECKPOINT_VERSION_DRIVER] if previous_version else ["-m", "eks_dra.drivers.main"]
        argv = [sys.executable, *entry, family,
                "--node-name", node.name, "--kubeconfig", str(node.kubeconfig),
                "--host-root", str(node.host), "--plugins-dir", str(node.kubelet.plugins_dir),
                "--registry-dir", str(node.kubelet.registry_dir), "--cdi-root", str(node.cdi),
                "--health-port", "-1", "--metrics-port", str(self.metrics_port), *extra]
        if pod_uid:
            argv += ["--pod-uid", pod_uid]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, **(env or {})})
        self.started_at = time.monotonic()

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the driver's own /metrics (0 when absent)."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        want = {"driver": self.driver, **labels}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in want.items()):
                    return s.value
        return 0.0

    def wait_metrics(self, timeout: float = 30) -> None:
        """Wait until /metrics answers (the driver has finished starting)."""
        def answers():
            if not self.running:
                raise AssertionError(f"driver exited ({self.proc.returncode}); log:\n{self.log_tail()}")
            self.metric("eks_dra_prepared_claims")
            return True

        wait_until(answers, timeout, what=f"metrics of {self.driver} on {self.node.name}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def terminate(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError(f"no VmRSS for pid {self.proc.pid}")


@dataclass
class SimNode:
    """One simulated accelerator node (see the module docstring)."""

    name: str
    kubelet: object  # controlplane.KubeletStandIn
    kubeconfig: Path
    host: Path
    drivers: list[DriverProc] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return self.kubelet.root

    @property
    def cdi(self) -> Path:
        return self.kubelet.root / "cdi"

    def start_driver(self, family: str, *extra: str, pod_uid: str | None = None,
                     env: dict[str, str] | None = None, previous_version: bool = False) -> DriverProc:
        proc = DriverProc(self, family, pod_uid, list(extra), env, previous_version)
        self.drivers.append(proc)
        return proc

    def state_dir(self, family: str) -> Path:
        return self.kubelet.plugins_dir / DRIVERS[family]

    def cdi_specs(self, family: str) -> dict[str, dict]:
        """{claim uid: spec} of one driver's CDI specs."""
        prefix = f"k8s.{DRIVERS[family]}-claim_"
        out = {}
        for path in self.cdi.glob(f"{prefix}*.json"):
            try:
                out[path.name[len(prefix):-5]] = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
        return out

    def stop_drivers(self) -> None:
        for d in self.drivers:
            try:
                d.terminate(15)
            except Exception:  # noqa: BLE001 - a hung driver is killed; cleanup must go on
                d.kill()


class NodeFactory:
    """Makes SimNodes for one test and tears everything down (drivers, then stand-ins via kubelet_factory,
    then the Node objects, whose deletion garbage-collects the drivers' slices)."""

    def __init__(self, api: client.ApiClient, kubelet_factory, sa_kubeconfig_factory) -> None:
        self.api = api
        self.kubelet_factory = kubelet_factory
        self.sa_kubeconfig_factory = sa_kubeconfig_factory
        self.nodes: list[SimNode] = []
        self.watches: list[SliceWatch] = []

    def watch(self, node: SimNode) -> SliceWatch:
        """A started SliceWatch of the node, stopped at teardown even when the test fails."""
        w = SliceWatch(self.api, node.name).start()
        self.watches.append(w)
        return w

    def node(self, prefix: str, instance_type: str, *, mig_profile: str | None = None,
             without_driver: bool = False, taints: list[str] = (), name: str | None = None) -> SimNode:
        name = name or unique(prefix)
        if taints:  # as the node group's launch template would register it: tainted until the driver is ready
            client.CoreV1Api(self.api).create_node({"metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name}}, "spec": {"taints": [
                    {"key": f"{DRIVERS[f]}/not-ready", "value": "true", "effect": "NoSchedule"} for f in taints]}})
        kubelet = self.kubelet_factory(name)
        host = fixture.write_fixture(instance_type, kubelet.root / "host", name, mig_profile,
                                     without_driver=without_driver)
        kubeconfig = self.sa_kubeconfig_factory(RBAC_NAMESPACE, SERVICE_ACCOUNT, name)
        node = SimNode(name, kubelet, kubeconfig, host)
        self.nodes.append(node)
        return node

    def close(self) -> None:
        for w in self.watches:
            w.stop()
        for n in self.nodes:
            n.stop_drivers()
        core = client.CoreV1Api(self.api)
        for n in self.nodes:
            try:
                core.delete_node(n.name)
            except ApiException:
                pass


def wait_registered(node: SimNode, driver: DriverProc, count: int = 1, timeout: float = 60) -> None:
    try:
        node.kubelet.wait_registered(driver.driver, count=count, timeout=timeout)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}\ndriver log {driver.log_path}:\n{driver.log_tail()}") from None


def wait_devices(api: client.ApiClient, node: SimNode, driver: DriverProc, count: int, timeout: float = 60) -> float:
    """Wait until the node's pool of `driver` is complete with `count` devices; return the seconds waited."""
    t0 = time.monotonic()

    def ready():
        items = slices(api, node.name, driver.driver)
        return pool_complete(items) and sum(len(s["spec"].get("devices") or []) for s in items) == count

    try:
        wait_until(ready, timeout, interval=0.05, what=f"{count} devices of {driver.driver} on {node.name}")
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}\ndriver log {driver.log_path}:\n{driver.log_tail()}") from None
    return time.monotonic() - t0


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    s = sorted(values)
    return {"n": len(s), "min": round(s[0], 3), "p50": round(s[len(s) // 2], 3), "max": round(s[-1], 3)}
