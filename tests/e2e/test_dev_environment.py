"""The dev environment's manifests, our drivers and its samples on a real Kubernetes 1.34 control plane.

One module-scoped cluster: the synthesized dev manifests applied by server-side apply, four simulated nodes
(2x p5.48xlarge, trn2.48xlarge, g6e.48xlarge) registered with their node-group labels and taints, a kubelet
stand-in and our driver processes per node (as their charts' ServiceAccounts, tokens bound to the node).
The tests follow the life of a cluster in file order (samples run, the planner is compared with the scheduler,
drivers, a kubelet and the API server restart under them, everything is unprepared); each also runs alone.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import uuid
from collections import Counter
from pathlib import Path

import pytest
import yaml
from controlplane import wait_until
from helpers import (
    BIN,
    REPO,
    SAMPLES_NAMESPACE,
    DevCluster,
    apply_objects,
    as_dict,
    constraint_violations,
    delete_objects,
    load_documents,
    namespace_object,
    pod_running,
    prepared,
    unschedulable,
)
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from eks_dra.devices import DEFAULT_DRIVER_NAMES
from eks_dra.devices.gpu import gpu_minor_of
from eks_dra.devices.neuron import neuron_device_index

pytestmark = pytest.mark.e2e

# Samples of dev that no simulated node can hold: MIG (no p4d node) and the device-plugin pods (no plugin).
NOT_PLACEABLE = {"mig-1g-5gb", "device-plugin-gpu", "device-plugin-efa"}
PLACEABLE = {"shared-gpu-a", "shared-gpu-b", "time-sliced-a", "time-sliced-b", "prioritized-gpu", "gpu-efa-aligned",
             "gpu-efa-root", "neuron-lnc", "neuron-efa-aligned"}  # and the two pods of the Job gpu-job


@pytest.fixture(scope="module")
def dev(control_plane, e2e_binary, tmp_path_factory, request):
    cluster = DevCluster(control_plane, e2e_binary, tmp_path_factory.mktemp("dev-env"))
    failed_before = request.session.testsfailed
    try:
        cluster.apply_manifests()
        cluster.create_nodes()
        cluster.start_nodes()
        cluster.wait_drivers_ready()
        apply_objects(cluster.api, [namespace_object(EXTRA_NAMESPACE)])  # waits for its default ServiceAccount
        yield cluster
    finally:
        cluster.stop()
        # Node directories (kubelet and driver logs, CDI roots, checkpoints) stay after a failure or with E2E_KEEP=1.
        keep = request.session.testsfailed > failed_before or os.environ.get("E2E_KEEP") == "1"
        cluster.remove(keep_dirs=keep)
        delete_objects(cluster.api, [namespace_object(EXTRA_NAMESPACE)])


def test_dev_manifests_are_accepted(dev):
    kinds = Counter(o["kind"] for o in dev.applied)
    # Every object of every chart went through the API server's validation (CEL of the VAPs included).
    assert kinds["ValidatingAdmissionPolicy"] == 6 and kinds["ValidatingAdmissionPolicyBinding"] == 6
    assert kinds["DeviceClass"] >= 4 and kinds["ResourceClaimTemplate"] >= 5 and kinds["DaemonSet"] >= 3
    adm = client.AdmissionregistrationV1Api(dev.api)

    def type_checked():
        policies = [p for p in as_dict(adm.list_validating_admission_policy)["items"]
                    if p["metadata"]["name"].startswith("eks-dra-")]
        done = all((p.get("status") or {}).get("observedGeneration") == p["metadata"]["generation"] for p in policies)
        return policies if done and len(policies) == 6 else None

    # The API server's type checker compiled every CEL expression against the matched resources' schemas.
    for policy in wait_until(type_checked, 60, what="type checking of the eks-dra admission policies"):
        assert not (policy["status"].get("typeChecking") or {}).get("expressionWarnings"), policy


def test_drivers_publish_the_simulated_devices_and_untaint(dev):
    from eks_dra.catalog import get_instance_type
    from eks_dra.devices import simulate_node

    devices = dev.devices()
    for node in dev.nodes.values():
        expected = simulate_node(get_instance_type(node.instance_type), node.name)
        for family in node.families:
            published = sorted(name for (drv, pool, name) in devices if drv == DEFAULT_DRIVER_NAMES.for_family(family) and pool == node.name)
            assert published == sorted(d.name for d in expected[family]), (node.name, family)
        taints = as_dict(dev.core.read_node, node.name)["spec"].get("taints") or []
        # The drivers removed their own readiness taints; the accelerator taint stays.
        assert [t["key"] for t in taints] == [t["key"] for t in node.taints if not t["key"].endswith("/not-ready")]
        for s in dev.slices():
            if s["spec"]["nodeName"] == node.name:
                assert s["metadata"]["ownerReferences"][0]["kind"] == "Node"


# --- helpers of this module ---------------------------------------------------------------------------

EXTRA_NAMESPACE = "e2e-dev-extra"
ACCELERATOR_TOLERATIONS = [{"key": k, "operator": "Exists", "effect": "NoSchedule"}
                           for k in ("nvidia.com/gpu", "aws.amazon.com/neuron")]


def forbidden(call, *args, **kwargs) -> ApiException:
    """The ApiException of a call that must be refused with 403."""
    with pytest.raises(ApiException) as refused:
        call(*args, **kwargs)
    assert refused.value.status == 403, (refused.value.status, refused.value.body)
    return refused.value


def extra_claim(dev: DevCluster, name: str, requests: list[dict], constraints: list[dict] | None = None) -> dict:
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": EXTRA_NAMESPACE},
            "spec": {"devices": {"requests": requests, "constraints": constraints or []}}}
    dev.resource.create_namespaced_resource_claim(EXTRA_NAMESPACE, body)
    return body


def extra_pod(dev: DevCluster, name: str, claim: str, node: str | None = None) -> dict:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": EXTRA_NAMESPACE},
            "spec": {"tolerations": ACCELERATOR_TOLERATIONS, "terminationGracePeriodSeconds": 5,
                     "nodeSelector": {"kubernetes.io/hostname": node} if node else None,
                     "resourceClaims": [{"name": "devices", "resourceClaimName": claim}],
                     "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"claims": [{"name": "devices"}]}}]}}  # fmt: skip
    dev.core.create_namespaced_pod(EXTRA_NAMESPACE, body)
    return body


def remove_extra(dev: DevCluster, name: str) -> None:
    """Delete an extra pod and its claim and wait until both are gone, so that the devices they held are free
    for the tests after (the scheduler may have put every sample on one node: it has no room for leftovers)."""
    dev.core.delete_namespaced_pod(name, EXTRA_NAMESPACE)
    wait_until(lambda: name not in {p["metadata"]["name"] for p in dev.pods(EXTRA_NAMESPACE)}, 60,
               what=f"pod {EXTRA_NAMESPACE}/{name} gone")
    dev.resource.delete_namespaced_resource_claim(name, EXTRA_NAMESPACE)
    wait_until(lambda: name not in {c["metadata"]["name"] for c in dev.claims(EXTRA_NAMESPACE)}, 60,
               what=f"claim {EXTRA_NAMESPACE}/{name} gone")


def request(name: str, family: str, count: int = 1, selectors: list[str] | None = None) -> dict:
    exactly = {"deviceClassName": DEFAULT_DRIVER_NAMES.class_name(family), "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"name": name, "exactly": exactly}


def wait_running(dev: DevCluster, ns: str, name: str, timeout: float = 90) -> dict:
    def running():
        pod = as_dict(dev.core.read_namespaced_pod, name, ns)
        return pod if pod_running(pod) else None

    try:
        return wait_until(running, timeout, interval=0.3, what=f"pod {ns}/{name} Running")
    except TimeoutError as exc:
        pod = as_dict(dev.core.read_namespaced_pod, name, ns)
        node = dev.nodes.get(pod["spec"].get("nodeName") or "")
        logs = "" if node is None else f"\nkubelet log:\n{node.kubelet.log_tail(20)}" + "".join(
            f"\n{f} driver log:\n{d.log_tail(15)}" for f, d in node.drivers.items())
        wanted = (pod["spec"].get("nodeSelector") or {}).get("kubernetes.io/hostname")
        raise AssertionError(f"{exc}; status {json.dumps(pod.get('status'))[:1500]}{logs}"
                             f"{pool_report(dev, wanted) if wanted else ''}") from exc


def pool_report(dev: DevCluster, pool: str) -> str:
    """Why a claim may not fit on a node: its pools' slices (generation, count) and who holds which device."""
    lines = [f"\npools of {pool}:"]
    for s in dev.slices():
        if s["spec"]["pool"]["name"] == pool:
            p = s["spec"]["pool"]
            lines.append(f"  slice {s['metadata']['name']} {s['spec']['driver']} generation {p['generation']} "
                         f"count {p['resourceSliceCount']} devices {len(s['spec']['devices'])}")
    for ns in (SAMPLES_NAMESPACE, EXTRA_NAMESPACE):
        for c in dev.claims(ns):
            results = (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
            held = [r["device"] for r in results if r["pool"] == pool]
            if held:
                lines.append(f"  {ns}/{c['metadata']['name']}: {held}")
    return "\n".join(lines)


def sample_pods(dev: DevCluster) -> list[dict]:
    return [p for p in dev.pods(SAMPLES_NAMESPACE) if p["metadata"]["name"] not in NOT_PLACEABLE]


def check_prepared(dev: DevCluster, pod: dict) -> list[dict]:
    """Assert the pod's claims are allocated on its node within their constraints, prepared by our drivers,
    their CDI specs on the node's disk name the devices, and the drivers' checkpoints hold them."""
    node = dev.nodes[pod["spec"]["nodeName"]]
    devices = dev.devices()
    annotation = prepared(pod)
    claims = dev.pod_claims(pod)
    assert claims, f"pod {pod['metadata']['name']} has no claims"
    specs = node.cdi_specs()
    for claim in claims:
        uid, allocation = claim["metadata"]["uid"], claim["status"]["allocation"]
        assert pod["metadata"]["uid"] in [r["uid"] for r in claim["status"]["reservedFor"]]
        results = allocation["devices"]["results"]
        assert {r["pool"] for r in results} == {node.name}
        assert constraint_violations(claim, devices) == []
        entry = annotation[uid]
        assert entry["error"] == ""
        assert sorted((d["poolName"], d["deviceName"]) for d in entry["devices"]) == sorted(
            (r["pool"], r["device"]) for r in results)
        for result in results:
            driver, device = result["driver"], result["device"]
            cdi_ids = [i for d in entry["devices"] if d["deviceName"] == device for i in d["cdiDeviceIds"]]
            assert cdi_ids == [f"k8s.{driver}/claim={uid}-{device}"]
            spec = specs[f"k8s.{driver}-claim_{uid}.json"]
            assert spec["kind"] == f"k8s.{driver}/claim"
            spec_device = next(d for d in spec["devices"] if d["name"] == f"{uid}-{device}")
            nodes = [n["path"] for n in spec_device["containerEdits"]["deviceNodes"]]
            family = DEFAULT_DRIVER_NAMES.family_of(driver)
            # The device's own /dev node: gpu-3 -> /dev/nvidia3, neurondevice5 -> /dev/neuron5, an EFA's uverbs.
            own = (f"/dev/nvidia{gpu_minor_of(device)}" if family == "gpu" else
                   f"/dev/neuron{neuron_device_index(device)}" if family == "neuron" else None)
            assert (own in nodes) if own else any(n.startswith("/dev/infiniband/uverbs") for n in nodes), nodes
            assert uid in node.drivers[family].checkpoint_claims()
    return claims


def claim_of(dev: DevCluster, pod_name: str, ns: str = SAMPLES_NAMESPACE) -> dict:
    return dev.pod_claims(as_dict(dev.core.read_namespaced_pod, pod_name, ns))[0]


# --- the tests, in the order a cluster lives ------------------------------------------------------------

def test_daemonsets_land_on_exactly_their_node_groups(dev):
    """The real DaemonSet controller and scheduler, on the node-group labels and taints: each driver's pods go to
    the nodes of its family (tolerating the accelerator and readiness taints), device plugins to none of ours;
    the EFA of the Bottlerocket group gets the privileged EFA DaemonSet, every other EFA the unprivileged one."""
    apps = client.AppsV1Api(dev.api)
    bottlerocket = {g.name for g in dev.env.node_groups if g.ami_family == "bottlerocket"}

    def nodes(family: str, privileged: bool) -> list[str]:
        return sorted(n.name for n in dev.nodes.values() if family in n.families and (n.group in bottlerocket) is privileged)

    expected = {"eks-dra-gpu-driver": sorted(n.name for n in dev.nodes.values() if "gpu" in n.families),
                "eks-dra-efa-driver": nodes("efa", False), "eks-dra-efa-driver-privileged": nodes("efa", True),
                "eks-dra-neuron-driver": nodes("neuron", False)}
    assert expected["eks-dra-efa-driver-privileged"] == ["dev-g6e-0"]

    def placed():
        placement = {}
        for ds in as_dict(apps.list_daemon_set_for_all_namespaces)["items"]:
            selector = ",".join(f"{k}={v}" for k, v in ds["spec"]["selector"]["matchLabels"].items())
            pods = as_dict(dev.core.list_namespaced_pod, ds["metadata"]["namespace"], label_selector=selector)["items"]
            placement[ds["metadata"]["name"]] = sorted(p["spec"].get("nodeName") or "-" for p in pods
                                                      if p["spec"].get("nodeName") in dev.nodes)
        return placement if all(placement.get(k) == v for k, v in expected.items()) else None

    placement = wait_until(placed, 60, interval=0.5, what=f"driver DaemonSet pods on {expected}")
    device_plugins = {k: v for k, v in placement.items() if k not in expected}
    assert device_plugins and not any(device_plugins.values()), placement


def test_node_identity_cannot_write_other_nodes_or_drivers_slices(dev):
    """RBAC lets every driver write ResourceSlices; the charts' policies confine it to its node and driver."""
    own, other = "dev-p5-0", "dev-p5-1"
    as_gpu = client.ResourceV1Api(config.new_client_from_config(str(dev.driver_kubeconfig(own, "gpu"))))
    pools = dev.slices_by_pool()
    other_gpu = pools[("gpu.nvidia.com", other)][0]
    own_efa = pools[("dra.net", own)][0]
    own_gpu = pools[("gpu.nvidia.com", own)][0]

    def copy(s: dict, **spec) -> dict:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": f"e2e-forged-{uuid.uuid4().hex[:6]}"},
                "spec": {**{k: v for k, v in s["spec"].items() if k != "nodeName"}, **spec}}

    # Allowed: its own node and driver (dry run, so the driver's pool is not disturbed).
    as_gpu.create_resource_slice(copy(own_gpu, nodeName=own), dry_run="All")
    as_gpu.replace_resource_slice(own_gpu["metadata"]["name"], own_gpu, dry_run="All")
    # Another node's slices: no create, update or delete.
    exc = forbidden(as_gpu.create_resource_slice, copy(other_gpu, nodeName=other), dry_run="All")
    assert f"may only write ResourceSlices of node {own}" in exc.body
    forbidden(as_gpu.replace_resource_slice, other_gpu["metadata"]["name"], other_gpu, dry_run="All")
    forbidden(as_gpu.delete_resource_slice, other_gpu["metadata"]["name"], dry_run="All")
    # Another driver's slices on its own node: no create, update or delete either.
    exc = forbidden(as_gpu.create_resource_slice, copy(own_efa, nodeName=own), dry_run="All")
    assert "may only write ResourceSlices of driver gpu.nvidia.com" in exc.body
    forbidden(as_gpu.replace_resource_slice, own_efa["metadata"]["name"], own_efa, dry_run="All")
    forbidden(as_gpu.delete_resource_slice, own_efa["metadata"]["name"], dry_run="All")
    # The Node: only its own readiness taint on its own node.
    as_gpu_core = client.CoreV1Api(as_gpu.api_client)
    taint = {"key": "dra.net/not-ready", "value": "true", "effect": "NoSchedule"}
    node = as_dict(as_gpu_core.read_node, own)
    forbidden(as_gpu_core.patch_node, own, {"spec": {"taints": [*node["spec"].get("taints", []), taint]}},
              dry_run="All")
    forbidden(as_gpu_core.patch_node, own, {"metadata": {"labels": {"eks-dra.io/gpu": "device-plugin"}}}, dry_run="All")
    forbidden(as_gpu_core.patch_node, other, {"spec": {"taints": []}}, dry_run="All")
    mine = {"key": "gpu.nvidia.com/not-ready", "value": "true", "effect": "NoSchedule"}
    with_mine = [*node["spec"].get("taints", []), mine]
    # ... and nothing else of its own Node: no owner, finalizer, pod CIDR, provider id, or a NoExecute taint.
    owner = {"apiVersion": "v1", "kind": "Namespace", "name": "default", "uid": node["metadata"]["uid"]}
    for patch in ({"metadata": {"ownerReferences": [owner]}}, {"metadata": {"finalizers": ["example.com/keep"]}},
                  {"spec": {"podCIDR": "10.244.99.0/24", "podCIDRs": ["10.244.99.0/24"]}},
                  {"spec": {"providerID": "aws:///us-east-2a/i-0forged"}},
                  {"spec": {"taints": [*node["spec"].get("taints", []), {**mine, "effect": "NoExecute"}]}},
                  {"spec": {"taints": with_mine}, "metadata": {"finalizers": ["example.com/keep"]}}):
        forbidden(as_gpu_core.patch_node, own, patch, dry_run="All")
    # spec.configSource: the API server drops it before admission (pkg/registry/core/node/strategy.go,
    # dropDisabledFields), so the patch changes nothing; the policy guards it all the same.
    source = {"configMap": {"name": "c", "namespace": "kube-system", "kubeletConfigKey": "kubelet"}}
    dropped = as_gpu_core.patch_node(own, {"spec": {"configSource": source}}, dry_run="All")
    assert dropped.spec.config_source is None
    as_gpu_core.patch_node(own, {"spec": {"taints": with_mine}}, dry_run="All")
    # Nothing changed for real.
    assert dev.slices_by_pool()[("gpu.nvidia.com", other)][0]["metadata"]["resourceVersion"] == \
        other_gpu["metadata"]["resourceVersion"]


