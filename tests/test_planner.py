"""eks-dra plan: hand-worked allocations on the catalogued topologies (expected devices worked out from
eks_dra/catalog/instances.py), Kubernetes 1.34 semantics, and the command's output and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from eks_dra import cli
from eks_dra.devices.neuron import neuron_device_name
from eks_dra.planner.cel_env import CelEnvironment
from eks_dra.planner.claims import load_manifests
from eks_dra.planner.plan import Planner, PlanResult
from eks_dra.planner.simulate import nodes_for_instance_type

FIXTURES = Path(__file__).parent / "planner"
CLASSES = FIXTURES / "classes.yaml"
PCIE = "resource.kubernetes.io/pcieRoot"


def exact(name: str, cls: str, count: int | None = None, selectors: tuple[str, ...] = (), mode: str | None = None,
          **extra) -> dict:
    body: dict = {"deviceClassName": cls, **extra}
    if count is not None:
        body["count"] = count
    if mode:
        body["allocationMode"] = mode
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": body}


def claim(name: str, *requests: dict, constraints: tuple[tuple[str, list[str]], ...] = (),
          namespace: str = "default") -> dict:
    devices: dict = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = [{"matchAttribute": attr, **({"requests": reqs} if reqs else {})}
                                  for attr, reqs in constraints]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"devices": devices}}


def plan(tmp_path: Path, instance_type: str, *docs: dict, nodes: int = 1, mig_profile: str | None = None,
         files: tuple[Path, ...] = ()) -> PlanResult:
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    env = CelEnvironment()
    manifests = load_manifests([CLASSES, *files, path], env)
    return Planner(env, nodes_for_instance_type(instance_type, nodes, mig_profile=mig_profile)).run(manifests.pods)


def devices_of(result: PlanResult, name: str) -> list[tuple[str, str]]:
    found = next(c for c in result.claims if c.name == name)
    assert found.allocated, found.reason
    return [(d.request, d.device) for d in found.devices]


def reason_of(result: PlanResult, name: str) -> str:
    found = next(c for c in result.claims if c.name == name)
    assert not found.allocated
    return found.reason or ""


GPU_EFA_ALIGNED = claim("aligned", exact("gpu", "gpu.nvidia.com"), exact("efa", "efa.networking.k8s.aws"),
                        constraints=((PCIE, ["gpu", "efa"]),))


# --- aligned GPU + EFA per instance type ----------------------------------------------------------------

@pytest.mark.parametrize(("instance_type", "efa"), [
    ("p4d.24xlarge", "efa-0000-13-00-0"),  # GPUs 0,1 and EFA 0 share root 10 (buses 11, 12, 13)
    ("p5.48xlarge", "efa-0000-46-00-0"),  # gpu-0 on 45 under root 44, its EFAs on 46..49
    ("p5en.48xlarge", "efa-0000-47-00-0"),  # gpu-0/1 on 45/46 under root 44, EFAs 47..4a
    ("p6-b200.48xlarge", "efa-0000-47-00-0"),  # gpu-0/1 under root 44, EFAs 47 and 48
])
def test_aligned_gpu_and_efa(tmp_path, instance_type, efa):
    result = plan(tmp_path, instance_type, GPU_EFA_ALIGNED)
    assert devices_of(result, "aligned") == [("gpu", "gpu-0"), ("efa", efa)]
    assert result.claims[0].devices[0].attributes[PCIE] == result.claims[0].devices[1].attributes[PCIE]


def test_g6e_has_no_gpu_on_an_efa_root(tmp_path):
    result = plan(tmp_path, "g6e.48xlarge", GPU_EFA_ALIGNED)
    assert reason_of(result, "aligned").startswith(
        "request gpu+efa: constraint matchAttribute resource.kubernetes.io/pcieRoot over [gpu, efa] cannot be met "
        "on g6e.48xlarge: no device for gpu shares a value of resource.kubernetes.io/pcieRoot with a device for efa")
    assert "efa: pci0000:84, pci0000:a5" in reason_of(result, "aligned")


@pytest.mark.parametrize(("instance_type", "count", "efas"), [
    ("p4d.24xlarge", 1, ["efa-0000-13-00-0"]),
    ("p5.48xlarge", 4, ["efa-0000-46-00-0", "efa-0000-47-00-0", "efa-0000-48-00-0", "efa-0000-49-00-0"]),
    ("p5en.48xlarge", 4, ["efa-0000-47-00-0", "efa-0000-48-00-0", "efa-0000-49-00-0", "efa-0000-4a-00-0"]),
    ("p6-b200.48xlarge", 2, ["efa-0000-47-00-0", "efa-0000-48-00-0"]),
])
def test_one_gpu_with_the_efa_of_its_root(tmp_path, instance_type, count, efas):
    doc = claim("gpu-and-its-efa", exact("gpu", "gpu.nvidia.com"), exact("efa", "efa.networking.k8s.aws", count),
                constraints=((PCIE, ["gpu", "efa"]),))
    result = plan(tmp_path, instance_type, doc)
    assert devices_of(result, "gpu-and-its-efa") == [("gpu", "gpu-0")] + [("efa", e) for e in efas]


def test_one_more_efa_than_the_root_has_backtracks_then_fails(tmp_path):
    doc = claim("too-many", exact("gpu", "gpu.nvidia.com"), exact("efa", "efa.networking.k8s.aws", 5),
                constraints=((PCIE, ["gpu", "efa"]),))
    reason = reason_of(plan(tmp_path, "p5.48xlarge", doc), "too-many")
    assert reason == ("request gpu+efa: constraint matchAttribute resource.kubernetes.io/pcieRoot over [gpu, efa] "
                      "cannot be met on p5.48xlarge: at most 4 devices for efa share one value of "
                      "resource.kubernetes.io/pcieRoot (e.g. pci0000:44), the request needs 5")


def test_all_efa_variant_is_unsatisfiable_on_p5(tmp_path):
    # 1.34: All takes all 32 EFAs of the node; with the GPU that is 33 results, over the claim limit of 32.
    result = plan(tmp_path, "p5.48xlarge", files=(FIXTURES / "aligned-gpu-efa.yaml",))
    assert reason_of(result, "aligned-all-efa-one-gpu") == (
        "claim ml/aligned-all-efa-one-gpu: number of requested devices 33 exceeds the claim limit of 32 "
        "(request efa: All = 32 matching devices of p5.48xlarge)")


def test_all_efa_variant_breaks_the_constraint_on_p5en(tmp_path):
    # 16 EFAs fit in a claim, but they sit on four roots: adding the first EFA of root 5d (bus 60, after
    # gpu-2 and gpu-3 on 5e and 5f) breaks the constraint,
    # which for allocationMode All is an error in the 1.34 allocator.
    result = plan(tmp_path, "p5en.48xlarge", files=(FIXTURES / "aligned-gpu-efa.yaml",))
    reason = reason_of(result, "aligned-all-efa-one-gpu")
    assert reason.startswith("claim ml/aligned-all-efa-one-gpu, request efa: cannot add device "
                             "dra.net/p5en.48xlarge-0/efa-0000-60-00-0 because a claim constraint would not "
                             "be satisfied; its resource.kubernetes.io/pcieRoot pci0000:5d differs from pci0000:44")


def test_all_efa_on_g5_where_every_device_shares_root_00(tmp_path):
    doc = claim("all", exact("gpu", "gpu.nvidia.com"), exact("efa", "efa.networking.k8s.aws", mode="All"),
                constraints=((PCIE, []),))
    assert devices_of(plan(tmp_path, "g5.48xlarge", doc), "all") == [("gpu", "gpu-0"), ("efa", "efa-0000-09-00-0")]


# --- counts, competition, firstAvailable ---------------------------------------------------------------

def test_count_above_what_the_node_has(tmp_path):
    result = plan(tmp_path, "p5.48xlarge", claim("big", exact("gpus", "gpu.nvidia.com", 16)))
    assert reason_of(result, "big") == "request gpus: count 16 exceeds the 8 matching devices of p5.48xlarge"


def test_two_claims_compete_for_one_node(tmp_path):
    a, b = claim("a", exact("gpus", "gpu.nvidia.com", 6)), claim("b", exact("gpus", "gpu.nvidia.com", 6))
    one = plan(tmp_path, "p5.48xlarge", a, b)
    assert devices_of(one, "a") == [("gpus", f"gpu-{i}") for i in range(6)]
    assert reason_of(one, "b") == ("the only p5.48xlarge node already holds other claims' devices: request gpus "
                                   "needs 6 matching devices, at most 2 are free on one node")
    two = plan(tmp_path, "p5.48xlarge", a, b, nodes=2)
    assert [c.node for c in two.claims] == ["p5.48xlarge-0", "p5.48xlarge-1"]


def test_first_available_falls_through_in_order(tmp_path):
    doc = claim("flex", {"name": "gpu", "firstAvailable": [
        {"name": "b200", "deviceClassName": "gpu.nvidia.com", "count": 2,
         "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA B200'"}}]},
        {"name": "sixteen", "deviceClassName": "gpu.nvidia.com", "count": 16},
        {"name": "four", "deviceClassName": "gpu.nvidia.com", "count": 4},
        {"name": "one", "deviceClassName": "gpu.nvidia.com"},
    ]}, exact("efa", "efa.networking.k8s.aws"), constraints=((PCIE, ["gpu/four", "efa"]),))
    result = plan(tmp_path, "p5.48xlarge", doc)
    # gpu/four's devices span four roots, so no EFA matches all of them: the search backtracks over gpu/four
    # combinations, cannot meet the constraint, and falls through to gpu/one (which the constraint ignores).
    assert devices_of(result, "flex") == [("gpu/one", "gpu-0"), ("efa", "efa-0000-46-00-0")]
    on_b200 = plan(tmp_path, "p6-b200.48xlarge", doc)
    assert devices_of(on_b200, "flex") == [("gpu/b200", "gpu-0"), ("gpu/b200", "gpu-1"), ("efa", "efa-0000-47-00-0")]


def test_first_available_none_possible_names_each_subrequest(tmp_path):
    doc = claim("flex", {"name": "gpu", "firstAvailable": [
        {"name": "many", "deviceClassName": "gpu.nvidia.com", "count": 9},
        {"name": "mig", "deviceClassName": "mig.nvidia.com"},
    ]})
    assert reason_of(plan(tmp_path, "p5.48xlarge", doc), "flex") == (
        "request gpu: no subrequest can be met (gpu/many: count 9 exceeds the 8 matching devices of p5.48xlarge; "
        "gpu/mig: no device of p5.48xlarge matches DeviceClass mig.nvidia.com "
        "(devices there: 32 from dra.net, 8 from gpu.nvidia.com))")


# --- Neuron device groups ------------------------------------------------------------------------------

def _neuron_group(size: int, neurons: int, efas: int) -> dict:
    attr = f"resource.aws.com/devicegroup{size}_id"
    return claim(f"group{size}", exact("neuron", "neuron.aws.com", neurons), exact("efa", "efa.networking.k8s.aws", efas),
                 constraints=((attr, ["neuron", "efa"]),))


@pytest.mark.parametrize(("instance_type", "size", "efas", "expected_efa"), [
    # trn2: one EFA per Neuron device (neurons 0-3 on EFA buses c9, b4, b3, ca; 4-7 on 6c, 57, 56, 6d).
    ("trn2.48xlarge", 4, 4, ["b3-00", "b4-00", "c9-00", "ca-00"]),
    ("trn2.48xlarge", 8, 8, ["56-00", "57-00", "6c-00", "6d-00", "b3-00", "b4-00", "c9-00", "ca-00"]),
    # trn1: two Neuron devices per EFA (lookup/neuron/trn1.json: neurons 0-3 on 10:1a and a0:1a, 4-7 add
    # 20:19 and 90:19).
    ("trn1.32xlarge", 4, 2, ["10-1a", "a0-1a"]),
    ("trn1.32xlarge", 8, 4, ["10-1a", "20-19", "90-19", "a0-1a"]),
])
def test_neuron_groups_with_their_efa(tmp_path, instance_type, size, efas, expected_efa):
    result = plan(tmp_path, instance_type, _neuron_group(size, size, efas))
    # Devices are walked in slice (name) order: neurondevice0, neurondevice1, neurondevice10, ...; the group id of device 0
    # keeps devices 10.. out.
    assert devices_of(result, f"group{size}") == (
        [("neuron", neuron_device_name(i)) for i in range(size)] + [("efa", f"efa-0000-{b}-0") for b in expected_efa])


def test_neuron_group_needing_more_efa_than_wired(tmp_path):
    reason = reason_of(plan(tmp_path, "trn1.32xlarge", _neuron_group(4, 4, 4)), "group4")
    assert "at most 2 devices for efa share one value of resource.aws.com/devicegroup4_id" in reason


# --- templates, workloads, shared claims ------------------------------------------------------------------

def test_template_used_by_a_job_with_parallelism_3(tmp_path):
    result = plan(tmp_path, "p5.48xlarge", nodes=1, files=(FIXTURES / "aligned-gpu-efa.yaml",))
    names = [c.name for c in result.claims]
    assert names[:3] == ["train-0-accel", "train-1-accel", "train-2-accel"]
    gpus = [[d.device for d in c.devices if d.request == "gpu"] for c in result.claims[:3]]
    assert gpus == [["gpu-0"], ["gpu-1"], ["gpu-2"]]  # each with the 4 EFAs of its own root
    efa_roots = {d.attributes[PCIE] for d in result.claims[1].devices}
    assert efa_roots == {"pci0000:55"}


def test_shared_claim_used_by_two_pods_lands_both_on_its_node(tmp_path):
    shared = claim("shared-efa", exact("efa", "efa.networking.k8s.aws"))
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "four-gpus", "namespace": "default"},
                "spec": {"spec": {"devices": {"requests": [exact("gpus", "gpu.nvidia.com", 4)]}}}}

    def pod(name: str) -> dict:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                "spec": {"tolerations": [{"operator": "Exists"}],
                         "resourceClaims": [{"name": "net", "resourceClaimName": "shared-efa"},
                                            {"name": "gpus", "resourceClaimTemplateName": "four-gpus"}],
                         "containers": [{"name": "c", "image": "busybox"}]}}

    result = plan(tmp_path, "p5.48xlarge", shared, template, pod("a"), pod("b"), pod("c"), nodes=2)
    assert [c.name for c in result.claims] == ["shared-efa", "a-gpus", "b-gpus", "c-gpus"]
    shared_claim, a, b, c = result.claims
    assert shared_claim.node == a.node == b.node == "p5.48xlarge-0"
    assert [d.device for d in b.devices] == ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]
    # Pod c must also run where the shared claim is, and that node has no free GPU left (node 1 is idle).
    assert not c.allocated
    assert c.reason == ("pod c: node p5.48xlarge-0 of the shared claim already holds other claims' devices: "
                        "request gpus needs 4 matching devices, at most 0 are free on one node")


def test_deployment_replicas_get_one_claim_each(tmp_path):
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "one-gpu", "namespace": "web"},
                "spec": {"spec": {"devices": {"requests": [exact("gpu", "gpu.nvidia.com")]}}}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "infer", "namespace": "web"},
                  "spec": {"replicas": 3, "template": {"spec": {
                      "tolerations": [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "true",
                                       "effect": "NoSchedule"}],
                      "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                      "containers": [{"name": "c", "image": "x"}]}}}}
    result = plan(tmp_path, "g6e.48xlarge", template, deployment)
    assert [(c.name, c.namespace, c.devices[0].device) for c in result.claims] == [
        ("infer-0-gpu", "web", "gpu-0"), ("infer-1-gpu", "web", "gpu-1"), ("infer-2-gpu", "web", "gpu-2")]


def test_pod_without_the_gpu_toleration_is_not_placed(tmp_path):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"resourceClaims": [{"name": "g", "resourceClaimName": "one"}], "containers": []}}
    result = plan(tmp_path, "p5.48xlarge", claim("one", exact("gpu", "gpu.nvidia.com")), pod)
    assert reason_of(result, "one") == (
        "no node may run pod p (p5.48xlarge: taint nvidia.com/gpu=true:NoSchedule is not tolerated)")


def test_admin_access_shares_an_allocated_device(tmp_path):
    a = claim("all-gpus", exact("gpus", "gpu.nvidia.com", 8))
    monitor = claim("monitor", exact("gpu", "gpu.nvidia.com", adminAccess=True))
    result = plan(tmp_path, "p5.48xlarge", a, monitor)
    assert devices_of(result, "monitor") == [("gpu", "gpu-0")]


def test_mig_devices(tmp_path):
    doc = claim("slices", exact("mig", "mig.nvidia.com", 8))
    result = plan(tmp_path, "p4d.24xlarge", doc, mig_profile="1g.5gb")
    got = [d for _, d in devices_of(result, "slices")]
    assert got == [f"gpu-0-mig-1g-5gb-{i}" for i in range(7)] + ["gpu-1-mig-1g-5gb-0"]


# --- CEL semantics -------------------------------------------------------------------------------------

def test_quantity_and_semver_selectors(tmp_path):
    doc = claim("cel", exact("gpu", "gpu.nvidia.com", 8, selectors=(
        "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('79Gi'))",
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80Gi')) == 0",
        "device.attributes['gpu.nvidia.com'].cudaComputeCapability.isGreaterThan(semver('8.9.0'))",
        "device.attributes['gpu.nvidia.com'].driverVersion.isLessThan(semver('v600', true))",
        "!('nvlinkDomain' in device.attributes['gpu.nvidia.com'])",
        "size(device.attributes['vendor.example.com']) == 0",
        "cel.bind(a, device.attributes['gpu.nvidia.com'], a.numaNode >= 0 && a.architecture == 'Hopper')",
    )))
    assert len(devices_of(plan(tmp_path, "p5.48xlarge", doc), "cel")) == 8
    assert reason_of(plan(tmp_path, "p4d.24xlarge", doc), "cel") == (
        "request gpu: 8 devices of p4d.24xlarge match DeviceClass gpu.nvidia.com, none of them the request's "
        "selectors")


def test_unknown_attribute_is_an_evaluation_error(tmp_path):
    doc = claim("typo", exact("gpu", "gpu.nvidia.com", selectors=("device.attributes['gpu.nvidia.com'].model == 'x'",)))
    reason = reason_of(plan(tmp_path, "p5.48xlarge", doc), "typo")
    assert reason.endswith("spec.devices.requests[0].exactly.selectors[0].cel.expression: CEL runtime error on "
                           "device gpu-0 of node p5.48xlarge-0: no attribute model on gpu.nvidia.com devices; their "
                           "attributes: architecture, brand, cudaComputeCapability, cudaDriverVersion, driverVersion, "
                           "numaNode, productName, type, uuid")


def test_an_attribute_that_is_a_capacity_says_so(tmp_path):
    doc = claim("mem", exact("gpu", "gpu.nvidia.com", selectors=(
        "device.attributes['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",)))
    reason = reason_of(plan(tmp_path, "p5.48xlarge", doc), "mem")
    assert "no attribute memory on gpu.nvidia.com devices (it is a capacity: use " \
           "device.capacity['gpu.nvidia.com'].memory); their attributes: architecture," in reason
    missing_capacity = claim("cap", exact("gpu", "gpu.nvidia.com", selectors=(
        "device.capacity['gpu.nvidia.com'].sms.compareTo(quantity('1')) >= 0",)))
    assert reason_of(plan(tmp_path, "p5.48xlarge", missing_capacity), "cap").endswith(
        "no capacity sms on gpu.nvidia.com devices; their capacities: memory")


FIRST_AVAILABLE_17_OR_8 = claim("big-or-half", {"name": "neurons", "firstAvailable": [
    {"name": "seventeen", "deviceClassName": "neuron.aws.com", "count": 17},
    {"name": "eight", "deviceClassName": "neuron.aws.com", "count": 8}]})


def test_first_available_times_out_on_1_34_as_measured(tmp_path):
    # Measured on the real 1.34.12 scheduler: never scheduled (kubernetes/kubernetes#131730).
    result = plan(tmp_path, "trn2.48xlarge", FIRST_AVAILABLE_17_OR_8)
    reason = reason_of(result, "big-or-half")
    assert "on Kubernetes 1.34 never scheduled on trn2.48xlarge: subrequest neurons/seventeen asks for 17 of the 16" \
           in reason and "kubernetes/kubernetes#131730" in reason
    # Fewer than ten candidates (inf2.24xlarge: 6) end the search in time: the documented answer.
    few = claim("few", {"name": "n", "firstAvailable": [
        {"name": "seven", "deviceClassName": "neuron.aws.com", "count": 7},
        {"name": "one", "deviceClassName": "neuron.aws.com", "count": 1}]})
    assert devices_of(plan(tmp_path, "inf2.24xlarge", few), "few") == [("n/one", neuron_device_name(0))]


def test_first_available_keeps_the_documented_answer_where_fixed(tmp_path, capsys):
    path = _write(tmp_path, "fa.yaml", yaml.safe_dump(FIRST_AVAILABLE_17_OR_8))
    assert cli.main(["plan", "--instance-type", "trn2.48xlarge", "--kubernetes-version", "1.35", "--claims",
                     str(path), "--output", "json"]) == 0
    claim_out = json.loads(capsys.readouterr().out)["claims"][0]
    assert claim_out["allocated"] and {d["request"] for d in claim_out["devices"]} == {"neurons/eight"}


def test_match_attribute_on_a_driver_attribute_given_fully_qualified(tmp_path):
    doc = claim("same-numa", exact("gpus", "gpu.nvidia.com", 2), exact("efa", "efa.networking.k8s.aws"),
                constraints=(("gpu.nvidia.com/numaNode", ["gpus"]), (PCIE, ["efa"])))
    assert devices_of(plan(tmp_path, "p5.48xlarge", doc), "same-numa")[:2] == [("gpus", "gpu-0"), ("gpus", "gpu-1")]


def test_v1beta1_flat_request_shape(tmp_path):
    doc = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim", "metadata": {"name": "old"},
           "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.nvidia.com", "count": 2}]}}}
    assert devices_of(plan(tmp_path, "p5.48xlarge", doc), "old") == [("gpu", "gpu-0"), ("gpu", "gpu-1")]


# --- the command ------------------------------------------------------------------------------------------

def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_cli_json_shape_and_exit_codes(tmp_path, capsys):
    good = _write(tmp_path, "good.yaml", yaml.safe_dump(GPU_EFA_ALIGNED))
    assert cli.main(["plan", "--instance-type", "p5.48xlarge", "--claims", str(CLASSES), str(good),
                     "--output", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # The contract's keys stay as they were; "pod", "workload", "podsWithoutClaims" and "summary" were added
    # (tests/test_plan_report.py, tests/test_planner_device_plugin.py).
    assert set(out) == {"claims", "podsWithoutClaims", "summary"}
    assert [{k: c[k] for k in ("name", "namespace", "allocated", "node", "reason", "devices")}
            for c in out["claims"]] == [{
        "name": "aligned", "namespace": "default", "allocated": True, "node": "p5.48xlarge-0", "reason": None,
        "devices": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "p5.48xlarge-0", "device": "gpu-0",
             "attributes": {PCIE: "pci0000:44", "gpu.nvidia.com/type": "gpu"}},
            {"request": "efa", "driver": "dra.net", "pool": "p5.48xlarge-0", "device": "efa-0000-46-00-0",
             "attributes": {PCIE: "pci0000:44"}},
        ]}]
    assert cli.main(["plan", "--instance-type", "g6e.48xlarge", "--claims", str(CLASSES), str(good)]) == 1
    table = capsys.readouterr().out
    assert "default/aligned" in table and "NOT ALLOCATED" in table and "0 of 1 claims allocated" in table


def test_cli_table_lists_devices_and_attributes(tmp_path, capsys):
    good = _write(tmp_path, "good.yaml", yaml.safe_dump(GPU_EFA_ALIGNED))
    assert cli.main(["plan", "--instance-type", "p5.48xlarge", "--nodes", "2", "--claims", str(CLASSES),
                     str(good)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["CLAIM", "NODE", "REQUEST", "DEVICE", "ATTRIBUTES"]
    assert lines[1].split() == ["default/aligned", "p5.48xlarge-0", "gpu", "gpu.nvidia.com/gpu-0",
                                "resource.kubernetes.io/pcieRoot=pci0000:44", "type=gpu"]
    assert "1 of 1 claims allocated, on 1 of 2 nodes" in lines


def test_cli_custom_driver_names(tmp_path, capsys):
    classes = _write(tmp_path, "classes.yaml", CLASSES.read_text().replace("gpu.nvidia.com", "gpu.example.com"))
    doc = claim("c", exact("gpu", "gpu.example.com"))
    claims = _write(tmp_path, "c.yaml", yaml.safe_dump(doc))
    args = ["plan", "--instance-type", "p5.48xlarge", "--claims", str(classes), str(claims), "-o", "json"]
    assert cli.main(args) == 1  # our GPU driver publishes as gpu.nvidia.com by default
    capsys.readouterr()
    assert cli.main([*args, "--driver-name", "gpu=gpu.example.com"]) == 0
    assert json.loads(capsys.readouterr().out)["claims"][0]["devices"][0]["driver"] == "gpu.example.com"


BAD_INPUTS = [
    ("malformed.yaml", "kind: ResourceClaim\nmetadata: {name: x\n", "malformed.yaml:"),
    ("scalar.yaml", "just text\n", "scalar.yaml: document 1 is not a Kubernetes object"),
    ("unknown-class.yaml", yaml.safe_dump(claim("foo", exact("gpu", "gpu.example.com"))),
     "unknown-class.yaml: ResourceClaim default/foo: spec.devices.requests[0].exactly.deviceClassName: device class "
     "gpu.example.com not found"),
    ("syntax.yaml", yaml.safe_dump(claim("foo", exact("gpu", "gpu.nvidia.com", selectors=(
        "device.driver == 'gpu.nvidia.com'", "device.attributes['gpu.nvidia.com'].index >")))),
     "syntax.yaml: ResourceClaim default/foo: spec.devices.requests[0].exactly.selectors[1].cel.expression: "
     "syntax error"),
    ("undeclared.yaml", yaml.safe_dump(claim("foo", exact("gpu", "gpu.nvidia.com", selectors=("dev.driver == 'x'",)))),
     "spec.devices.requests[0].exactly.selectors[0].cel.expression: undeclared reference to dev"),
    ("both.yaml", yaml.safe_dump(claim("foo", {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"},
                                               "firstAvailable": []})),
     "spec.devices.requests[0]: set exactly one of exactly or firstAvailable"),
    ("count.yaml", yaml.safe_dump(claim("foo", exact("gpu", "gpu.nvidia.com", 0))),
     "spec.devices.requests[0].exactly.count: 0 must be a positive integer"),
    ("all-count.yaml", yaml.safe_dump(claim("foo", exact("gpu", "gpu.nvidia.com", 2, mode="All"))),
     "spec.devices.requests[0].exactly.count: must not be set when allocationMode is All"),
    ("constraint-ref.yaml", yaml.safe_dump(claim("foo", exact("gpu", "gpu.nvidia.com"),
                                                 constraints=((PCIE, ["nic"]),))),
     "spec.devices.constraints[0].requests[0]: 'nic' is not a request of this claim"),
    ("unqualified.yaml", yaml.safe_dump(claim("foo", exact("gpu", "gpu.nvidia.com"), constraints=(("pcieRoot", []),))),
     "spec.devices.constraints[0].matchAttribute: 'pcieRoot' must be a fully qualified attribute name"),
    ("distinct.yaml", yaml.safe_dump({**claim("foo", exact("gpu", "gpu.nvidia.com")), "spec": {"devices": {
        "requests": [exact("gpu", "gpu.nvidia.com")], "constraints": [{"distinctAttribute": PCIE}]}}}),
     "spec.devices.constraints[0].distinctAttribute: needs the alpha feature gate DRAConsumableCapacity"),
    ("missing-claim.yaml", yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
        "resourceClaims": [{"name": "x", "resourceClaimName": "nope"}], "containers": []}}),
     "missing-claim.yaml: Pod default/p: spec.resourceClaims[0].resourceClaimName: ResourceClaim default/nope is not "
     "in the given files"),
    ("duplicate.yaml", yaml.safe_dump_all([claim("foo", exact("g", "gpu.nvidia.com"))] * 2),
     "duplicate.yaml: ResourceClaim default/foo: defined twice"),
]


@pytest.mark.parametrize(("name", "text", "message"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_exits_2_naming_file_object_and_field(tmp_path, capsys, name, text, message):
    path = _write(tmp_path, name, text)
    assert cli.main(["plan", "--instance-type", "p5.48xlarge", "--claims", str(CLASSES), str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("args", "message"), [
    (["--instance-type", "p5.48xl", "--claims", str(CLASSES)], "not in the eks-dra accelerator catalog"),
    (["--instance-type", "p5.48xlarge", "--mig-profile", "9g.1tb", "--claims", str(CLASSES)],
     "MIG profile '9g.1tb' does not exist"),
    (["--instance-type", "p5.48xlarge"], "--claims FILE... is required"),
    ([], "give --instance-type T or --slices FILE..."),
    (["--instance-type", "p5.48xlarge", "--nodes", "0", "--claims", str(CLASSES)], "--nodes must be at least 1"),
])
def test_bad_command_lines_exit_2(capsys, args, message):
    assert cli.main(["plan", *args]) == 2
    assert message in capsys.readouterr().err


def test_an_error_on_any_node_stops_the_pod_like_kube_scheduler(tmp_path):
    # g5.48xlarge could take "one GPU + All EFA" (one root), but the p5 nodes' filter errors (33 > 32 results),
    # and an error from any node's filter ends the pod's scheduling attempt.
    from eks_dra.planner.simulate import number_nodes

    doc = claim("all", exact("gpu", "gpu.nvidia.com"), exact("efa", "efa.networking.k8s.aws", mode="All"),
                constraints=((PCIE, []),))
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    env = CelEnvironment()
    manifests = load_manifests([CLASSES, path], env)
    nodes = number_nodes(nodes_for_instance_type("g5.48xlarge", 1) + nodes_for_instance_type("p5.48xlarge", 1))
    result = Planner(env, nodes).run(manifests.pods)
    assert reason_of(result, "all").startswith("claim default/all: number of requested devices 33 exceeds the claim "
                                               "limit of 32")


def test_requests_of_one_class_compete_for_the_same_devices(tmp_path):
    both = claim("both", exact("x", "efa.networking.k8s.aws", 2), exact("g", "gpu.nvidia.com"), exact("y", "efa.networking.k8s.aws", 3),
                 constraints=((PCIE, []),))
    assert reason_of(plan(tmp_path, "p5.48xlarge", both), "both").endswith(
        "at most 4 devices for x+y share one value of resource.kubernetes.io/pcieRoot (e.g. pci0000:44), "
        "together they need 5")
    blocker = claim("blocker", exact("e", "efa.networking.k8s.aws"))
    halves = claim("halves", exact("x", "efa.networking.k8s.aws", 16), exact("y", "efa.networking.k8s.aws", 16))
    # (1.35 and later refuse at once; the 1.34 walk times out: tests/test_planner_filter_timeout.py)
    path = _write(tmp_path, "halves.yaml", yaml.safe_dump_all([blocker, halves]))
    env = CelEnvironment()
    pods = load_manifests([CLASSES, path], env).pods
    result = Planner(env, nodes_for_instance_type("p5.48xlarge", 1), kubernetes_version="1.35").run(pods)
    assert reason_of(result, "halves") == (
        "the only p5.48xlarge node already holds other claims' devices: requests x+y need 32 matching devices, "
        "at most 31 are free on one node")


def test_json_list_input(tmp_path):
    listing = {"apiVersion": "v1", "kind": "List", "items": [GPU_EFA_ALIGNED, claim("two", exact("g", "gpu.nvidia.com", 2))]}
    path = tmp_path / "list.json"
    path.write_text(json.dumps(listing))
    env = CelEnvironment()
    manifests = load_manifests([CLASSES, path], env)
    result = Planner(env, nodes_for_instance_type("p5.48xlarge", 1)).run(manifests.pods)
    assert [(c.name, c.allocated) for c in result.claims] == [("aligned", True), ("two", True)]
    assert devices_of(result, "two") == [("g", "gpu-1"), ("g", "gpu-2")]


def test_daemonset_gets_one_pod_per_node_with_admin_access(tmp_path):
    # The canonical admin-access workload: a monitoring agent on every GPU node, next to the jobs' claims.
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "all-gpus-admin", "namespace": "monitoring"},
                "spec": {"spec": {"devices": {"requests": [
                    exact("gpus", "gpu.nvidia.com", mode="All", adminAccess=True)]}}}}
    daemonset = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "dcgm", "namespace": "monitoring"},
                 "spec": {"template": {"spec": {
                     "tolerations": [{"operator": "Exists"}],
                     "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "all-gpus-admin"}],
                     "containers": [{"name": "c", "image": "x"}]}}}}
    result = plan(tmp_path, "p5.48xlarge", claim("job", exact("gpus", "gpu.nvidia.com", 8)), template, daemonset,
                  nodes=2)
    assert [(c.name, c.node) for c in result.claims] == [
        ("job", "p5.48xlarge-0"), ("dcgm-p5.48xlarge-0-gpus", "p5.48xlarge-0"),
        ("dcgm-p5.48xlarge-1-gpus", "p5.48xlarge-1")]
    assert len(result.claims[1].devices) == 8  # shares the job's GPUs


def test_pod_bound_to_a_node(tmp_path):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"nodeName": "p5.48xlarge-1", "tolerations": [{"operator": "Exists"}],
                    "resourceClaims": [{"name": "g", "resourceClaimName": "one"}], "containers": []}}
    result = plan(tmp_path, "p5.48xlarge", claim("one", exact("gpu", "gpu.nvidia.com")), pod, nodes=2)
    assert result.claims[0].node == "p5.48xlarge-1"


def test_a_directory_of_manifests_and_bad_json(tmp_path, capsys):
    folder = tmp_path / "manifests"
    folder.mkdir()
    (folder / "classes.yaml").write_text(CLASSES.read_text())
    (folder / "claim.json").write_text(json.dumps(GPU_EFA_ALIGNED))
    (folder / "notes.txt").write_text("not a manifest")
    assert cli.main(["plan", "--instance-type", "p5.48xlarge", "--claims", str(folder)]) == 0
    capsys.readouterr()
    (folder / "broken.json").write_text('{"kind": ')
    assert cli.main(["plan", "--instance-type", "p5.48xlarge", "--claims", str(folder)]) == 2
    assert "broken.json: line 1: not valid JSON" in capsys.readouterr().err
