"""Which samples an environment gets, decided on the device model; the device-plugin and upstream options."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json

import pytest
from charts.environments import ALL, config_dir, dist_dir, environment, synthesized
from charts.k8s_objects import of_kind

from eks_dra import cli
from eks_dra.charts.samples import NodeGroupDevices, all_efas_on_one_gpu_root, efas_per_gpu_root, efas_per_group4
from eks_dra.config import Taint
from eks_dra.devices import PCIE_ROOT, simulate_node
from eks_dra.errors import UserError
from eks_dra.stacks.manifests import build_k8s_app, upstream_helm_charts


def _samples(key: str) -> set[str]:
    _, docs = synthesized(key)
    return {d["metadata"]["labels"]["eks-dra.io/sample"] for d in docs if d["metadata"].get("namespace") == "dra-samples"}


def _claim_spec(key: str, name: str) -> dict:
    _, docs = synthesized(key)
    for t in of_kind(docs, "ResourceClaimTemplate"):
        if t["metadata"]["name"] == name:
            return t["spec"]["spec"]
    for c in of_kind(docs, "ResourceClaim"):
        if c["metadata"]["name"] == name:
            return c["spec"]
    raise KeyError(name)


def _group(instance_type: str, mig: str | None = None, **managers: str) -> NodeGroupDevices:
    devices = simulate_node(instance_type, "n", mig_profile=mig)
    return NodeGroupDevices("g", instance_type, managers or dict.fromkeys(devices, "dra"), devices, mig)


def test_dev_covers_every_case_its_node_groups_allow() -> None:
    assert _samples("config/dev") == {
        "gpu-job", "shared-gpu", "time-slicing", "prioritized", "gpu-efa-aligned", "gpu-efa-root", "mig",
        "neuron-lnc", "neuron-efa-aligned", "device-plugin-gpu", "device-plugin-efa"}


@pytest.mark.parametrize("key", [k for k in ALL if k != "fixture/upstream"])
def test_eks_dra_plan_allocates_every_sample_claim(key: str) -> None:
    """The planner (1.34 allocator semantics) places every sample the environment ships on its node groups.
    (Upstream environments are left out: the vendor charts, not our manifests, define their DeviceClasses.)"""
    synthesized(key)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(["plan", "-c", f"env={key.split('/', 1)[1]}", "--config-dir", str(config_dir(key)),
                       "--dist-dir", str(dist_dir(key)), "--output", "json"])
    report = json.loads(out.getvalue())
    failed = {c["name"]: c["reason"] for c in report["claims"] if not c["allocated"]}
    assert rc == 0 and not failed, failed


def test_full_fixture_covers_every_case_of_the_guide() -> None:
    assert _samples("fixture/full") == {
        "gpu-job", "shared-gpu", "time-slicing", "prioritized", "gpu-efa-aligned", "gpu-efa-root",
        "gpu-all-efa-root", "mig", "neuron-lnc", "neuron-efa-aligned", "device-plugin-gpu", "device-plugin-efa",
        "device-plugin-neuron"}


@pytest.mark.parametrize(("instance_type", "count"), [("p5.48xlarge", 4), ("p5en.48xlarge", 4),
                                                      ("p6-b200.48xlarge", 2), ("p4d.24xlarge", 1),
                                                      ("g6e.48xlarge", 0), ("g6.48xlarge", 0), ("g5.48xlarge", 1)])
def test_efas_on_a_gpu_root_come_from_the_topology(instance_type: str, count: int) -> None:
    assert efas_per_gpu_root(_group(instance_type)) == count


@pytest.mark.parametrize(("instance_type", "fits"), [("g5.48xlarge", True), ("p5.4xlarge", True),
                                                     ("p5.48xlarge", False), ("p4d.24xlarge", False),
                                                     ("p6-b200.48xlarge", False), ("g6e.48xlarge", False)])
def test_all_efa_variant_only_where_every_efa_shares_one_gpu_root(instance_type: str, fits: bool) -> None:
    assert all_efas_on_one_gpu_root(_group(instance_type)) is fits


def test_gpu_efa_root_sample_uses_an_exact_count_on_p5() -> None:
    spec = _claim_spec("config/dev", "gpu-efa-root")
    efas = next(r for r in spec["devices"]["requests"] if r["name"] == "efas")["exactly"]
    assert efas["count"] == 4 and "allocationMode" not in efas
    assert spec["devices"]["constraints"] == [{"requests": ["gpu", "efas"], "matchAttribute": PCIE_ROOT}]
    all_root = _claim_spec("fixture/full", "gpu-all-efa-root")
    assert next(r for r in all_root["devices"]["requests"] if r["name"] == "efas")["exactly"]["allocationMode"] == "All"


def test_no_pcie_alignment_sample_on_g6e_only_clusters() -> None:
    samples = _samples("fixture/names")  # g6e + trn2
    assert not samples & {"gpu-efa-aligned", "gpu-efa-root", "gpu-all-efa-root", "mig"}
    assert {"gpu-job", "neuron-lnc", "neuron-efa-aligned"} <= samples


def test_neuron_samples_follow_device_groups() -> None:
    lnc = _claim_spec("config/dev", "neuron-lnc")
    assert lnc["devices"]["constraints"] == [{"requests": ["neurons"],
                                              "matchAttribute": "resource.aws.com/devicegroup4_id"}]
    assert lnc["devices"]["config"] == [{"requests": ["neurons"], "opaque": {"driver": "neuron.aws.com", "parameters": {
        "apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 2}}}]
    aligned = _claim_spec("config/dev", "neuron-efa-aligned")
    counts = {r["name"]: r["exactly"]["count"] for r in aligned["devices"]["requests"]}
    assert counts == {"neurons": 4, "efas": 4}
    # trn1 wires two Neuron devices to each EFA: a device group of four has two EFAs.
    assert efas_per_group4(_group("trn1.32xlarge")) == 2
    assert efas_per_group4(_group("inf2.48xlarge")) == 0


def test_full_fixture_picks_trn1_with_lnc1_and_two_efas() -> None:
    # trn1-dra is the only DRA Neuron+EFA group there (inf2 has no EFA, trn2 runs the device plugin).
    aligned = _claim_spec("fixture/full", "neuron-efa-aligned")
    counts = {r["name"]: r["exactly"]["count"] for r in aligned["devices"]["requests"]}
    assert counts == {"neurons": 4, "efas": 2}
    lnc = _claim_spec("fixture/full", "neuron-lnc")
    assert lnc["devices"]["config"][0]["opaque"]["parameters"]["logicalNeuronCore"] == 1
    (selector,) = lnc["devices"]["requests"][0]["exactly"]["selectors"]
    assert selector["cel"]["expression"] == "device.attributes['neuron.aws.com'].instanceType == 'trn1.32xlarge'"


def test_one_mig_sample_per_profile() -> None:
    _, docs = synthesized("fixture/full")
    names = {t["metadata"]["name"] for t in of_kind(docs, "ResourceClaimTemplate") if t["metadata"]["name"].startswith("mig")}
    assert names == {"mig-1g-5gb", "mig-3g-40gb"}


def test_time_slicing_config_and_shared_claim() -> None:
    spec = _claim_spec("config/dev", "time-sliced-gpu")
    assert spec["devices"]["config"][0]["opaque"] == {"driver": "gpu.nvidia.com", "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}}
    _, docs = synthesized("config/dev")
    users = [p["metadata"]["name"] for p in of_kind(docs, "Pod")
             if any(c.get("resourceClaimName") == "shared-gpu" for c in p["spec"].get("resourceClaims", []))]
    assert users == ["shared-gpu-a", "shared-gpu-b"]
    job = next(j for j in of_kind(docs, "Job") if j["metadata"]["name"] == "gpu-job")
    assert job["spec"]["parallelism"] == 2
    assert job["spec"]["template"]["spec"]["resourceClaims"] == [{"name": "devices",
                                                                   "resourceClaimTemplateName": "single-gpu"}]


def test_device_plugin_samples_use_extended_resources() -> None:
    _, docs = synthesized("fixture/full")
    limits = {p["metadata"]["name"]: p["spec"]["containers"][0]["resources"]["limits"] for p in of_kind(docs, "Pod")
              if p["metadata"]["name"].startswith("device-plugin-")}
    assert {k: {r for r in v if r != "memory"} for k, v in limits.items()} == {
        "device-plugin-gpu": {"nvidia.com/gpu"}, "device-plugin-efa": {"vpc.amazonaws.com/efa"},
        "device-plugin-neuron": {"aws.amazon.com/neuron"}}


def test_nvidia_device_plugin_turns_mofed_off_where_efa_is_used() -> None:
    _, docs = synthesized("config/dev")  # g6.12xlarge device-plugin group has EFA
    ds = next(d for d in of_kind(docs, "DaemonSet") if d["metadata"]["name"] == "nvidia-device-plugin")
    assert ds["spec"]["template"]["spec"]["containers"][0]["args"] == ["--mofed-enabled=false"]


# --- upstream drivers ---------------------------------------------------------------------------

def test_upstream_drivers_replace_ours_and_samples_follow() -> None:
    _, docs = synthesized("fixture/upstream")
    assert not of_kind(docs, "DeviceClass")  # the vendor charts create theirs
    assert not [d for d in of_kind(docs, "DaemonSet") if d["metadata"]["namespace"] == "eks-dra-system"]
    classes = {r["exactly"]["deviceClassName"] for t in of_kind(docs, "ResourceClaimTemplate")
               for r in t["spec"]["spec"]["devices"]["requests"] if "exactly" in r}
    assert classes == {"gpu.nvidia.com", "mig.nvidia.com", "efa.networking.k8s.aws", "neuron.aws.com"}
    mig = _claim_spec("fixture/upstream", "mig-1g-5gb")
    assert mig["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"] == \
        "device.attributes['gpu.nvidia.com'].profile == '1g.5gb'"
    ts = _claim_spec("fixture/upstream", "time-sliced-gpu")["devices"]["config"][0]["opaque"]
    assert ts["driver"] == "gpu.nvidia.com" and ts["parameters"]["apiVersion"] == "resource.nvidia.com/v1beta1"
    lnc = _claim_spec("fixture/upstream", "neuron-lnc")["devices"]["config"][0]["opaque"]
    assert lnc["driver"] == "neuron.aws.com" and lnc["parameters"]["apiVersion"] == "neuron.aws.com/v1"


def test_upstream_helm_charts_carry_the_documented_values() -> None:
    specs = {s.id: s for s in upstream_helm_charts(environment("fixture/upstream"))}
    assert set(specs) == {"dra-driver-nvidia-gpu", "aws-dranet", "neuron-helm-chart"}
    nvidia = specs["dra-driver-nvidia-gpu"]
    assert (nvidia.repository, nvidia.version, nvidia.namespace) == (
        "oci://registry.k8s.io/dra-driver-nvidia/charts/dra-driver-nvidia-gpu", "0.4.1", "nvidia")
    assert nvidia.values["gpuResourcesEnabledOverride"] is True
    assert nvidia.values["resources"] == {"computeDomains": {"enabled": False}}
    # pinned to DRA GPU groups: the chart's default (nvidia.com/gpu.present) also matches device-plugin groups
    terms = nvidia.values["kubeletPlugin"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "eks-dra.io/gpu", "operator": "In", "values": ["dra"]}]}]
    neuron = specs["neuron-helm-chart"]
    assert {k: v for k, v in neuron.values.items() if k != "draDriver"} == {"devicePlugin": {"enabled": False},
                                                                           "npd": {"enabled": False}}
    assert neuron.values["draDriver"]["enabled"] is True
    # the chart's own tolerations (draDriver.tolerations replaces them) are kept
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in neuron.values["draDriver"]["tolerations"]
    assert {t["key"] for t in specs["aws-dranet"].values["tolerations"]} == {"nvidia.com/gpu", "aws.amazon.com/neuron"}
    assert upstream_helm_charts(environment("config/dev")) == []


@pytest.mark.parametrize("key", ALL)
def test_every_vendor_chart_is_pinned_to_a_release(key: str) -> None:
    """No chart is installed as whatever the registry calls latest at the next deploy."""
    for spec in upstream_helm_charts(environment(key)):
        assert spec.version and spec.version[0].isdigit() and spec.version != "latest", spec


def test_vendor_drivers_tolerate_the_dra_groups_own_taints_exactly() -> None:
    env = environment("fixture/upstream")
    dedicated = Taint("example.com/dedicated", "ml", "NoExecute")
    groups = tuple(dataclasses.replace(g, taints=(dedicated,)) if g.name in ("p5-dra", "trn2-dra") else g
                   for g in env.node_groups)
    specs = {s.id: s for s in upstream_helm_charts(dataclasses.replace(env, node_groups=groups))}
    wanted = {"key": "example.com/dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"}
    assert wanted in specs["dra-driver-nvidia-gpu"].values["kubeletPlugin"]["tolerations"]  # p5-dra: GPU
    assert wanted in specs["aws-dranet"].values["tolerations"]  # p5-dra and trn2-dra: EFA
    assert wanted in specs["neuron-helm-chart"].values["draDriver"]["tolerations"]  # trn2-dra: Neuron
    assert wanted not in {s.id: s for s in upstream_helm_charts(env)}["aws-dranet"].values["tolerations"]


def test_upstream_efa_next_to_an_efa_device_plugin_is_refused() -> None:
    env = environment("fixture/full")
    env = dataclasses.replace(env, drivers=dataclasses.replace(env.drivers, efa="upstream"))
    with pytest.raises(UserError, match="drivers.efa: upstream cannot be combined with node group"):
        upstream_helm_charts(env)


def test_driver_image_override() -> None:
    app = build_k8s_app(environment("config/dev"), image="123.dkr.ecr.us-east-2.amazonaws.com/eks-dra:abc")
    chart = next(c for c in app.charts if c.node.id == "eks-dra-driver-gpu")
    ds = next(o for o in chart.to_json() if o["kind"] == "DaemonSet")
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == "123.dkr.ecr.us-east-2.amazonaws.com/eks-dra:abc"


def test_compute_domains_turn_on_the_nvidia_controller_and_ship_the_ultraserver_sample() -> None:
    """fixture/gb200: drivers.gpu upstream + computeDomains: the chart's ComputeDomain controller on, and the
    EKS UltraServer page's ComputeDomain with a pod claiming its channel (the CRD schema check is in test_charts)."""
    (spec,) = upstream_helm_charts(environment("fixture/gb200"))
    assert spec.id == "dra-driver-nvidia-gpu" and spec.values["resources"]["computeDomains"] == {"enabled": True}
    (plain,) = [s for s in upstream_helm_charts(environment("fixture/upstream")) if s.id == "dra-driver-nvidia-gpu"]
    assert plain.values["resources"]["computeDomains"] == {"enabled": False}  # the guide's GPU-only install
    _, docs = synthesized("fixture/gb200")
    (domain,) = of_kind(docs, "ComputeDomain")
    assert domain["apiVersion"] == "resource.nvidia.com/v1beta1"
    channel = domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
    pod = next(p for p in of_kind(docs, "Pod") if p["metadata"]["name"] == "compute-domain")
    assert {"name": "channel", "resourceClaimTemplateName": channel} in pod["spec"]["resourceClaims"]
    assert "compute-domain" in _samples("fixture/gb200")
    assert not [d for d in synthesized("fixture/upstream")[1] if d["kind"] == "ComputeDomain"]
