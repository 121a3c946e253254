"""A hostile tenant elsewhere in the cluster cannot stop a driver's recovery (real control plane).

A ResourceClaim in another namespace with an opaque config nested 3,000 levels deep (for an unrelated driver)
is stored by the API server as given; Python's json decoder gives up at its recursion limit. A driver that
lost its checkpoint must still rebuild its state, run its reconcile passes and release the device of a claim
deleted while it was down: it reads only its own claims (by the names its CDI specs record) and the claims
of its node's pods, never the cluster's claim list.
"""

from __future__ import annotations

import time

import pytest
from controlplane import wait_until
from ff_helpers import (
    DRIVERS,
    claim_template,
    create_pod,
    ensure_device_class,
    make_namespace,
    node_events,
    raw,
    record_figure,
    wait_devices,
    wait_registered,
    wait_running,
)
from kubernetes import client

from eks_dra.drivers.framework.checkpoint import CheckpointStore

pytestmark = pytest.mark.e2e
GPU = DRIVERS["gpu"]
DEPTH = 3000


def create_deep_claim(api: client.ApiClient, namespace: str, name: str) -> None:
    """POST the claim as raw bytes: the Python client's own encoder cannot write such an object either."""
    nested = "[" * DEPTH + "]" * DEPTH
    body = (f'{{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {{"name": "{name}"}}, '
            f'"spec": {{"devices": {{"requests": [{{"name": "r", "exactly": {{"deviceClassName": "other"}}}}], '
            f'"config": [{{"opaque": {{"driver": "other.example.com", "parameters": {{"x": {nested}}}}}}}]}}}}}}')
    resp = api.rest_client.pool_manager.request(
        "POST", f"{api.configuration.host}/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims",
        body=body.encode(), headers={"Content-Type": "application/json", "Accept": "application/json"})
    assert resp.status == 201, resp.data[:300]


def checkpoint(node):
    return CheckpointStore(node.state_dir("gpu"), GPU, node.name).load().claims


def test_deep_claim_elsewhere_does_not_stop_recovery_after_a_lost_checkpoint(api, nodes):
    node = nodes.node("hr", "p5.48xlarge")
    drv = node.start_driver("gpu")
    wait_registered(node, drv)
    wait_devices(api, node, drv, 8)
    ns = make_namespace(api, "hr")
    dc = ensure_device_class(api, GPU)
    template = claim_template(api, ns, "one-gpu", dc)
    for name in ("kept", "gone"):
        create_pod(api, ns, name, node.name, template)
    pods = {name: wait_running(api, ns, name, 90) for name in ("kept", "gone")}
    (kept,) = (c["resourceClaimName"] for c in pods["kept"]["status"]["resourceClaimStatuses"])
    (gone,) = (c["resourceClaimName"] for c in pods["gone"]["status"]["resourceClaimStatuses"])
    resource = client.ResourceV1Api(api)
    kept_uid = raw(resource.read_namespaced_resource_claim, kept, ns)["metadata"]["uid"]
    gone_uid = raw(resource.read_namespaced_resource_claim, gone, ns)["metadata"]["uid"]
    tenant = make_namespace(api, "hr-tenant")
    create_deep_claim(api, tenant, "deep")

    drv.terminate()
    node.kubelet.stop()  # plugin and kubelet down: the pod and its claim go away meanwhile
    client.CoreV1Api(api).delete_namespaced_pod("gone", ns, grace_period_seconds=0)
    wait_until(lambda: gone not in {c["metadata"]["name"] for c in
                                    raw(resource.list_namespaced_resource_claim, ns)["items"]}, 60,
               what="the deleted pod's claim deleted by the resourceclaim controller")
    (node.state_dir("gpu") / "checkpoint.json").unlink()  # the checkpoint is lost

    t0 = time.monotonic()
    drv2 = node.start_driver("gpu", "--reconcile-interval", "2")
    rebuilt = wait_until(lambda: node_events(api, node.name, "StateRebuilt"), 60, interval=0.2,
                         what=f"StateRebuilt Event; driver log:\n{drv2.log_tail()}")
    took = time.monotonic() - t0
    assert "1 prepared claims after rebuild (1 completed from the API" in rebuilt[0]["message"]
    claims = checkpoint(node)
    assert set(claims) == {kept_uid} and not claims[kept_uid].incomplete and claims[kept_uid].name == kept
    assert gone_uid not in node.cdi_specs("gpu")
    runs = drv2.metric("eks_dra_reconcile_runs_total")
    wait_until(lambda: drv2.metric("eks_dra_reconcile_runs_total") >= runs + 2, 20, interval=0.2,
               what="two more reconcile passes")
    log = drv2.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "RecursionError" not in log and "reconcile pass" not in log

    node.kubelet.start()
    wait_registered(node, drv2, count=2)
    create_pod(api, ns, "rest", node.name, claim_template(api, ns, "seven-gpus", dc, count=7))
    rest = wait_running(api, ns, "rest", 90)  # every GPU but the kept claim's: the deleted claim's is free
    assert rest["status"]["phase"] == "Running"
    record_figure("hostile-claim-recovery", depth=DEPTH, rebuilt_s=round(took, 3))
