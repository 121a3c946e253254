"""The real kubelet and containerd run our driver image, the dev manifests and the sample pods.

Three real nodes (p5.48xlarge: GPU + EFA; trn2.48xlarge: Neuron + EFA; p4d.24xlarge: static MIG) join the tier's control plane, each a
real kubelet v1.34 with its own containerd 2.4 + runc, mount namespace, CDI dir and fixture host tree of real
character devices. The dev manifests are applied as `eks-dra synth` writes them (with the locally built
driver image); the drivers run as the DaemonSets' pods; the samples run with the local busybox image and are
checked from inside their containers. The tests follow one cluster's life in file order.
"""

from __future__ import annotations

import copy
import json
import time
import uuid

import pytest
from controlplane import wait_until
from helpers import (
    REPO,
    SAMPLES_NAMESPACE,
    SYSTEM_NAMESPACE,
    apply_objects,
    as_dict,
    delete_objects,
    load_documents,
    namespace_object,
)
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from realnode import HOST_ROOT_PATH, ApiServerRoute, RealNode, ToolsMissing, ensure_tools
from realnode_checks import check_script, expected_for, passed_checks

from eks_dra.charts.driver_chart import CONTAINER_DRIVER_ROOT, HOST_ROOT
from eks_dra.devices.names import DEFAULT_DRIVER_NAMES
from eks_dra.drivers.framework.cdi import spec_file_name

pytestmark = pytest.mark.e2e

# node name -> node group of config/dev.yaml: GPU + EFA, Neuron + EFA, static MIG (1g.5gb) + EFA.
NODES = {"rn-p5-0": "p5-dra", "rn-trn2-0": "trn2-dra", "rn-p4d-0": "p4d-mig"}
SHIPPED_BUSYBOX = "public.ecr.aws/docker/library/busybox:1.37"
# Samples of dev that these nodes cannot hold: the device-plugin pods (no device plugin runs here).
NOT_PLACEABLE = {"device-plugin-gpu", "device-plugin-efa"}
TEST_NAMESPACE = "rn-extra"


class Tally:
    """The figures of the closing line: pods that ran with injected devices, checks passed inside containers."""

    def __init__(self) -> None:
        self.pods: set[str] = set()
        self.checks = 0


@pytest.fixture(scope="module")
def tools():
    try:
        return ensure_tools()
    except ToolsMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def cluster(control_plane, tools, tmp_path_factory):
    from eks_dra.config import load_environment
    from eks_dra.stacks.manifests import write_manifests

    env = load_environment("dev", REPO / "config")
    groups = {g.name: g for g in env.node_groups}
    api = config.new_client_from_config(str(control_plane.kubeconfig))
    route = ApiServerRoute(int(control_plane.server.rsplit(":", 1)[1]))
    route.add()
    nodes = []
    # dist/dev as `eks-dra synth` writes it, with the locally built driver image (see RealCluster.localize).
    manifests = write_manifests(env, tmp_path_factory.mktemp("rn-dist"), image=tools.ref("driver"))
    state = RealCluster(api, nodes, manifests, tools, Tally())
    try:
        state.apply([p for p in manifests if "dra-samples" not in p.name])
        for index, (name, group_name) in enumerate(NODES.items()):
            group = groups[group_name]
            labels = {**env.node_labels(group), "node.kubernetes.io/instance-type": group.instance_type}
            taints = [{"key": t.key, "value": t.value, "effect": t.effect} for t in env.node_taints(group)]
            node = RealNode(control_plane, tools, name, index, labels, taints, group.instance_type, group.mig_profile)
            nodes.append(node)
            node.prepare(REPO / ".venv/bin/eks-dra")
            node.start()
        for node in nodes:
            state.wait_node_ready(node)
        yield state
    finally:
        for node in nodes:
            node.stop()
        route.remove()
        # Leave the shared control plane as the other e2e modules expect it: no dev objects, nodes or slices.
        state.remove_objects()
        for node in nodes:
            node.remove()


