"""A simulated eks-dra `dev` cluster on the real control plane: manifests, Nodes, kubelet stand-ins, drivers.

Used by tests/e2e/test_dev_environment.py and bench/e2e.py. Everything goes through the real API server
with the official Kubernetes client; the drivers are our `eks-dra-driver` processes, each authenticated as
its chart's ServiceAccount with a token bound to its node, so RBAC and the ValidatingAdmissionPolicies of
the charts decide what they may write.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from controlplane import PREPARED_ANNOTATION, ControlPlane, KubeletStandIn, sa_kubeconfig, wait_until
from kubernetes import client, config, dynamic
from kubernetes.client.rest import ApiException

from eks_dra.devices import DEFAULT_DRIVER_NAMES

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SAMPLES_NAMESPACE = "dra-samples"
SYSTEM_NAMESPACE = "eks-dra-system"
FIELD_MANAGER = "eks-dra-e2e"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"

# The simulated nodes of the dev tier: node name -> node group of config/dev.yaml.
DEV_NODES = {
    "dev-p5-0": "p5-dra",
    "dev-p5-1": "p5-dra",
    "dev-trn2-0": "trn2-dra",
    "dev-g6e-0": "g6e-bottlerocket",
}


def as_dict(call, *args, **kwargs) -> dict:
    """Call a kubernetes-client method and return the raw JSON (no model round-trip)."""
    resp = call(*args, _preload_content=False, **kwargs)
    return json.loads(resp.data)


def load_documents(paths: Iterable[Path]) -> list[dict]:
    docs = []
    for path in paths:
        docs.extend(d for d in yaml.safe_load_all(Path(path).read_text()) if d)
    return docs


def apply_objects(api: client.ApiClient, objects: list[dict]) -> list[dict]:
    """Server-side apply every object in order (the API server validates each, CEL included); returns the
    objects as stored. Raises the first ApiException with the object named."""
    dyn = dynamic.DynamicClient(api)
    core = client.CoreV1Api(api)
    applied = []
    for obj in objects:
        kind, meta = obj["kind"], obj["metadata"]
        resource = dyn.resources.get(api_version=obj["apiVersion"], kind=kind)
        try:
            stored = resource.server_side_apply(body=obj, name=meta["name"], namespace=meta.get("namespace"),
                                                field_manager=FIELD_MANAGER, force_conflicts=True)
        except ApiException as exc:
            raise AssertionError(f"{kind} {meta.get('namespace', '')}/{meta['name']} rejected: "
                                 f"{exc.status} {exc.body}") from exc
        applied.append(stored.to_dict())
        if kind == "Namespace":
            # Pods are admitted only once the serviceaccount controller made the namespace's "default" SA.
            wait_until(lambda n=meta["name"]: core.read_namespaced_service_account("default", n), 60,
                       what=f"default ServiceAccount in {meta['name']}")
    return applied


def namespace_object(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def delete_objects(api: client.ApiClient, objects: list[dict]) -> None:
    """Delete the objects in reverse apply order; one already gone is fine."""
    dyn = dynamic.DynamicClient(api)
    for obj in reversed(objects):
        meta = obj["metadata"]
        try:
            dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"]).delete(
                name=meta["name"], namespace=meta.get("namespace"))
        except ApiException as exc:
            if exc.status != 404:
                raise


def write_dev_manifests(out_dir: Path, env=None) -> list[Path]:
    """The dev environment's synthesized manifests (what `make synth ENV=dev` writes to dist/dev), or those of
    `env` (an EnvironmentConfig)."""
    from eks_dra.config import load_environment
    from eks_dra.stacks.manifests import write_manifests

    return write_manifests(env or load_environment("dev", REPO / "config"), out_dir)


# The driver settings a chart passes as plain environment variables that the driver process reads.
CHART_DRIVER_SETTINGS = ("DEVICE_TAINTS", "DRA_HEALTH")


# --- processes -----------------------------------------------------------------------------------

class DriverProcess:
    """One `eks-dra-driver <family>` of a simulated node, logging to a file in the node's directory."""

    def __init__(self, node: SimulatedNode, family: str, kubeconfig: Path) -> None:
        self.node, self.family, self.kubeconfig = node, family, kubeconfig
        self.driver_name = DEFAULT_DRIVER_NAMES.for_family(family)
        self.state_dir = node.root / "state" / family
        self.log_path = node.root / f"driver-{family}.log"
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.env: dict[str, str] = {}  # CHART_DRIVER_SETTINGS of the applied DaemonSet

    def argv(self) -> list[str]:
        n = self.node
        return [str(BIN / "eks-dra-driver"), self.family,
                "--node-name", n.name, "--kubeconfig", str(self.kubeconfig),
                "--host-root", str(n.host_root),
                "--plugins-dir", str(n.kubelet.plugins_dir), "--registry-dir", str(n.kubelet.registry_dir),
                "--cdi-root", str(n.cdi_root), "--state-dir", str(self.state_dir),
                "--health-port", "-1", "--metrics-port", "-1"]  # fmt: skip

    def start(self) -> None:
        assert not self.running, f"{self.family} driver of {self.node.name} is already running"
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== {time.strftime('%H:%M:%S')} start\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, **self.env})
        self.starts += 1

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int | None:
        """Send `sig` and wait; SIGKILL if it does not exit. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code, self.proc = self.proc.returncode, None
        return code

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def checkpoint_claims(self) -> dict:
        path = self.state_dir / "checkpoint.json"
        if not path.exists():
            return {}
        return json.loads(path.read_text())["data"]["claims"]


@dataclass
class SimulatedNode:
    name: str
    group: str
    instance_type: str
    families: tuple[str, ...]
    labels: dict[str, str]
    taints: list[dict]
    root: Path
    kubelet: KubeletStandIn
    drivers: dict[str, DriverProcess] = field(default_factory=dict)

    @property
    def host_root(self) -> Path:
        return self.root / "host"

    @property
    def cdi_root(self) -> Path:
        return self.root / "cdi"

    def cdi_specs(self) -> dict[str, dict]:
        """CDI spec files of this node: file name -> parsed spec."""
        if not self.cdi_root.is_dir():
            return {}
        return {p.name: json.loads(p.read_text()) for p in sorted(self.cdi_root.glob("*.json"))}


class DevCluster:
    """The simulated nodes of the dev environment on a running control plane, with our drivers on them."""

    def __init__(self, control_plane: ControlPlane, binary: Path, workdir: Path,
                 nodes: dict[str, str] | None = None, kubernetes_version: str | None = None) -> None:
        import dataclasses

        from eks_dra.config import load_environment

        self.cp, self.binary, self.workdir = control_plane, binary, Path(workdir)
        self.env = load_environment("dev", REPO / "config")
        if kubernetes_version:  # the dev node groups on another version (what its manifests turn on)
            self.env = dataclasses.replace(self.env, kubernetes_version=kubernetes_version)
        self.api = config.new_client_from_config(str(control_plane.kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.resource = client.ResourceV1Api(self.api)
        self.node_groups = dict(nodes or DEV_NODES)
        self.nodes: dict[str, SimulatedNode] = {}
        self.manifest_paths: list[Path] = []
        self.applied: list[dict] = []

    # --- set-up -------------------------------------------------------------------------

    def apply_manifests(self, select: Callable[[Path], bool] = lambda path: True) -> list[dict]:
        """Synthesize the dev manifests (once) and apply those files that `select` accepts, in file order."""
        if not self.manifest_paths:
            self.manifest_paths = write_dev_manifests(self.workdir / "dist-dev", self.env)
        applied = apply_objects(self.api, load_documents(p for p in self.manifest_paths if select(p)))
        self.applied.extend(applied)
        return applied

    def create_nodes(self) -> None:
        """Node objects as the CDK node groups register them: group labels, accelerator and readiness taints."""
        groups = {g.name: g for g in self.env.node_groups}
        for name, group_name in self.node_groups.items():
            group = groups[group_name]
            labels = {**self.env.node_labels(group), "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                      "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": group.instance_type}
            taints = [{"key": t.key, "value": t.value, "effect": t.effect} for t in self.env.node_taints(group)]
            self.core.create_node({"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}})
            root = Path(f"/tmp/e2e-{name}-{os.getpid()}")
            kubelet = KubeletStandIn(self.binary, self.cp.kubeconfig, name, root=root)
            self.nodes[name] = SimulatedNode(name, group_name, group.instance_type, tuple(group.families),
                                             labels, taints, root, kubelet)

    def start_nodes(self) -> None:
        """Per node: fixture host tree, kubelet stand-in, one ServiceAccount kubeconfig and driver per family."""
        for node in self.nodes.values():
            node.root.mkdir(parents=True, exist_ok=True)
            subprocess.run([str(BIN / "eks-dra"), "fixture", "--instance-type", node.instance_type,
                            "--out", str(node.host_root), "--node-name", node.name],
                           check=True, capture_output=True, timeout=120)  # fmt: skip
            node.kubelet.start()
            for family in node.families:
                kubeconfig = self.driver_kubeconfig(node.name, family)
                node.drivers[family] = DriverProcess(node, family, kubeconfig)
                node.drivers[family].env = self.chart_driver_settings(family)
        for node in self.nodes.values():
            for driver in node.drivers.values():
                driver.start()

    def chart_driver_settings(self, family: str) -> dict[str, str]:
        """CHART_DRIVER_SETTINGS as the applied DaemonSet of the family's driver sets them."""
        for obj in self.applied:
            if obj.get("kind") == "DaemonSet" and obj["metadata"]["name"] == f"eks-dra-{family}-driver":
                env = obj["spec"]["template"]["spec"]["containers"][0].get("env") or []
                return {e["name"]: e["value"] for e in env if e["name"] in CHART_DRIVER_SETTINGS and "value" in e}
        return {}

    def driver_kubeconfig(self, node: str, family: str) -> Path:
        """A kubeconfig of the family's chart ServiceAccount, its token bound to a pod on `node`."""
        out = self.nodes[node].root / f"{family}-sa.kubeconfig"
        if not out.exists():
            sa_kubeconfig(self.binary, self.cp.kubeconfig, SYSTEM_NAMESPACE, f"eks-dra-{family}-driver", node, out)
        return out

    def wait_drivers_ready(self, timeout: float = 120) -> None:
        """Every driver registered with its kubelet, published its slices and removed its readiness taint."""
        for node in self.nodes.values():
            for driver in node.drivers.values():
                node.kubelet.wait_registered(driver.driver_name, count=1, timeout=timeout)
        self.wait_slices(timeout)
        self.wait_untainted(timeout)

    def wait_slices(self, timeout: float = 90) -> dict[tuple[str, str], list[dict]]:
        def complete():
            by_pool = self.slices_by_pool()
            for node in self.nodes.values():
                for driver in node.drivers.values():
                    if not driver.running:
                        raise AssertionError(f"{driver.family} driver of {node.name} exited:\n{driver.log_tail()}")
                    pool = by_pool.get((driver.driver_name, node.name))
                    if not pool or len(pool) != pool[0]["spec"]["pool"]["resourceSliceCount"]:
                        return None
            return by_pool

        return wait_until(complete, timeout, interval=0.5, what="ResourceSlices of every simulated node's drivers")

    def wait_untainted(self, timeout: float = 60) -> None:
        def untainted():
            for name in self.nodes:
                taints = as_dict(self.core.read_node, name)["spec"].get("taints") or []
                if any(t["key"].endswith("/not-ready") for t in taints):
                    return False
            return True

        wait_until(untainted, timeout, interval=0.5, what="drivers to remove their readiness taints")

    def stop(self) -> None:
        """Stop every driver and kubelet stand-in (finalizer: never leave processes behind)."""
        for node in self.nodes.values():
            for driver in node.drivers.values():
                driver.stop()
            node.kubelet.stop()

    def remove(self, keep_dirs: bool = False) -> None:
        """After stop(): delete what this cluster put on the shared control plane (applied objects, Nodes and
        their slices), so that later tests of the session see no eks-dra driver's devices; and the node
        directories unless `keep_dirs` (kept for a failed test's logs)."""
        delete_objects(self.api, load_documents(self.manifest_paths))
        for s in self.slices():
            self.resource.delete_resource_slice(s["metadata"]["name"])
        for name in self.nodes:
            self.core.delete_node(name)
        if not keep_dirs:
            self.remove_dirs()

    def remove_dirs(self) -> None:
        for node in self.nodes.values():
            shutil.rmtree(node.root, ignore_errors=True)

    # --- reading state --------------------------------------------------------------------

    def slices(self) -> list[dict]:
        ours = set(self.nodes)
        return [s for s in as_dict(self.resource.list_resource_slice)["items"] if s["spec"].get("nodeName") in ours]

    def slices_by_pool(self) -> dict[tuple[str, str], list[dict]]:
        """(driver, pool) -> slices of the newest generation of that pool."""
        pools: dict[tuple[str, str], list[dict]] = {}
        for s in self.slices():
            pools.setdefault((s["spec"]["driver"], s["spec"]["pool"]["name"]), []).append(s)
        for key, items in pools.items():
            newest = max(s["spec"]["pool"]["generation"] for s in items)
            pools[key] = [s for s in items if s["spec"]["pool"]["generation"] == newest]
        return pools

    def devices(self) -> dict[tuple[str, str, str], dict]:
        """(driver, pool, device) -> published device (newest generation)."""
        return {(drv, pool, d["name"]): d
                for (drv, pool), items in self.slices_by_pool().items() for s in items for d in s["spec"]["devices"]}

    def pods(self, namespace: str = SAMPLES_NAMESPACE) -> list[dict]:
        return as_dict(self.core.list_namespaced_pod, namespace)["items"]

    def claims(self, namespace: str = SAMPLES_NAMESPACE) -> list[dict]:
        return as_dict(self.resource.list_namespaced_resource_claim, namespace)["items"]

    def pod_claims(self, pod: dict) -> list[dict]:
        """The ResourceClaims a pod uses (generated from templates or named)."""
        ns = pod["metadata"]["namespace"]
        names = [s["resourceClaimName"] for s in pod.get("status", {}).get("resourceClaimStatuses") or []
                 if s.get("resourceClaimName")]
        names += [c["resourceClaimName"] for c in pod["spec"].get("resourceClaims") or [] if c.get("resourceClaimName")]
        return [as_dict(self.resource.read_namespaced_resource_claim, n, ns) for n in names]

    def node_of_pool(self, pool: str) -> SimulatedNode:
        return self.nodes[pool]


