"""Every CEL expression the charts ship compiles and evaluates: device selectors against the devices the
catalog simulates for the environment, and the admission policies against admission requests."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import cel
import kubernetes_validate
import pytest
from charts.cel_device import Selector
from charts.environments import ALL, dra_devices, environment, synthesized
from charts.k8s_objects import of_kind, selectors_of_claim

from eks_dra.charts.driver_chart import NODE_METADATA_FIELDS, NODE_SPEC_FIELDS
from eks_dra.devices import simulate_node

# What the vendor charts' DeviceClasses select (reference eks-accelerators.md §3.3-§3.6).
UPSTREAM_CLASSES = {
    "gpu.nvidia.com": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
    "mig.nvidia.com": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
    # aws/eks-charts stable/aws-dranet/templates/deviceclass.yaml @ 79203dcc, verbatim
    "efa.networking.k8s.aws": "device.driver == \"dra.net\" &&\ndevice.attributes[\"dra.net\"].pciDevice == 'Elastic Fabric Adapter (EFA)'\n",
    "neuron.aws.com": "device.driver == 'neuron.aws.com'",
}


def _class_selectors(docs) -> dict[str, list[Selector]]:
    classes = {name: [Selector(expr)] for name, expr in UPSTREAM_CLASSES.items()}
    for dc in of_kind(docs, "DeviceClass"):
        classes[dc["metadata"]["name"]] = [Selector(s["cel"]["expression"]) for s in dc["spec"]["selectors"]]
    return classes


def _claims(docs) -> list[tuple[str, dict]]:
    out = [(c["metadata"]["name"], c["spec"]) for c in of_kind(docs, "ResourceClaim")]
    out += [(t["metadata"]["name"], t["spec"]["spec"]) for t in of_kind(docs, "ResourceClaimTemplate")]
    return out


def _matching(selectors: list[Selector], devices) -> list[str]:
    return [d.name for driver, d in devices if all(s.matches(driver, d) for s in selectors)]


@pytest.mark.parametrize("key", ALL)
def test_device_classes_compile_and_each_matches_a_device(key: str) -> None:
    env = environment(key)
    _, docs = synthesized(key)
    devices = [dev for devs in dra_devices(env).values() for dev in devs]
    for dc in of_kind(docs, "DeviceClass"):
        selectors = [Selector(s["cel"]["expression"]) for s in dc["spec"]["selectors"]]
        assert _matching(selectors, devices), f"{key}: DeviceClass {dc['metadata']['name']} matches no device"


@pytest.mark.parametrize("key", ALL)
def test_every_sample_request_matches_a_device_of_one_node_group(key: str) -> None:
    env = environment(key)
    _, docs = synthesized(key)
    classes = _class_selectors(docs)
    per_group = dra_devices(env)
    claims = _claims(docs)
    assert claims or not any(per_group.values())
    for claim, spec in claims:
        alternatives_matched: dict[str, bool] = {}
        for request, class_name, expressions, prioritized in selectors_of_claim(spec):
            assert class_name in classes, f"{key}: {claim}/{request}: unknown DeviceClass {class_name}"
            selectors = classes[class_name] + [Selector(e) for e in expressions]
            # Evaluated on every device (raises on an evaluation error, as the allocator would fail).
            matched = any(_matching(selectors, devs) for devs in per_group.values())
            if prioritized:
                parent = request.split("/")[0]
                alternatives_matched[parent] = alternatives_matched.get(parent, False) or matched
            else:
                assert matched, f"{key}: {claim}/{request} matches no device of any node group"
        assert all(alternatives_matched.values()), f"{key}: {claim}: no alternative of a prioritized list matches"


def test_prioritized_request_prefers_h100_and_h200() -> None:
    _, docs = synthesized("config/dev")
    spec = next(t["spec"]["spec"] for t in of_kind(docs, "ResourceClaimTemplate")
                if t["metadata"]["name"] == "prioritized-gpu")
    (preferred, fallback) = spec["devices"]["requests"][0]["firstAvailable"]
    assert fallback.get("selectors") is None
    (expr,) = [s["cel"]["expression"] for s in preferred["selectors"]]
    selector = Selector(expr)
    for instance_type, expected in [("p5.48xlarge", True), ("p5en.48xlarge", True), ("g6e.48xlarge", False),
                                    ("p4d.24xlarge", False)]:
        gpus = simulate_node(instance_type, "n")["gpu"]
        assert {selector.matches("gpu.nvidia.com", g) for g in gpus} == {expected}, instance_type


def test_selector_helper_follows_kubernetes_missing_attribute_rules() -> None:
    """An unknown domain is an empty map; an unknown attribute name is an error."""
    gpu = simulate_node("p5.48xlarge", "n")["gpu"][0]
    assert Selector("device.attributes['other.example.com'].size() == 0").matches("gpu.nvidia.com", gpu)
    with pytest.raises(Exception):  # noqa: B017 - the library raises KeyError or RuntimeError
        Selector("device.attributes['gpu.nvidia.com'].noSuchAttribute == 1").matches("gpu.nvidia.com", gpu)


# --- the admission policies, evaluated on admission requests --------------------------------------

def _policy(name: str) -> dict:
    _, docs = synthesized("config/dev")
    return next(p for p in of_kind(docs, "ValidatingAdmissionPolicy") if p["metadata"]["name"] == name)


def _admit(policy: dict, request: dict, obj: dict | None, old: dict | None) -> list[str]:
    """Run a policy like the API server: match conditions, variables in order, then validations.
    Returns the messages of failed validations (empty: admitted); [] also when the policy does not apply."""
    ctx = {"request": request, "object": obj, "oldObject": old}
    if not all(cel.evaluate(c["expression"], ctx) for c in policy["spec"]["matchConditions"]):
        return []
    variables: dict = {}
    for v in policy["spec"].get("variables", []):
        variables[v["name"]] = cel.evaluate(v["expression"], {**ctx, "variables": variables})
    ctx["variables"] = variables
    return [v.get("message") or v["messageExpression"] for v in policy["spec"]["validations"]
            if cel.evaluate(v["expression"], ctx) is not True]


def _request(operation: str, node: str | None, user: str = "system:serviceaccount:eks-dra-system:eks-dra-gpu-driver"):
    extra = {"authentication.kubernetes.io/node-name": [node]} if node else {}
    return {"operation": operation, "userInfo": {"username": user, "extra": extra}}


def _slice(node: str, driver: str = "gpu.nvidia.com") -> dict:
    return {"spec": {"driver": driver, "nodeName": node, "pool": {"name": node}}}


def test_slice_policy_allows_own_node_and_driver_only() -> None:
    policy = _policy("eks-dra-gpu-driver-slices")
    assert _admit(policy, _request("CREATE", "n1"), _slice("n1"), None) == []
    assert _admit(policy, _request("DELETE", "n1"), None, _slice("n1")) == []
    assert _admit(policy, _request("CREATE", "n1"), _slice("n2"), None)
    assert _admit(policy, _request("DELETE", "n1"), None, _slice("n2"))
    assert _admit(policy, _request("UPDATE", "n1"), _slice("n1", "dra.net"), _slice("n1"))
    assert _admit(policy, _request("CREATE", None), _slice("n1"), None)  # token without a node
    # Another identity (the EFA driver's) is not this policy's business.
    other = _request("CREATE", "n1", user="system:serviceaccount:eks-dra-system:eks-dra-efa-driver")
    assert _admit(policy, other, _slice("n2"), None) == []


def _node(name: str, taints: list[str], labels: dict | None = None) -> dict:
    spec = {"taints": [{"key": k, "value": "true", "effect": "NoSchedule"} for k in taints]} if taints else {}
    return {"metadata": {"name": name, "labels": labels or {"a": "b"}}, "spec": spec}


def test_node_policy_allows_only_removing_the_own_readiness_taint() -> None:
    policy = _policy("eks-dra-gpu-driver-node-taint")
    ready = "gpu.nvidia.com/not-ready"
    before = _node("n1", ["nvidia.com/gpu", ready, "dra.net/not-ready"])
    assert _admit(policy, _request("UPDATE", "n1"), _node("n1", ["nvidia.com/gpu", "dra.net/not-ready"]),
                  before) == []
    assert _admit(policy, _request("UPDATE", "n1"), _node("n1", ["nvidia.com/gpu"]), before)  # EFA's taint too
    assert _admit(policy, _request("UPDATE", "n1"), _node("n1", [ready, "dra.net/not-ready"]), before)
    assert _admit(policy, _request("UPDATE", "n2"), _node("n1", ["nvidia.com/gpu", "dra.net/not-ready"]),
                  before)  # another node
    relabelled = _node("n1", ["nvidia.com/gpu", "dra.net/not-ready"], {"a": "c"})
    assert _admit(policy, _request("UPDATE", "n1"), relabelled, before)
    assert _admit(policy, _request("UPDATE", "n1"), _node("n1", []), _node("n1", [])) == []  # no-op patch


_SCHEMAS = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / "v1.34.0-local-strict"
# ObjectMeta fields the API server sets, or keeps as they were, whatever an update sends
# (k8s.io/apimachinery/pkg/api/validation/objectmeta.go ValidateObjectMetaUpdate, and the registry's
# rest.BeforeUpdate): the node policy need not guard them.
SERVER_OWNED_METADATA = {"creationTimestamp", "deletionGracePeriodSeconds", "deletionTimestamp", "generation",
                         "managedFields", "name", "namespace", "resourceVersion", "selfLink", "uid"}
CHANGED_VALUES = {"annotations": {"x": "y"}, "finalizers": ["example.com/keep"], "generateName": "n-",
                  "labels": {"a": "c"}, "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p",
                                                             "uid": "u"}],
                  "configSource": {"configMap": {"name": "c", "namespace": "kube-system",
                                                 "kubeletConfigKey": "kubelet"}},
                  "externalID": "i-0", "podCIDR": "10.1.0.0/24", "podCIDRs": ["10.1.0.0/24"],
                  "providerID": "aws:///us-east-2a/i-0", "unschedulable": True}


def _properties(schema: str) -> set[str]:
    return set(json.loads((_SCHEMAS / schema).read_text())["properties"])


def test_node_policy_guards_every_node_field_a_client_can_change() -> None:
    """Derived from the 1.34 Node schema: a new field fails here until the policy guards it."""
    assert set(NODE_SPEC_FIELDS) == _properties("nodespec-v1.json") - {"taints"}
    assert set(NODE_METADATA_FIELDS) == _properties("objectmeta-meta-v1.json") - SERVER_OWNED_METADATA


@pytest.mark.parametrize("field", [f"metadata.{f}" for f in NODE_METADATA_FIELDS] +
                         [f"spec.{f}" for f in NODE_SPEC_FIELDS])
def test_node_policy_refuses_any_other_change_of_the_own_node(field: str) -> None:
    """Removing its own readiness taint is allowed; the same patch that also changes `field` (set, changed or
    removed) is not."""
    policy = _policy("eks-dra-gpu-driver-node-taint")
    ready = "gpu.nvidia.com/not-ready"
    before, after = _node("n1", ["nvidia.com/gpu", ready]), _node("n1", ["nvidia.com/gpu"])
    assert _admit(policy, _request("UPDATE", "n1"), after, before) == []
    section, name = field.split(".")
    changed = copy.deepcopy(after)
    changed[section][name] = CHANGED_VALUES[name]
    messages = _admit(policy, _request("UPDATE", "n1"), changed, before)
    assert messages and any(field in m for m in messages), messages
    had = copy.deepcopy(before)
    had[section][name] = CHANGED_VALUES[name]
    assert _admit(policy, _request("UPDATE", "n1"), after, had)  # removing it is a change too


def test_node_policy_allows_its_taint_only_with_no_schedule() -> None:
    policy = _policy("eks-dra-gpu-driver-node-taint")
    before = _node("n1", ["nvidia.com/gpu"])
    added = _node("n1", ["nvidia.com/gpu", "gpu.nvidia.com/not-ready"])
    assert _admit(policy, _request("UPDATE", "n1"), added, before) == []
    added["spec"]["taints"][1]["effect"] = "NoExecute"  # would evict every pod of the node
    assert _admit(policy, _request("UPDATE", "n1"), added, before)