@pytest.fixture(scope="module")
def samples(dev) -> list[dict]:
    """The dev sample pods that the simulated nodes can hold, once all of them run (the Job's two pods included)."""
    def all_created():
        names = [p["metadata"]["name"] for p in sample_pods(dev)]
        return len([n for n in names if n.startswith("gpu-job-")]) == 2 and PLACEABLE <= set(names)

    wait_until(all_created, 60, what="the sample pods and the Job's pods created")
    for pod in sample_pods(dev):
        wait_running(dev, SAMPLES_NAMESPACE, pod["metadata"]["name"], timeout=120)
    return sample_pods(dev)


def test_scheduler_allocates_samples_and_drivers_prepare_them(dev, samples):
    pods = samples
    assert len(pods) == len(PLACEABLE) + 2
    for pod in pods:
        check_prepared(dev, pod)
    for name in NOT_PLACEABLE:
        wait_until(lambda n=name: unschedulable(as_dict(dev.core.read_namespaced_pod, n, SAMPLES_NAMESPACE)), 60,
                   what=f"{name} reported unschedulable")  # fmt: skip

    by_name = {p["metadata"]["name"]: p for p in pods}
    # A shared claim: both pods on the claim's node, prepared once.
    shared = claim_of(dev, "shared-gpu-a")
    assert by_name["shared-gpu-a"]["spec"]["nodeName"] == by_name["shared-gpu-b"]["spec"]["nodeName"]
    node = dev.nodes[by_name["shared-gpu-a"]["spec"]["nodeName"]]
    assert len([e for e in node.kubelet.events("prepare") if not e["errors"]
                and shared["metadata"]["uid"] in [c["uid"] for c in e["claims"]]]) == 1
    # Prioritized list: the scheduler picks the node first, then the first sub-request that fits there:
    # an H100 on a p5 node, any GPU (an L40S) on the g6e node.
    results = claim_of(dev, "prioritized-gpu")["status"]["allocation"]["devices"]["results"]
    expected = {"p5.48xlarge": "gpu/h100-or-h200", "g6e.48xlarge": "gpu/any-gpu"}
    assert [r["request"] for r in results] == [expected[dev.nodes[results[0]["pool"]].instance_type]]
    # A GPU and the four EFAs of its PCIe root.
    results = claim_of(dev, "gpu-efa-root")["status"]["allocation"]["devices"]["results"]
    assert Counter(r["request"] for r in results) == {"gpu": 1, "efas": 4}
    # Neuron + EFA of one devicegroup4 on the trn2 node (constraint checked above), 4 + 4 devices.
    results = claim_of(dev, "neuron-efa-aligned")["status"]["allocation"]["devices"]["results"]
    assert Counter(r["request"] for r in results) == {"neurons": 4, "efas": 4}
    assert {r["pool"] for r in results} == {"dev-trn2-0"}

    # Opaque configuration: the time-slicing interval applied to the GPU (the fixture driver root's nvidia-smi) ...
    sliced = claim_of(dev, "time-sliced-a")
    node = dev.nodes[sliced["status"]["allocation"]["devices"]["results"][0]["pool"]]
    record = node.drivers["gpu"].checkpoint_claims()[sliced["metadata"]["uid"]]
    applied = record["settings"]["applied"]
    assert [d["timeSliceInterval"] for d in applied["devices"].values()] == ["Long"]
    # ... and the logical NeuronCore size in the Neuron claim's CDI spec (trn2: 8 physical cores per device).
    lnc = claim_of(dev, "neuron-lnc")
    spec = dev.nodes["dev-trn2-0"].cdi_specs()[f"k8s.neuron.aws.com-claim_{lnc['metadata']['uid']}.json"]
    env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
    assert env["NEURON_LOGICAL_NC_CONFIG"] == "2"
    ids = sorted(neuron_device_index(r["device"]) for r in lnc["status"]["allocation"]["devices"]["results"])
    assert env["NEURON_RT_VISIBLE_CORES"] == ",".join(f"{i * 4}-{i * 4 + 3}" for i in ids) or \
        env["NEURON_RT_VISIBLE_CORES"] == f"{ids[0] * 4}-{ids[-1] * 4 + 3}", env