class RealCluster:
    def __init__(self, api, nodes: list[RealNode], manifests, tools, tally: Tally) -> None:
        self.api, self.nodes, self.manifests, self.tools, self.tally = api, nodes, manifests, tools, tally
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.resource = client.ResourceV1Api(api)

    def localize(self, obj: dict) -> dict:
        """The two changes to the shipped objects, both because no real machine is underneath: the drivers'
        host-tree volumes are below the node's fixture tree (HOST_ROOT_PATH in the node's mount namespace)
        instead of "/" (and so is the GPU driver root, whose libraries and nvidia-cdi-hook the specs name by their path in
        the node's mount namespace), and the samples use the locally built busybox instead of the registry's."""
        obj = copy.deepcopy(obj)
        spec = obj.get("spec") or {}
        pod_spec = spec.get("template", {}).get("spec") if obj["kind"] in ("DaemonSet", "Job") else spec
        if obj["kind"] == "DaemonSet":
            # The host-tree volumes (all of `/`, or only /sys, /dev and the boot id) and the GPU driver root:
            # the same paths below the fixture tree.
            host_tree = {m["name"] for c in pod_spec["containers"] for m in c.get("volumeMounts") or []
                         if m["mountPath"] in (HOST_ROOT, CONTAINER_DRIVER_ROOT)
                         or m["mountPath"].startswith(HOST_ROOT + "/")}
            for volume in pod_spec.get("volumes") or []:
                if volume["name"] in host_tree:
                    volume["hostPath"]["path"] = HOST_ROOT_PATH + volume["hostPath"]["path"].rstrip("/")
            for c in pod_spec["containers"]:
                for env in c.get("env") or []:
                    if env["name"] == "NVIDIA_DRIVER_ROOT":
                        env["value"] = HOST_ROOT_PATH
                if any(env["name"] == "NVIDIA_DRIVER_ROOT" for env in c.get("env") or []):
                    c["env"].append({"name": "NVIDIA_CDI_HOOK_PATH", "value": f"{HOST_ROOT_PATH}/usr/bin/nvidia-cdi-hook"})
        if obj["kind"] in ("Pod", "Job"):
            for c in pod_spec["containers"]:
                if c["image"] == SHIPPED_BUSYBOX:
                    c["image"] = self.tools.ref("busybox")
        return obj

    def apply(self, paths) -> list[dict]:
        objects = [self.localize(o) for o in load_documents(paths)]
        for ns in (o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"):
            self.wait_namespace_gone(ns)  # an earlier module's teardown may still be deleting it
        return apply_objects(self.api, objects)

    def wait_namespace_gone(self, name: str) -> None:
        def absent_or_active():
            try:
                return as_dict(self.core.read_namespace, name)["status"].get("phase") != "Terminating"
            except ApiException as exc:
                return exc.status == 404

        wait_until(absent_or_active, 180, interval=1, what=f"namespace {name} to finish terminating")

    def remove_objects(self) -> None:
        delete_objects(self.api, load_documents(self.manifests))
        for s in as_dict(self.resource.list_resource_slice)["items"]:
            if s["spec"].get("nodeName") in NODES:
                self.resource.delete_resource_slice(s["metadata"]["name"])
        for name in [*NODES, TEST_NAMESPACE]:
            try:
                (self.core.delete_namespace if name == TEST_NAMESPACE else self.core.delete_node)(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        for obj in load_documents(self.manifests):
            if obj["kind"] == "Namespace":
                self.wait_namespace_gone(obj["metadata"]["name"])

    def node(self, name: str) -> RealNode:
        return next(n for n in self.nodes if n.name == name)

    def wait_node_ready(self, node: RealNode, timeout: float = 120) -> None:
        def ready():
            node._died(node.kubelet, "kubelet.log")
            try:
                obj = as_dict(self.core.read_node, node.name)
            except ApiException:
                return None
            conditions = {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions") or []}
            return obj if conditions.get("Ready") == "True" else None

        try:
            obj = wait_until(ready, timeout, interval=0.5, what=f"Node {node.name} Ready")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{node.log_tail('kubelet.log', 40)}") from exc
        # No node-lifecycle controller in the tier: the not-ready taint the admission plugin added stays.
        taints = [t for t in obj["spec"].get("taints") or [] if t["key"] != "node.kubernetes.io/not-ready"]
        self.core.patch_node(node.name, {"spec": {"taints": taints}})

    def pod(self, ns: str, name: str) -> dict:
        return as_dict(self.core.read_namespaced_pod, name, ns)

    def wait_running(self, ns: str, name: str, timeout: float = 180) -> dict:
        def running():
            pod = self.pod(ns, name)
            statuses = pod.get("status", {}).get("containerStatuses") or []
            if pod["status"].get("phase") == "Running" and statuses and all(s.get("ready") or s.get("started")
                                                                           for s in statuses):
                return pod
            return None

        try:
            return wait_until(running, timeout, interval=0.5, what=f"pod {ns}/{name} running")
        except TimeoutError as exc:
            pod = self.pod(ns, name)
            node = pod["spec"].get("nodeName")
            tail = self.node(node).log_tail("kubelet.log", 25) if node in NODES else ""
            raise AssertionError(f"{exc}; status {json.dumps(pod.get('status'))[:2000]}\n{tail}") from exc

    def pod_claims(self, pod: dict) -> list[dict]:
        ns = pod["metadata"]["namespace"]
        names = [s["resourceClaimName"] for s in pod.get("status", {}).get("resourceClaimStatuses") or []
                 if s.get("resourceClaimName")]
        names += [c["resourceClaimName"] for c in pod["spec"].get("resourceClaims") or [] if c.get("resourceClaimName")]
        return [as_dict(self.resource.read_namespaced_resource_claim, n, ns) for n in names]

    def check_inside(self, pod: dict) -> str:
        """Run the in-container check in the pod's (first) container; returns its output, fails on FAIL."""
        node = self.node(pod["spec"]["nodeName"])
        expected = expected_for(self.pod_claims(pod), node.cdi_specs(), self.published())
        container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
        out = node.exec(container_id, check_script(expected))
        text = out.stdout + out.stderr
        name = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        print(f"--- in-container check of {name} on {node.name}:\n{text}")  # shown with -s or on failure
        assert out.returncode == 0, f"in-container check of {name} on {node.name} failed:\n{text}"
        self.tally.pods.add(pod["metadata"]["uid"])
        self.tally.checks += passed_checks(text)
        return text

    def published(self) -> dict[tuple[str, str, str], dict]:
        """(driver, pool, device) -> the device as its ResourceSlice publishes it."""
        return {(s["spec"]["driver"], s["spec"]["pool"]["name"], d["name"]): d
                for s in as_dict(self.resource.list_resource_slice)["items"] for d in s["spec"].get("devices") or []}

    def driver_pods(self) -> list[dict]:
        return [p for p in as_dict(self.core.list_namespaced_pod, SYSTEM_NAMESPACE)["items"]
                if p["spec"].get("nodeName") in NODES]


# --- the tests, in the order of one cluster's life ------------------------------------------------

def test_driver_daemonsets_run_on_the_real_nodes(cluster):
    expected = {"rn-p5-0": {"gpu", "efa"}, "rn-trn2-0": {"neuron", "efa"}, "rn-p4d-0": {"gpu", "efa"}}

    def all_running():
        pods = cluster.driver_pods()
        ready = {(p["spec"]["nodeName"], p["metadata"]["labels"]["app.kubernetes.io/name"]) for p in pods
                 if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])}
        want = {(n, f"eks-dra-{f}-driver") for n, fams in expected.items() for f in fams}
        return ready >= want

    try:
        wait_until(all_running, 300, interval=1, what="driver DaemonSet pods Ready on every real node")
    except TimeoutError as exc:
        pods = {p["metadata"]["name"]: p.get("status") for p in cluster.driver_pods()}
        raise AssertionError(f"{exc}: {json.dumps(pods)[:3000]}\n{cluster.nodes[0].log_tail('kubelet.log', 30)}") from exc

    def untainted():
        for node in cluster.nodes:
            taints = as_dict(cluster.core.read_node, node.name)["spec"].get("taints") or []
            if any(t["key"].endswith("/not-ready") for t in taints):
                return False
        return True

    wait_until(untainted, 120, interval=1, what="the drivers to remove their readiness taints")
    for node in cluster.nodes:
        slices = [s for s in as_dict(cluster.resource.list_resource_slice)["items"]
                  if s["spec"].get("nodeName") == node.name]
        assert slices, f"no ResourceSlices of {node.name}"


def test_samples_run_with_their_devices_injected(cluster):
    cluster.apply([p for p in cluster.manifests if "dra-samples" in p.name])
    pods = [p for p in as_dict(cluster.core.list_namespaced_pod, SAMPLES_NAMESPACE)["items"]
            if p["metadata"]["name"] not in NOT_PLACEABLE]
    names = sorted(p["metadata"]["name"] for p in pods)
    assert len(names) >= 9, names
    for name in names:
        pod = cluster.wait_running(SAMPLES_NAMESPACE, name)
        if pod["metadata"].get("ownerReferences"):  # the Job's pods sleep 60 s and finish
            continue
        cluster.check_inside(pod)


def test_shared_claim_is_seen_by_both_pods(cluster):
    outputs = [cluster.check_inside(cluster.pod(SAMPLES_NAMESPACE, n)) for n in ("shared-gpu-a", "shared-gpu-b")]
    nodes = [sorted(line for line in o.splitlines() if line.startswith("ok node ")) for o in outputs]
    assert nodes[0] and nodes[0] == nodes[1], nodes


def test_a_wrong_cdi_spec_fails_the_in_container_check(cluster):
    """The driver's spec for a running pod's claim is replaced by a wrong one (an env value that the
    allocation does not give, a device node that does not exist); the kubelet restarts the container, which
    containerd creates from the spec on disk: the container cannot start, or the check fails inside it."""
    ns = ensure_namespace(cluster)
    pod = run_claim_pod(cluster, ns, "wrong-spec", "gpu", restart="Always")
    node = cluster.node(pod["spec"]["nodeName"])
    claim = cluster.pod_claims(pod)[0]
    driver = DEFAULT_DRIVER_NAMES.gpu
    path = node.cdi_dir / spec_file_name(driver, claim["metadata"]["uid"])
    good = json.loads(path.read_text())
    # 1. A wrong env: the container starts with it, and the tier's own check (which reads the spec on disk)
    #    fails inside the container on what the allocation demands: NVIDIA_VISIBLE_DEVICES=void.
    wrong = copy.deepcopy(good)
    edits = wrong["devices"][0]["containerEdits"]
    edits["env"] = [e for e in edits.get("env") or [] if not e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    edits["env"].append("NVIDIA_VISIBLE_DEVICES=wrong-gpu")
    common = wrong.get("containerEdits") or {}
    common["env"] = [e for e in common.get("env") or [] if not e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    path.write_text(json.dumps(wrong))
    restarted = restart_container(cluster, node, pod)
    with pytest.raises(AssertionError, match="FAIL allocated void not in NVIDIA_VISIBLE_DEVICES"):
        cluster.check_inside(restarted)
    # 2. A device node that does not exist on the node: containerd refuses to create the container.
    edits["deviceNodes"] = [*(edits.get("deviceNodes") or []), {"path": "/dev/nvidia-does-not-exist"}]
    path.write_text(json.dumps(wrong))
    node.ctr("tasks", "kill", "--signal", "SIGKILL", restarted["status"]["containerStatuses"][0]["containerID"]
             .split("://", 1)[1], check=False)

    def create_error():
        status = cluster.pod(ns, "wrong-spec")["status"]["containerStatuses"][0]
        waiting = (status.get("state") or {}).get("waiting") or {}
        return waiting if waiting.get("reason") in ("CreateContainerError", "RunContainerError") else None

    waiting = wait_until(create_error, 90, interval=0.5, what="CreateContainerError for the wrong device node")
    assert "nvidia-does-not-exist" in waiting.get("message", ""), waiting
    path.write_text(json.dumps(good))
    delete_pod(cluster, ns, "wrong-spec")


def test_pod_deletion_unprepares_through_the_real_kubelet(cluster):
    ns = ensure_namespace(cluster)
    pod = run_claim_pod(cluster, ns, "to-delete", "neuron")
    cluster.check_inside(pod)
    node = cluster.node(pod["spec"]["nodeName"])
    claim = cluster.pod_claims(pod)[0]
    uid, driver = claim["metadata"]["uid"], DEFAULT_DRIVER_NAMES.neuron
    assert (node.cdi_dir / spec_file_name(driver, uid)).exists()
    assert uid in node.checkpoint_claims(driver)
    delete_pod(cluster, ns, "to-delete")
    wait_until(lambda: not (node.cdi_dir / spec_file_name(driver, uid)).exists() and
               uid not in node.checkpoint_claims(driver), 60, interval=0.5,
               what="the real kubelet's NodeUnprepareResources to remove the CDI spec and checkpoint entry")


def test_kubelet_restart_keeps_running_pods_and_their_devices(cluster):
    before = {n: cluster.pod(SAMPLES_NAMESPACE, n) for n in ("shared-gpu-a", "neuron-lnc")}
    for node in cluster.nodes:
        node.stop_kubelet()
        node.start_kubelet()
    for node in cluster.nodes:
        cluster.wait_node_ready(node)
    time.sleep(3)  # a kubelet that would kill or restart the pods does so within its first syncs
    for name, old in before.items():
        pod = cluster.wait_running(SAMPLES_NAMESPACE, name)
        assert (pod["status"]["containerStatuses"][0]["containerID"]
                == old["status"]["containerStatuses"][0]["containerID"]), name
        cluster.check_inside(pod)


def test_daemonset_rolling_update_keeps_workload_devices(cluster):
    name = "eks-dra-gpu-driver"
    old = {p["metadata"]["uid"] for p in cluster.driver_pods() if p["metadata"]["labels"].get(
        "app.kubernetes.io/name") == name}
    cluster.apps.patch_namespaced_daemon_set(name, SYSTEM_NAMESPACE, {"spec": {"template": {"metadata": {
        "annotations": {"e2e.eks-dra.io/rollout": str(uuid.uuid4())}}}}})

    def rolled():
        pods = [p for p in cluster.driver_pods() if p["metadata"]["labels"].get("app.kubernetes.io/name") == name]
        new = [p for p in pods if p["metadata"]["uid"] not in old]
        ready = [p for p in new if any(c["type"] == "Ready" and c["status"] == "True"
                                       for c in p["status"].get("conditions") or [])]
        return ready and not [p for p in pods if p["metadata"]["uid"] in old]

    wait_until(rolled, 240, interval=1, what=f"{name} rolling update (maxSurge) to finish")
    for pod_name in ("shared-gpu-a", "shared-gpu-b", "gpu-efa-aligned"):
        pod = cluster.wait_running(SAMPLES_NAMESPACE, pod_name)
        assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
        cluster.check_inside(pod)


def test_simulated_reboot_restarts_pods_with_fresh_cdi_specs(cluster):
    """Power cut: every container killed, containerd's state and the CDI dir (a tmpfs on real nodes) emptied,
    a new boot id; then containerd and the kubelet start again and restart the pods."""
    from eks_dra.drivers.fixture import set_boot_id

    ns = ensure_namespace(cluster)
    pod = run_claim_pod(cluster, ns, "survivor", "gpu", restart="Always")
    node = cluster.node(pod["spec"]["nodeName"])
    old_container = pod["status"]["containerStatuses"][0]["containerID"]
    node.stop_kubelet()
    node.kill_containers()
    node.stop_containerd()
    for spec in node.cdi_dir.glob("*"):
        spec.unlink()
    set_boot_id(node.host_root)
    node.start_containerd()
    node.start_kubelet()
    cluster.wait_node_ready(node)

    def restarted():
        p = cluster.wait_running(ns, "survivor")
        return p if p["status"]["containerStatuses"][0]["containerID"] != old_container else None

    pod = wait_until(restarted, 180, interval=1, what="the kubelet to restart the pod after the reboot")
    cluster.check_inside(pod)
    delete_pod(cluster, ns, "survivor")


def test_summary_line(cluster):
    n, m, k = len(cluster.tally.pods), len(cluster.nodes), cluster.tally.checks
    print(f"\nreal node: {n} pods ran with injected devices on {m} kubelets ({k} checks inside containers)")
    assert n >= 10 and m >= 1 and k > n


# --- helpers of this module ---------------------------------------------------------------------

def ensure_namespace(cluster: RealCluster) -> str:
    apply_objects(cluster.api, [namespace_object(TEST_NAMESPACE)])  # waits for its default ServiceAccount
    return TEST_NAMESPACE


def run_claim_pod(cluster: RealCluster, ns: str, name: str, family: str, restart: str = "Never") -> dict:
    """A one-device claim of `family` and a busybox pod using it; waits until it runs."""
    driver = DEFAULT_DRIVER_NAMES.for_family(family)
    cluster.resource.create_namespaced_resource_claim(ns, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": driver}}]}}})
    cluster.core.create_namespaced_pod(ns, {
        "metadata": {"name": name},
        "spec": {"restartPolicy": restart, "terminationGracePeriodSeconds": 0,
                 "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
                 "resourceClaims": [{"name": "dev", "resourceClaimName": name}],
                 "containers": [{"name": "app", "image": cluster.tools.ref("busybox"), "command": ["sleep", "3600"],
                                 "resources": {"claims": [{"name": "dev"}]}}]}})  # fmt: skip
    return cluster.wait_running(ns, name)


def restart_container(cluster: RealCluster, node: RealNode, pod: dict) -> dict:
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    cid = pod["status"]["containerStatuses"][0]["containerID"]
    node.ctr("tasks", "kill", "--signal", "SIGKILL", cid.split("://", 1)[1], check=False)

    def new_container():
        p = cluster.pod(ns, name)
        s = (p["status"].get("containerStatuses") or [{}])[0]
        return p if s.get("containerID") not in (None, cid) and "running" in (s.get("state") or {}) else None

    return wait_until(new_container, 120, interval=0.5, what=f"{name} container restarted by the kubelet")


def delete_pod(cluster: RealCluster, ns: str, name: str) -> None:
    cluster.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)

    def gone():
        try:
            cluster.core.read_namespaced_pod(name, ns)
            return False
        except ApiException as exc:
            return exc.status == 404

    wait_until(gone, 60, interval=0.5, what=f"pod {ns}/{name} deleted")
    try:
        cluster.resource.delete_namespaced_resource_claim(name, ns)
    except ApiException as exc:
        if exc.status != 404:
            raise
