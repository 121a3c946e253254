"""The 1.34 scheduler's DRA filter timeout on the real kube-scheduler, against `eks-dra plan`'s prediction.

Each case of tests/test_planner_filter_timeout.py (hand-worked there) runs on its own node with its own
driver and DeviceClass: the scheduler either allocates the claim (the results must be the planner's and the
case's) or reports "timed out trying to allocate devices" (the planner must refuse with the filter timeout).
The two timeout cases take the scheduler's 10 s each; the others end within the 1.34 walk's ~2 s.
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


def scheduled(core, resource, ns: str, case: Case) -> tuple[tuple[tuple[str, str], ...] | None, str]:
    """The claim's (request, device) results once allocated, or None and the pod's unschedulable message."""
    def outcome():
        claim = as_dict(resource.read_namespaced_resource_claim, case.name, ns)
        allocation = (claim.get("status") or {}).get("allocation")
        if allocation:
            return tuple((r["request"], r["device"]) for r in allocation["devices"]["results"]), ""
        pod = as_dict(core.read_namespaced_pod, case.name, ns)
        for c in pod.get("status", {}).get("conditions") or []:
            if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("message"):
                return None, c["message"]
        return None

    return wait_until(outcome, 60, interval=0.1, what=f"{case.name}: allocated or unschedulable")


# The fast cases first: a pod that times out is retried, and each retry holds the scheduler for 10 s.
ORDERED = sorted(CASES, key=lambda c: c.allocated is None)


@pytest.mark.parametrize("case", ORDERED, ids=[c.name for c in ORDERED])
def test_the_planner_agrees_with_the_1_34_scheduler(cluster, tmp_path, case):
    core, resource, ns = cluster
    node, driver, device_class = unique("node-timeout"), f"{unique('timeout')}.e2e.example.com", unique("timeout")
    klass, slice_, claim = materialize(case, driver, device_class, node)
    make_ready_node(core, node)
    resource.create_device_class(klass)
    resource.create_resource_slice(slice_)
    resource.create_namespaced_resource_claim(ns, {**claim, "metadata": {"name": case.name}})
    core.create_namespaced_pod(ns, {
        "metadata": {"name": case.name},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 0,
                 "resourceClaims": [{"name": "devices", "resourceClaimName": case.name}],
                 "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                 "resources": {"claims": [{"name": "devices"}]}}]}})
    try:
        got, message = scheduled(core, resource, ns, case)
    finally:
        core.delete_namespaced_pod(case.name, ns, grace_period_seconds=0)

    planned = plan_objects(tmp_path, [klass, claim], [slice_])
    found = next(c for c in planned.claims if c.name == case.name)
    planned_results = tuple((d.request, d.device) for d in found.devices) if found.allocated else None
    assert got == planned_results == case.allocated, (message, found.reason)
    if case.allocated is None:
        assert TIMED_OUT in message, message
        assert f"never scheduled on node {node}" in found.reason and "filter timeout" in found.reason, found.reason
