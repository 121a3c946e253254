"""Issue 6 §3: the dev environment's manifests, our drivers and its samples on a real Kubernetes 1.34 control plane.

One module-scoped cluster: the synthesized dev manifests applied by server-side apply, four simulated nodes
(2x p5.48xlarge, trn2.48xlarge, g6e.48xlarge) registered with their node-group labels and taints, a kubelet
stand-in and our driver processes per node (as their charts' ServiceAccounts, tokens bound to the node).
The tests run in file order and build on each other: samples run, drivers and the API server restart under
them, the planner is compared with the scheduler, and finally everything is unprepared.
"""

from __future__ import annotations

from collections import Counter

import pytest
from helpers import (
    DevCluster,
    as_dict,
)
from kubernetes import client

pytestmark = pytest.mark.e2e

# Samples of dev that no simulated node can hold: MIG (no p4d node) and the device-plugin pods (no plugin).
NOT_PLACEABLE = {"mig-1g-5gb", "device-plugin-gpu", "device-plugin-efa"}


@pytest.fixture(scope="module")
def dev(control_plane, e2e_binary, tmp_path_factory):
    cluster = DevCluster(control_plane, e2e_binary, tmp_path_factory.mktemp("dev-env"))
    try:
        cluster.apply_manifests()
        cluster.create_nodes()
        cluster.start_nodes()
        cluster.wait_drivers_ready()
        yield cluster
    finally:
        cluster.stop()


def test_dev_manifests_are_accepted(dev):
    kinds = Counter(o["kind"] for o in dev.applied)
    # Every object of every chart went through the API server's validation (CEL of the VAPs included).
    assert kinds["ValidatingAdmissionPolicy"] == 6 and kinds["ValidatingAdmissionPolicyBinding"] == 6
    assert kinds["DeviceClass"] >= 4 and kinds["ResourceClaimTemplate"] >= 5 and kinds["DaemonSet"] >= 3
    adm = client.AdmissionregistrationV1Api(dev.api)
    for policy in as_dict(adm.list_validating_admission_policy)["items"]:
        if policy["metadata"]["name"].startswith("eks-dra-"):
            # Type-checking of the CEL expressions against the matched resources found nothing to warn about.
            assert not (policy.get("status", {}).get("typeChecking") or {}).get("expressionWarnings"), policy


def test_drivers_publish_the_simulated_devices_and_untaint(dev):
    from eks_dra.catalog import get_instance_type
    from eks_dra.devices import simulate_node

    devices = dev.devices()
    for node in dev.nodes.values():
        expected = simulate_node(get_instance_type(node.instance_type), node.name)
        for family in node.families:
            published = sorted(name for (drv, pool, name) in devices if drv == f"{family}.eks-dra.io" and pool == node.name)
            assert published == sorted(d.name for d in expected[family]), (node.name, family)
        taints = as_dict(dev.core.read_node, node.name)["spec"].get("taints") or []
        # The drivers removed their own readiness taints; the accelerator taint stays.
        assert [t["key"] for t in taints] == [t["key"] for t in node.taints if not t["key"].endswith("/not-ready")]
        for s in dev.slices():
            if s["spec"]["nodeName"] == node.name:
                assert s["metadata"]["ownerReferences"][0]["kind"] == "Node"