def workload_keys(docs: list[dict]) -> tuple[set[str], list[tuple[str, str, re.Pattern]]]:
    """Named ResourceClaims, and (workload, pod claim name, pattern of the planner's claim name) per template use.
    The planner names a template's claim `<pod>-<podClaim>` and for a Job's i-th pod `<job>-<i>-<podClaim>`."""
    named, templated = set(), []
    for d in docs:
        if d["kind"] == "ResourceClaim":
            named.add(d["metadata"]["name"])
        spec = {"Pod": lambda x: x["spec"], "Job": lambda x: x["spec"]["template"]["spec"]}.get(d["kind"], None)
        if spec is None:
            continue
        name = d["metadata"]["name"]
        for c in spec(d).get("resourceClaims") or []:
            if c.get("resourceClaimTemplateName"):
                index = r"-\d+" if d["kind"] == "Job" else ""
                templated.append((name, c["name"], re.compile(f"{re.escape(name)}{index}-{re.escape(c['name'])}")))
    return named, templated


def scheduler_verdicts(dev: DevCluster, namespaces: list[str]) -> Counter:
    """(namespace, claim key) -> allocated?, for every claim of every pod, as the scheduler decided."""
    verdicts: dict[str, tuple] = {}
    for ns in namespaces:
        for pod in dev.pods(ns):
            workload = (pod["metadata"].get("labels") or {}).get("job-name") or pod["metadata"]["name"]
            for claim in dev.pod_claims(pod):
                meta = claim["metadata"]
                generated = (meta.get("annotations") or {}).get("resource.kubernetes.io/pod-claim-name")
                key = (ns, workload, generated) if generated else (ns, meta["name"])
                verdicts[meta["uid"]] = (key, bool(claim.get("status", {}).get("allocation")))
    return Counter(verdicts.values())


