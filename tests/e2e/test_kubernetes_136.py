"""What Kubernetes 1.36 turns on, on a real 1.36 control plane (tests/e2e/cluster/go-1.36.mod).

One module-scoped cluster: the dev environment's driver and DeviceClass manifests synthesized for 1.36 (the
GPU class carries extendedResourceName, the driver DaemonSets set DEVICE_TAINTS), two simulated p5.48xlarge
nodes with kubelet stand-ins and our GPU and EFA driver processes; the second node's kubelet stand-in is the
1.34 build (the skew of a node group not yet upgraded). The 1.36 scheduler writes the claim of a pod that asks
for `nvidia.com/gpu` in its limits (DRAExtendedResource); an unhealthy GPU stays in the slice with a device
taint (DRADeviceTaints) and the scheduler keeps new claims off it.
"""

from __future__ import annotations

import os
import uuid

import pytest
from controlplane import KubeletStandIn, ensure_binary, wait_until
from helpers import (
    DevCluster,
    apply_objects,
    as_dict,
    delete_objects,
    load_documents,
    namespace_object,
    pod_running,
    prepared,
    unschedulable,
)

from eks_dra.devices.gpu import gpu_minor_of
from eks_dra.drivers import fixture
from eks_dra.drivers.framework.device_taints import NO_EXECUTE, taint_key
from eks_dra.stacks.manifests import device_classes

pytestmark = [pytest.mark.e2e, pytest.mark.k8s136]

NODE = "k136-p5-0"
OLD_NODE = "k136-p5-old"  # its kubelet stand-in is built against Kubernetes 1.34
NAMESPACE = "e2e-k8s136"
TOLERATE_ALL = [{"operator": "Exists"}]


@pytest.fixture(scope="module")
def k136(control_plane_136, e2e_binary_136, tmp_path_factory, request):
    cluster = DevCluster(control_plane_136, e2e_binary_136, tmp_path_factory.mktemp("k8s136"),
                         nodes={NODE: "p5-dra", OLD_NODE: "p5-dra"}, kubernetes_version="1.36")
    failed_before = request.session.testsfailed
    try:
        # The drivers' charts and the DeviceClasses; the samples chart only for its namespace and the
        # extended-resource sample (the other samples would compete for the one node's GPUs).
        cluster.apply_manifests(lambda path: "samples" not in path.name)
        samples = [p for p in cluster.manifest_paths if "samples" in p.name]
        cluster.applied.extend(apply_objects(cluster.api, [
            d for d in load_documents(samples)
            if d["kind"] == "Namespace" or d["metadata"]["name"] == "extended-resource-gpu"]))
        cluster.create_nodes()
        old = cluster.nodes[OLD_NODE]
        old.kubelet = KubeletStandIn(ensure_binary("1.34"), control_plane_136.kubeconfig, OLD_NODE, root=old.root)
        cluster.start_nodes()
        cluster.wait_drivers_ready()
        apply_objects(cluster.api, [namespace_object(NAMESPACE)])  # waits for its default ServiceAccount
        yield cluster
    finally:
        cluster.stop()
        keep = request.session.testsfailed > failed_before or os.environ.get("E2E_KEEP") == "1"
        cluster.remove(keep_dirs=keep)
        delete_objects(cluster.api, [namespace_object(NAMESPACE)])