def device_attribute(device: dict, driver: str, name: str):
    """Value of a (possibly qualified) attribute of a published device, as CEL and matchAttribute see it."""
    attrs = device.get("attributes") or {}
    domain, _, short = name.rpartition("/")
    value = attrs.get(name) or (attrs.get(short) if domain == driver else None)
    if value is None:
        return None
    return next(iter(value.values()))


def constraint_violations(claim: dict, devices: dict[tuple[str, str, str], dict]) -> list[str]:
    """matchAttribute constraints of an allocated claim that its allocated devices do not meet."""
    results = claim["status"]["allocation"]["devices"]["results"]
    problems = []
    for constraint in claim["spec"]["devices"].get("constraints") or []:
        attribute = constraint.get("matchAttribute")
        if not attribute:
            continue
        requests = set(constraint.get("requests") or [])
        values = {}
        for r in results:
            if requests and r["request"].split("/")[0] not in requests:
                continue
            device = devices[(r["driver"], r["pool"], r["device"])]
            values[r["device"]] = device_attribute(device, r["driver"], attribute)
        if None in values.values() or len(set(values.values())) != 1:
            problems.append(f"{claim['metadata']['name']}: {attribute} differs or is missing: {values}")
    return problems


def prepared(pod: dict) -> dict:
    """The kubelet stand-in's record of a pod's prepared claims: claim UID -> result."""
    return json.loads((pod["metadata"].get("annotations") or {}).get(PREPARED_ANNOTATION) or "{}")


def pod_running(pod: dict) -> bool:
    return pod.get("status", {}).get("phase") == "Running"


def unschedulable(pod: dict) -> str | None:
    """The scheduler's message when it has given up on the pod for now (PodScheduled False, Unschedulable)."""
    for c in pod.get("status", {}).get("conditions") or []:
        if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable":
            return c.get("message") or "unschedulable"
    return None