def test_planner_agrees_with_the_scheduler_on_published_slices(dev, tmp_path, samples):
    """`eks-dra plan --slices` on the real ResourceSlices gives every claim the scheduler's verdict."""
    # A claim no simulated node can hold: an L40S (g6e) and an EFA on its PCIe root; g6e's EFAs sit on other roots.
    unplaceable = [request("gpu", "gpu", selectors=["device.attributes['gpu.nvidia.com'].productName.contains('L40S')"]),
                   request("efa", "efa")]
    claim = extra_claim(dev, "g6e-gpu-efa-aligned", unplaceable,
                        [{"requests": ["gpu", "efa"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}])
    pod = extra_pod(dev, "g6e-gpu-efa-aligned", "g6e-gpu-efa-aligned")
    message = wait_until(lambda: unschedulable(as_dict(dev.core.read_namespaced_pod, "g6e-gpu-efa-aligned",
                                                       EXTRA_NAMESPACE)), 60, what="the g6e claim to be unschedulable")
    assert "cannot allocate all claims" in message or "resourceclaim" in message.lower(), message

    slices = tmp_path / "slices.yaml"
    slices.write_text(yaml.safe_dump_all(
        [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", **s} for s in dev.slices()]))
    extra = tmp_path / "extra.yaml"
    extra.write_text(yaml.safe_dump_all([claim, pod]))
    manifests = [p for p in dev.manifest_paths if "device-classes" in p.name or "dra-samples" in p.name]
    proc = subprocess.run([str(BIN / "eks-dra"), "plan", "--slices", str(slices), "--claims", *map(str, manifests),
                           str(extra), "--output", "json"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # 1: at least one claim is not allocated
    plan = json.loads(proc.stdout)["claims"]

    docs = load_documents([*manifests, extra])
    named, templated = workload_keys(docs)
    planned = Counter()
    for c in plan:
        if c["name"] in named:
            key = (c["namespace"], c["name"])
        else:
            key = next(((c["namespace"], w, pc) for w, pc, pattern in templated if pattern.fullmatch(c["name"])), None)
            assert key is not None, f"planner claim {c['name']} matches no workload"
        planned[(key, c["allocated"])] += 1
        if c["allocated"]:
            assert {d["pool"] for d in c["devices"]} == {c["node"]} and c["node"] in dev.nodes
    scheduled = scheduler_verdicts(dev, [SAMPLES_NAMESPACE, EXTRA_NAMESPACE])
    assert planned == scheduled
    assert planned[((EXTRA_NAMESPACE, "g6e-gpu-efa-aligned"), False)] == 1
    assert planned[((SAMPLES_NAMESPACE, "mig-1g-5gb", "devices"), False)] == 1
    assert sum(n for (_, allocated), n in planned.items() if allocated) == 9  # every placeable sample claim


def test_bad_opaque_config_fails_prepare_with_the_field_named(dev, samples):
    """The scheduler allocates (opaque parameters are the driver's business); the driver refuses to prepare a
    claim whose GpuConfig it cannot decode, names the field, and leaves no CDI spec or checkpoint entry."""
    config_entry = {"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Fast"}}}}}
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "bad-config", "namespace": EXTRA_NAMESPACE},
            "spec": {"devices": {"requests": [request("gpu", "gpu")], "config": [config_entry]}}}
    dev.resource.create_namespaced_resource_claim(EXTRA_NAMESPACE, body)
    extra_pod(dev, "bad-config", "bad-config", node="dev-g6e-0")

    def failed():
        pod = as_dict(dev.core.read_namespaced_pod, "bad-config", EXTRA_NAMESPACE)
        return next((e["error"] for e in prepared(pod).values() if e["error"]), None)

    error = wait_until(failed, 60, what="the prepare error of the bad-config claim")
    assert "timeSlicingConfig.interval" in error and "'Fast'" in error, error
    pod = as_dict(dev.core.read_namespaced_pod, "bad-config", EXTRA_NAMESPACE)
    assert pod["status"].get("phase") == "Pending"
    uid = as_dict(dev.resource.read_namespaced_resource_claim, "bad-config", EXTRA_NAMESPACE)["metadata"]["uid"]
    node = dev.nodes["dev-g6e-0"]
    assert not [name for name in node.cdi_specs() if uid in name]
    assert uid not in node.drivers["gpu"].checkpoint_claims()
    remove_extra(dev, "bad-config")


