"""Hostile or broken API objects elsewhere in the cluster, and a stalled API: the driver's recovery, reconcile
passes and prepares go on; each bad object is one error naming it."""

from __future__ import annotations

import json
import time

import grpc
import pytest
from drivers.harness import DRIVERS, Sandbox, kubelet_for, make_claim, prepare_claim, registration_socket, wait_for
from drivers.kubelet import Kubelet

from eks_dra.drivers.framework import cdi
from eks_dra.drivers.framework.kube import POD_PAGE, KubeApi, MalformedObject, api_client

GPU = DRIVERS["gpu"]
DEPTH = 3000  # Python's json decoder stops at its recursion limit (1000)


def deep_claim(namespace: str, name: str) -> bytes:
    """An unallocated claim for an unrelated driver whose opaque config is nested DEPTH levels deep (~6 KB)."""
    nested = "[" * DEPTH + "]" * DEPTH
    return (f'{{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {{"name": "{name}", '
            f'"namespace": "{namespace}", "uid": "0d0d0d0d-0000-4000-8000-000000000001"}}, "spec": {{"devices": '
            f'{{"requests": [{{"name": "r", "exactly": {{"deviceClassName": "other"}}}}], "config": [{{"opaque": '
            f'{{"driver": "other.example.com", "parameters": {{"x": {nested}}}}}}}]}}}}}}').encode()


@pytest.fixture
def node_env():
    box = Sandbox()
    node = box.node(directory="a")
    yield box.kube, node, lambda **kw: box.start(node, "gpu", **kw)
    box.close()


def spec_path(node, uid):
    return node.cdi / f"k8s.{GPU}-claim_{uid}.json"


def lose_checkpoint(driver) -> None:
    driver.stop(0.5)
    driver.store.path.unlink()


def test_a_claim_nested_too_deep_is_one_error_naming_it(node_env):
    kube, node, _ = node_env
    kube.put_raw_claim("tenant", "deep", deep_claim("tenant", "deep"))
    api = KubeApi(api_client(str(kube.write_kubeconfig(node.base / "kc"))))
    with pytest.raises(MalformedObject) as err:
        api.get_claim("tenant", "deep")
    message = str(err.value)
    assert "/namespaces/tenant/resourceclaims/deep" in message and "nested deeper" in message
    assert "\n" not in message and err.value.status == 200


def test_hostile_claim_elsewhere_does_not_stop_recovery(node_env):
    """A deep claim in another namespace; a lost checkpoint; a claim deleted meanwhile: the rebuild finishes,
    every pass succeeds, the deleted claim's GPU is free again, and the cluster's claims are never listed."""
    kube, node, start = node_env
    d = start()
    kept = prepare_claim(kube, node, "gpu", ["gpu-0"])
    gone = prepare_claim(kube, node, "gpu", ["gpu-1"])
    lose_checkpoint(d)
    kube.delete_claim("default", gone["metadata"]["name"])
    kube.put_raw_claim("tenant", "deep", deep_claim("tenant", "deep"))
    d2 = start()
    wait_for(lambda: any(r == "StateRebuilt" for _, r, _ in d2.events.sent), timeout=15, what="rebuild finished")
    cp = d2.store.load()
    assert set(cp.claims) == {kept["metadata"]["uid"]}
    rec = cp.claims[kept["metadata"]["uid"]]
    assert not rec.incomplete and (rec.namespace, rec.name) == ("default", kept["metadata"]["name"])
    assert not spec_path(node, gone["metadata"]["uid"]).exists()
    passes = d2.reconciler.passes
    wait_for(lambda: d2.reconciler.passes >= passes + 2, timeout=10, what="two more reconcile passes")
    prepare_claim(kube, node, "gpu", ["gpu-1"])  # the deleted claim's device is released
    assert kube.claim_lists == 0


def test_an_unreadable_claim_of_a_pod_here_does_not_stop_the_others(node_env):
    """After a lost checkpoint the claims of this node's pods are read one by one: the unreadable one is
    skipped, the one in use without a spec is still reserved."""
    kube, node, start = node_env
    d = start()
    lose_checkpoint(d)
    kube.put_raw_claim("tenant", "deep", deep_claim("tenant", "deep"))
    kube.add_pod("tenant", "hostile", node.name, ["deep"])
    in_use = kube.put_claim(make_claim(GPU, node.name, ["gpu-2"]))  # no spec: reserved, not prepared
    spec_path(node, "0b0b0b0b-0000-4000-8000-000000000009").write_text("{}")  # a spec, so this is a rebuild
    d2 = start()
    wait_for(lambda: any(r == "StateRebuilt" for _, r, _ in d2.events.sent), timeout=15, what="rebuild finished")
    rec = d2.store.load().claims[in_use["metadata"]["uid"]]
    assert not rec.completed and [x.device_name for x in rec.devices] == ["gpu-2"]
    passes = d2.reconciler.passes
    wait_for(lambda: d2.reconciler.passes >= passes + 2, timeout=10, what="two more reconcile passes")
    assert kube.claim_lists == 0


