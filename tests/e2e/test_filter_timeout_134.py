"""The 1.34 scheduler's DRA filter timeout on the real kube-scheduler, against `eks-dra plan`'s prediction.

Each case of tests/test_planner_filter_timeout.py (hand-worked there) runs on its own node with its own
driver and DeviceClass: the scheduler either allocates the claim (the results must be the planner's and the
case's) or reports "timed out trying to allocate devices" (the planner must refuse with the filter timeout).
The cases that time out and share a claim run as one pod over their nodes, which the scheduler filters in
parallel: two pods, 10 s each; the other cases end within the 1.34 walk's ~3 s.
"""

from __future__ import annotations

import pytest
from controlplane import TIER_VERSION, wait_until
from kubernetes import client, config
from test_control_plane import as_dict, make_namespace, make_ready_node, unique
from test_planner_filter_timeout import CASES, Case, materialize, plan_objects

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(TIER_VERSION != "1.34", reason="the 1.34 allocator's walk")]

TIMED_OUT = "timed out trying to allocate devices"


@pytest.fixture(scope="module")
def cluster(control_plane):
    api = config.new_client_from_config(str(control_plane.kubeconfig))
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    ns = make_namespace(core, unique("e2e-timeout"))
    yield core, resource, ns
    core.delete_namespace(ns)


def scheduled(core, resource, ns: str, name: str) -> tuple[tuple[tuple[str, str], ...] | None, str]:
    """The claim's (request, device) results once allocated, or None and the pod's unschedulable message."""
    def outcome():
        claim = as_dict(resource.read_namespaced_resource_claim, name, ns)
        allocation = (claim.get("status") or {}).get("allocation")
        if allocation:
            return tuple((r["request"], r["device"]) for r in allocation["devices"]["results"]), ""
        pod = as_dict(core.read_namespaced_pod, name, ns)
        for c in pod.get("status", {}).get("conditions") or []:
            if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("message"):
                return None, c["message"]
        return None

    return wait_until(outcome, 60, interval=0.1, what=f"{name}: allocated or unschedulable")


def run_pod(cluster, name: str, cases: list[Case]) -> tuple[tuple | None, str, list[tuple]]:
    """One pod with the cases' claim (the first case's: they share it), allowed on one new node per case with
    its slice (one driver and DeviceClass for all); the scheduler's outcome and each case's (DeviceClass,
    ResourceSlice, ResourceClaim) as created."""
    core, resource, ns = cluster
    driver, device_class = f"{unique('timeout')}.e2e.example.com", unique("timeout")
    created = [materialize(case, driver, device_class, unique("node-timeout")) for case in cases]
    resource.create_device_class(created[0][0])
    for _, slice_, _ in created:
        make_ready_node(core, slice_["spec"]["nodeName"])
        resource.create_resource_slice(slice_)
    resource.create_namespaced_resource_claim(ns, {**created[0][2], "metadata": {"name": name}})
    nodes = [slice_["spec"]["nodeName"] for _, slice_, _ in created]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}]}}}
    core.create_namespaced_pod(ns, {
        "metadata": {"name": name},
        "spec": {"affinity": affinity, "terminationGracePeriodSeconds": 0,
                 "resourceClaims": [{"name": "devices", "resourceClaimName": name}],
                 "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                 "resources": {"claims": [{"name": "devices"}]}}]}})
    try:
        got, message = scheduled(core, resource, ns, name)
    finally:
        # A pod that timed out is retried, and each retry holds the scheduler for 10 s.
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    return got, message, created


def planner_verdict(tmp_path, klass: dict, slice_: dict, claim: dict, name: str):
    found = next(c for c in plan_objects(tmp_path, [klass, claim], [slice_]).claims if c.name == name)
    return (tuple((d.request, d.device) for d in found.devices) if found.allocated else None), found.reason or ""


FAST = [c for c in CASES if c.allocated is not None]
# The cases that time out, by claim: each claim's nodes are filtered in parallel, one 10 s for all of them.
TIMEOUTS: dict[str, list[Case]] = {}
for _case in CASES:
    if _case.allocated is None:
        TIMEOUTS.setdefault(repr((_case.requests, _case.constraints)), []).append(_case)


@pytest.mark.parametrize("case", FAST, ids=[c.name for c in FAST])
def test_the_planner_agrees_where_the_1_34_scheduler_allocates(cluster, tmp_path, case):
    got, message, [(klass, slice_, claim)] = run_pod(cluster, case.name, [case])
    planned, reason = planner_verdict(tmp_path, klass, slice_, claim, case.name)
    assert got == planned == case.allocated, (message, reason)


@pytest.mark.parametrize("cases", list(TIMEOUTS.values()), ids=["+".join(c.name for c in v) for v in TIMEOUTS.values()])
def test_the_planner_agrees_where_the_1_34_scheduler_times_out(cluster, tmp_path, cases):
    got, message, created = run_pod(cluster, unique("timeouts"), cases)
    assert got is None and f"{len(cases)} {TIMED_OUT}" in message, message
    for case, (klass, slice_, claim) in zip(cases, created, strict=True):
        planned, reason = planner_verdict(tmp_path, klass, slice_, claim, case.name)
        node = slice_["spec"]["nodeName"]
        assert planned is None and f"never scheduled on node {node}" in reason and "filter timeout" in reason, \
            (case.name, reason)