def node_state(dev: DevCluster, name: str) -> dict:
    """What must survive a restart: published devices per driver, CDI specs, checkpointed claims."""
    node = dev.nodes[name]
    devices = sorted(key for key in dev.devices() if key[1] == name)
    return {"devices": devices, "cdi": node.cdi_specs(),
            "checkpoints": {f: sorted(d.checkpoint_claims()) for f, d in node.drivers.items()}}


def running_samples(dev: DevCluster) -> dict[str, dict]:
    """Sample pod name -> prepared annotation; every placeable sample must still be Running."""
    pods = sample_pods(dev)
    assert all(pod_running(p) for p in pods), [p["metadata"]["name"] for p in pods if not pod_running(p)]
    return {p["metadata"]["name"]: prepared(p) for p in pods}


def test_driver_restarts_lose_nothing(dev, samples):
    """SIGTERM then start, and kill -9 then start: prepared claims stay prepared, slices stay, new pods prepare,
    and a pod created while its driver is down is prepared once the driver is back."""
    # the scheduler may put every sample on either p5 node: restart the drivers of the busier one
    name = max((n for n in dev.nodes if n.startswith("dev-p5-")),
               key=lambda n: sum(len(claims) for claims in node_state(dev, n)["checkpoints"].values()))
    node = dev.nodes[name]
    before, samples = node_state(dev, name), running_samples(dev)
    assert any(before["checkpoints"].values()), f"no sample claim landed on {name}; the test proves nothing"

    gpu, efa = node.drivers["gpu"], node.drivers["efa"]
    assert gpu.stop(signal.SIGTERM) == 0, gpu.log_tail()
    gpu.start()
    node.kubelet.wait_registered("gpu.nvidia.com", count=2)
    dev.wait_slices()
    assert node_state(dev, name) == before

    assert efa.stop(signal.SIGKILL) == -signal.SIGKILL
    constraint = [{"requests": ["gpu", "efa"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    extra_claim(dev, "while-efa-down", [request("gpu", "gpu"), request("efa", "efa")], constraint)
    extra_pod(dev, "while-efa-down", "while-efa-down", node=name)

    def prepare_failed():
        pod = as_dict(dev.core.read_namespaced_pod, "while-efa-down", EXTRA_NAMESPACE)
        return any(entry["error"] for entry in prepared(pod).values())

    wait_until(prepare_failed, 60, what="a failed prepare while the EFA driver is down")
    efa.start()
    node.kubelet.wait_registered("dra.net", count=2)
    pod = wait_running(dev, EXTRA_NAMESPACE, "while-efa-down", timeout=90)
    check_prepared(dev, pod)
    after = node_state(dev, name)
    assert after["devices"] == before["devices"]
    assert {k: v for k, v in after["cdi"].items() if k in before["cdi"]} == before["cdi"]
    for family, uids in before["checkpoints"].items():
        assert set(uids) <= set(after["checkpoints"][family])
    assert running_samples(dev) == samples
    remove_extra(dev, "while-efa-down")


def test_kubelet_restart_wipes_slices_and_drivers_republish(dev, samples):
    """The kubelet deletes its node's ResourceSlices when it starts; the running drivers register again and
    put their slices back, and what they prepared stays prepared."""
    name = "dev-p5-1"
    node = dev.nodes[name]
    before, samples = node_state(dev, name), running_samples(dev)
    old_slices = {s["metadata"]["uid"] for s in dev.slices() if s["spec"]["nodeName"] == name}
    node.kubelet.restart()  # "ready" means its slices were wiped
    for driver in node.drivers.values():
        node.kubelet.wait_registered(driver.driver_name, count=2)
    wait_until(lambda: node_state(dev, name)["devices"] == before["devices"], 60, interval=0.5,
               what=f"{name}'s slices republished after the kubelet restart")
    assert not old_slices & {s["metadata"]["uid"] for s in dev.slices() if s["spec"]["nodeName"] == name}
    assert node_state(dev, name) == before
    extra_claim(dev, "after-kubelet-restart", [request("gpu", "gpu"), request("efa", "efa", 4)],
                [{"requests": ["gpu", "efa"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}])
    extra_pod(dev, "after-kubelet-restart", "after-kubelet-restart", node=name)
    check_prepared(dev, wait_running(dev, EXTRA_NAMESPACE, "after-kubelet-restart"))
    assert running_samples(dev) == samples
    remove_extra(dev, "after-kubelet-restart")


def test_api_server_restart_keeps_slices_and_drivers_recover(dev, control_plane, samples):
    before = sorted(dev.devices())
    samples = running_samples(dev)
    control_plane.restart()
    assert sorted(dev.devices()) == before
    for node in dev.nodes.values():
        assert all(d.running for d in node.drivers.values()), {f: d.log_tail() for f, d in node.drivers.items()}
    # The drivers' slice watches resumed: a slice deleted behind a driver's back is put back.
    victim = dev.slices_by_pool()[("dra.net", "dev-g6e-0")][0]["metadata"]["name"]
    dev.resource.delete_resource_slice(victim)
    wait_until(lambda: sorted(dev.devices()) == before, 90, interval=0.5, what="the deleted slice republished")
    # Prepare still reaches the API server (claim lookups) after the restart.
    extra_claim(dev, "after-restart", [request("gpu", "gpu")])
    extra_pod(dev, "after-restart", "after-restart", node="dev-p5-1")
    check_prepared(dev, wait_running(dev, EXTRA_NAMESPACE, "after-restart"))
    assert running_samples(dev) == samples
    remove_extra(dev, "after-restart")


def test_deleting_the_pods_unprepares_everything(dev, samples):
    prepared_uids = {c["uid"] for node in dev.nodes.values() for e in node.kubelet.events("prepare")
                     if not e["errors"] for c in e["claims"]}
    assert len(prepared_uids) >= 9  # the sample claims, and those of the tests before
    batch = client.BatchV1Api(dev.api)
    batch.delete_namespaced_job("gpu-job", SAMPLES_NAMESPACE, propagation_policy="Background")
    for ns in (SAMPLES_NAMESPACE, EXTRA_NAMESPACE):
        dev.core.delete_collection_namespaced_pod(ns)
    wait_until(lambda: not dev.pods(SAMPLES_NAMESPACE) and not dev.pods(EXTRA_NAMESPACE), 120, interval=0.5,
               what="every sample and extra pod gone")

    unprepared = {c["uid"]: e["errors"] for node in dev.nodes.values() for e in node.kubelet.events("unprepare")
                  for c in e["claims"]}
    assert prepared_uids <= set(unprepared)  # (a claim whose prepare failed may be unprepared too: idempotent)
    assert not any(unprepared.values()), unprepared
    for node in dev.nodes.values():
        assert node.cdi_specs() == {}, node.name
        for family, driver in node.drivers.items():
            assert driver.checkpoint_claims() == {}, (node.name, family)
    # Named claims are kept but released; generated ones are garbage-collected with their pods.
    def released():
        claims = dev.claims(SAMPLES_NAMESPACE) + dev.claims(EXTRA_NAMESPACE)
        generated = [c for c in claims if c["metadata"].get("ownerReferences")]
        return not generated and all(not (c.get("status") or {}).get("reservedFor")
                                     and not (c.get("status") or {}).get("allocation") for c in claims)

    wait_until(released, 60, what="generated claims deleted, named claims released and deallocated")


# --- the corpus of the EKS guide and the vendors' docs (tests/corpus) --------------------------------------

CORPUS = REPO / "tests" / "corpus"
# The tier's simulated nodes (DEV_NODES) include no MIG node: those documents are planned on dev's p4d-mig
# group by tests/test_corpus.py only.
CORPUS_NEEDS_MIG_NODE = {"eks-mig-profile-any.yaml", "eks-mig-profile-1g.5gb.yaml", "eks-mig-multi-mig.yaml",
                         "nvidia-demo-gpu-test4.yaml"}


def _corpus_objects(path: Path, namespace: str) -> tuple[str, list[dict], list[dict], dict[str, list[str]]]:
    """(namespace, the file's objects, implicit pods, pod name -> its planner claim names). Objects are put in
    `namespace` where they name none (as `kubectl apply -n` does); an implicit pod (the planner's) holds each
    claim or template no pod of the file uses, and runs on its own, as the planner plans it on its own."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    own_namespaces = [d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"]
    ns = own_namespaces[0] if own_namespaces else namespace
    objects = [] if own_namespaces else [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}]
    pods: dict[str, list[str]] = {}
    used: set[str] = set()
    for d in docs:
        if d["kind"] != "Namespace":
            d["metadata"].setdefault("namespace", ns)
        objects.append(d)
        spec = d["spec"] if d["kind"] == "Pod" else (d["spec"]["template"]["spec"] if d["kind"] == "Deployment"
                                                     else None)
        for entry in (spec or {}).get("resourceClaims") or []:
            used.add(entry.get("resourceClaimName") or entry.get("resourceClaimTemplateName"))
            if d["kind"] == "Pod":
                pods.setdefault(d["metadata"]["name"], []).append(
                    entry.get("resourceClaimName") or f"{d['metadata']['name']}-{entry['name']}")
    implicit = []
    for d in docs:
        if d["kind"] in ("ResourceClaim", "ResourceClaimTemplate") and d["metadata"]["name"] not in used:
            name, ref = d["metadata"]["name"], ("resourceClaimName" if d["kind"] == "ResourceClaim"
                                               else "resourceClaimTemplateName")
            implicit.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"implicit-{name}",
                                                                            "namespace": ns},
                             "spec": {"tolerations": ACCELERATOR_TOLERATIONS, "terminationGracePeriodSeconds": 0,
                                      "resourceClaims": [{"name": "devices", ref: name}],
                                      "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                                      "resources": {"claims": [{"name": "devices"}]}}]}})
            pods[f"implicit-{name}"] = [name]
    return ns, objects, implicit, pods


def not_scheduled(pod: dict) -> str | None:
    """Why the scheduler did not place the pod: Unschedulable, or SchedulerError (an allocator error such as
    a claim over the 32-device limit)."""
    for c in pod.get("status", {}).get("conditions") or []:
        if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") in ("Unschedulable",
                                                                                          "SchedulerError"):
            return f"{c['reason']}: {c.get('message') or ''}"
    return None


def _settled(dev: DevCluster, ns: str, names: set[str] | None = None) -> dict[str, tuple[dict, str]] | None:
    """Pod name -> (pod, running | refused: <prepare error> | unschedulable: <why>), once every pod is one."""
    out = {}
    for pod in dev.pods(ns):
        if names is not None and pod["metadata"]["name"] not in names:
            continue
        errors = [e["error"] for e in prepared(pod).values() if e["error"]]
        state = "running" if pod_running(pod) else ("refused: " + errors[0]) if errors else \
            ("unschedulable: " + not_scheduled(pod)) if not_scheduled(pod) else None
        if state is None:
            return None
        out[pod["metadata"]["name"]] = (pod, state)
    return out or None


def test_corpus_claims_run_on_our_drivers(dev):
    """Every corpus claim that `eks-dra plan -c env=dev` allocates is allocated by the real scheduler on our
    drivers' slices and prepared by our drivers (one file, and one implicit pod, at a time, on the emptied
    nodes); the ones it does not allocate are refused by the scheduler, or (opaque configs) by our driver's
    prepare with the plan's text."""
    from test_corpus import EXPECTED  # tests/ is on sys.path (rootdir conftest)

    assert not dev.pods(SAMPLES_NAMESPACE) and not dev.pods(EXTRA_NAMESPACE)  # the test before emptied the nodes
    ran = 0

    def check(name: str, pod_name: str, pod: dict, state: str, claim_names: list[str]) -> int:
        expected = EXPECTED[name]
        # A Deployment's pods (their planner claim names are not known here) share the file's verdict.
        reasons = [expected.get(c) for c in claim_names] or list(expected.values())
        if all(r is None for r in reasons):
            assert state == "running", (name, pod_name, state)
            check_prepared(dev, pod)
            return 1
        if any(r and r.startswith("prepare would fail: ") for r in reasons):
            text = next(r for r in reasons if r).split("spec.devices.config", 1)[1]
            assert state.startswith("refused: ") and text.split(".", 1)[1] in state, (name, pod_name, state)
        else:
            assert state.startswith("unschedulable: "), (name, pod_name, state)
        return 0

    for index, name in enumerate(sorted(set(EXPECTED) - CORPUS_NEEDS_MIG_NODE)):
        ns, objects, implicit, pods = _corpus_objects(CORPUS / name, f"corpus-{index}")
        apply_objects(dev.api, objects)
        if any(o["kind"] in ("Pod", "Deployment") for o in objects):
            outcome = wait_until(lambda ns=ns: _settled(dev, ns), 90, interval=0.5,
                                 what=f"{name}: every pod running or refused")
            ran += sum(check(name, p, pod, state, pods.get(p, [])) for p, (pod, state) in outcome.items())
        for pod_body in implicit:
            pod_name = pod_body["metadata"]["name"]
            dev.core.create_namespaced_pod(ns, pod_body)
            outcome = wait_until(lambda ns=ns, n=pod_name: _settled(dev, ns, {n}), 90, interval=0.5,
                                 what=f"{name}: {pod_name} running or refused")
            ran += check(name, pod_name, *outcome[pod_name], pods[pod_name])
            dev.core.delete_namespaced_pod(pod_name, ns, grace_period_seconds=0)
            wait_until(lambda ns=ns, n=pod_name: n not in {p["metadata"]["name"] for p in dev.pods(ns)}, 90,
                       interval=0.5, what=f"{name}: {pod_name} gone")
        dev.core.delete_namespace(ns)
        wait_until(lambda ns=ns: not dev.pods(ns), 90, interval=0.5, what=f"{name}: pods gone")
        # Until its claims are gone the scheduler still counts their devices allocated (the next files need them).
        wait_until(lambda ns=ns: not dev.claims(ns), 90, interval=0.5, what=f"{name}: claims gone")
    assert ran >= 16  # every allocatable claim of the non-MIG corpus ran
    for node in dev.nodes.values():
        wait_until(lambda n=node: n.cdi_specs() == {}, 60, what=f"{node.name}: every corpus claim unprepared")