def test_spec_names_its_claim_and_stays_valid_cdi(node_env):
    kube, node, start = node_env
    start()
    claim = prepare_claim(kube, node, "gpu", ["gpu-3"], namespace="team-a", name="train")
    spec = json.loads(spec_path(node, claim["metadata"]["uid"]).read_text())
    assert spec["annotations"] == {cdi.CLAIM_NAMESPACE_ANNOTATION: "team-a", cdi.CLAIM_NAME_ANNOTATION: "train"}
    assert spec["cdiVersion"] == "0.6.0"  # annotations need CDI 0.6.0 (container-device-interface SPEC.md)
    assert cdi.claim_of(spec) == ("team-a", "train")


def test_older_specs_without_names_recover_from_the_pods_here(node_env):
    """Specs of the previous driver version name no claim: a claim a pod here uses (named in the pod's status,
    as a claim made from a template is) is found through the node's pods; one no pod here uses is released."""
    kube, node, start = node_env
    d = start()
    used = prepare_claim(kube, node, "gpu", ["gpu-4"], reserved=False)
    unused = prepare_claim(kube, node, "gpu", ["gpu-5"], reserved=False)
    for _ in range(POD_PAGE):  # the pod that uses it is on the second page of the node's pods
        kube.add_pod("default", f"filler-{_}", node.name, [])
    kube.add_pod("default", "worker", node.name, [used["metadata"]["name"]], from_template=True)
    kube.add_pod("default", "elsewhere", "node-b", [unused["metadata"]["name"]])
    lose_checkpoint(d)
    for c in (used, unused):
        path = spec_path(node, c["metadata"]["uid"])
        spec = json.loads(path.read_text())
        del spec["annotations"]
        path.write_text(json.dumps(spec))
    d2 = start()
    wait_for(lambda: any(r == "StateRebuilt" for _, r, _ in d2.events.sent), timeout=15, what="rebuild finished")
    cp = d2.store.load()
    assert set(cp.claims) == {used["metadata"]["uid"]}
    rec = cp.claims[used["metadata"]["uid"]]
    assert not rec.incomplete and rec.name == used["metadata"]["name"]
    assert not spec_path(node, unused["metadata"]["uid"]).exists()
    assert any("no pod on this node uses" in m for _, r, m in d2.events.sent if r == "OrphanCleaned")
    assert kube.claim_lists == 0


def test_pod_claim_names_pages_and_dedupes(node_env):
    kube, node, _ = node_env
    for i in range(2 * POD_PAGE + 5):
        kube.add_pod("ns", f"p{i}", node.name, [f"claim-{i % 7}"], from_template=i % 2 == 0)
    kube.add_pod("ns", "other-node", "node-b", ["not-mine"])
    api = KubeApi(api_client(str(kube.write_kubeconfig(node.base / "kc"))))
    before = kube.requests[("GET", "/api/v1")]
    assert sorted(api.pod_claim_names(node.name)) == [("ns", f"claim-{i}") for i in range(7)]
    assert kube.requests[("GET", "/api/v1")] - before == 3


def _prepare_timed(node, claims, timeout_s):
    k = Kubelet(registration_socket(node, "gpu"), timeout=timeout_s)
    try:
        t0 = time.monotonic()
        out = k.prepare(claims)
        return out, time.monotonic() - t0
    finally:
        k.close()


def test_claims_of_one_call_are_read_in_parallel(node_env):
    """Four claims, each read taking 2 s, in a 5 s kubelet call: all prepared (one after another: 8 s)."""
    kube, node, start = node_env
    start()
    kubelet_for(node, "gpu").close()
    claims = [kube.put_claim(make_claim(GPU, node.name, [f"gpu-{i}"])) for i in range(4)]
    for c in claims:
        kube.claim_delay_s[c["metadata"]["name"]] = 2.0
    out, took = _prepare_timed(node, claims, 5.0)
    assert {uid: e.error for uid, e in out.items()} == {c["metadata"]["uid"]: "" for c in claims}
    assert took < 4.5


def test_a_claim_read_past_the_deadline_gets_its_own_error(node_env):
    kube, node, start = node_env
    start()
    kubelet_for(node, "gpu").close()
    claims = [kube.put_claim(make_claim(GPU, node.name, [f"gpu-{i}"])) for i in range(3)]
    slow = claims[1]
    kube.claim_delay_s[slow["metadata"]["name"]] = 8.0
    try:
        out, took = _prepare_timed(node, claims, 3.0)
    except grpc.RpcError as exc:
        pytest.fail(f"the whole call failed: {exc.code()}")
    assert took < 3.0
    assert out[claims[0]["metadata"]["uid"]].error == "" and out[claims[2]["metadata"]["uid"]].error == ""
    error = out[slow["metadata"]["uid"]].error
    assert slow["metadata"]["name"] in error and slow["metadata"]["uid"] in error
    assert not out[slow["metadata"]["uid"]].devices