def _pod(name: str, limits: dict | None = None, claim: str | None = None, node: str = NODE) -> dict:
    spec: dict = {"tolerations": TOLERATE_ALL, "nodeSelector": {"kubernetes.io/hostname": node}, "containers": [{
        "name": "app", "image": "busybox", "command": ["sleep", "3600"],
        "resources": {"limits": limits or {}, **({"claims": [{"name": "c"}]} if claim else {})}}]}
    if claim:
        spec["resourceClaims"] = [{"name": "c", "resourceClaimName": claim}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


def _gpu_slice_devices(cluster) -> dict[str, dict]:
    driver = device_classes(cluster.env).driver("gpu")
    return {d["name"]: d for s in cluster.slices() if s["spec"]["driver"] == driver and s["spec"]["nodeName"] == NODE
            for d in s["spec"]["devices"]}


def _served_by_our_driver(cluster, pod: dict, count: int) -> list[str]:
    """The scheduler's claim of the pod, allocated from our GPU driver on the DRA node and prepared there."""
    driver = device_classes(cluster.env).driver("gpu")
    status = pod["status"].get("extendedResourceClaimStatus")
    assert status, pod["status"]
    assert not pod["spec"].get("resourceClaims")  # the user wrote no claim
    claim = as_dict(cluster.resource.read_namespaced_resource_claim, status["resourceClaimName"],
                    pod["metadata"]["namespace"])
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == count and {(r["driver"], r["pool"]) for r in results} == {(driver, pod["spec"]["nodeName"])}
    assert [m["resourceName"] for m in status["requestMappings"]] == ["nvidia.com/gpu"]
    done = prepared(pod)[claim["metadata"]["uid"]]
    assert not done.get("error") and len(done["devices"]) == count, done
    assert all(d["cdiDeviceIds"] for d in done["devices"])
    return [r["device"] for r in results]


def test_extended_resource_pod_is_served_by_our_gpu_driver(k136):
    name = f"ext-{uuid.uuid4().hex[:6]}"
    k136.core.create_namespaced_pod(NAMESPACE, _pod(name, {"nvidia.com/gpu": "1"}))
    pod = wait_until(lambda: (p := as_dict(k136.core.read_namespaced_pod, name, NAMESPACE)) and pod_running(p)
                     and prepared(p) and p, 90, what=f"pod {name} running and prepared")
    assert pod["spec"]["nodeName"] == NODE
    _served_by_our_driver(k136, pod, 1)
    # The shipped sample (two GPUs, no claim) runs the same way.
    sample = wait_until(lambda: (p := as_dict(k136.core.read_namespaced_pod, "extended-resource-gpu", "dra-samples"))
                        and pod_running(p) and prepared(p) and p, 90, what="sample extended-resource-gpu")
    assert len(set(_served_by_our_driver(k136, sample, 2))) == 2


def test_unhealthy_gpu_is_tainted_in_the_slice_and_new_pods_do_not_get_it(k136):
    node = k136.nodes[NODE]
    driver = device_classes(k136.env).driver("gpu")
    devices = _gpu_slice_devices(k136)
    used = {r["device"] for c in as_dict(k136.resource.list_resource_claim_for_all_namespaces)["items"]
            for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
            if r["pool"] == NODE}
    victim = next(n for n in sorted(devices) if n not in used)
    index = gpu_minor_of(victim)
    victim_uuid = devices[victim]["attributes"]["uuid"]["string"]
    fixture.set_gpu_xid(node.host_root, index, 79)
    try:
        tainted = wait_until(lambda: _gpu_slice_devices(k136)[victim].get("taints"), 30,
                             what=f"a taint on {victim} in the ResourceSlice")
        assert [(t["key"], t["value"], t["effect"]) for t in tainted] == [(taint_key(driver), "xid", NO_EXECUTE)]
        assert len(_gpu_slice_devices(k136)) == len(devices)  # still published: kubectl shows why
        # A claim that can only be satisfied by the tainted GPU stays unallocated ...
        claim = f"only-{victim}-{uuid.uuid4().hex[:4]}"
        k136.resource.create_namespaced_resource_claim(NAMESPACE, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": claim},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": device_classes(k136.env).class_name("gpu"),
                "selectors": [{"cel": {"expression": f"device.attributes['{driver}'].uuid == '{victim_uuid}'"}}]}}]}}})
        k136.core.create_namespaced_pod(NAMESPACE, _pod(claim, claim=claim))
        message = wait_until(lambda: unschedulable(as_dict(k136.core.read_namespaced_pod, claim, NAMESPACE)), 60,
                             what=f"pod {claim} unschedulable")
        assert "resourceclaim" in message.lower() or "cannot allocate" in message.lower(), message
        # ... and every GPU a new extended-resource pod gets is another one.
        free = len(devices) - len(used) - 1
        name = f"rest-{uuid.uuid4().hex[:6]}"
        k136.core.create_namespaced_pod(NAMESPACE, _pod(name, {"nvidia.com/gpu": str(free)}))
        pod = wait_until(lambda: (p := as_dict(k136.core.read_namespaced_pod, name, NAMESPACE)) and pod_running(p)
                         and prepared(p) and p, 90, what=f"pod {name} running on the {free} healthy free GPUs")
        got = _served_by_our_driver(k136, pod, free)
        assert victim not in got
    finally:
        fixture.set_gpu_xid(node.host_root, index, None)
    wait_until(lambda: not _gpu_slice_devices(k136)[victim].get("taints"), 30, what=f"{victim} untainted")


def test_a_1_34_kubelet_keeps_preparing_claims_against_the_1_36_control_plane(k136):
    """Mid-upgrade: the control plane runs 1.36, a node group still runs the 1.34 kubelet (our plugins serve
    v1 and v1beta1 to either); a claim on that node is allocated, prepared and its pod runs."""
    classes = device_classes(k136.env)
    name = f"old-{uuid.uuid4().hex[:6]}"
    k136.resource.create_namespaced_resource_claim(NAMESPACE, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": classes.class_name("gpu")}}]}}})
    k136.core.create_namespaced_pod(NAMESPACE, _pod(name, claim=name, node=OLD_NODE))
    pod = wait_until(lambda: (p := as_dict(k136.core.read_namespaced_pod, name, NAMESPACE)) and pod_running(p)
                     and prepared(p) and p, 90, what=f"pod {name} on the 1.34 kubelet running and prepared")
    claim = as_dict(k136.resource.read_namespaced_resource_claim, name, NAMESPACE)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (classes.driver("gpu"), OLD_NODE)
    (done,) = prepared(pod).values()
    assert not done.get("error") and done["devices"][0]["cdiDeviceIds"], done
