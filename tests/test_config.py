"""config/<env>.yaml: the shipped environments, the schema, defaults and error messages."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from eks_dra.config import load_environment, load_pipeline
from eks_dra.devices.names import DriverNames
from eks_dra.errors import UserError

CONFIG = Path(__file__).resolve().parent.parent / "config"

SYSTEM = "  - {name: system, instanceType: m7i.xlarge, minSize: 2, desiredSize: 2, maxSize: 3}\n"


def write_env(tmp_path: Path, body: str, name: str = "test") -> Path:
    (tmp_path / f"{name}.yaml").write_text(textwrap.dedent(body))
    return tmp_path


def load(tmp_path: Path, body: str, name: str = "test"):
    return load_environment(name, write_env(tmp_path, body, name))


def error(tmp_path: Path, body: str) -> str:
    with pytest.raises(UserError) as exc:
        load(tmp_path, body)
    return str(exc.value)


# --- shipped environments ---

@pytest.mark.parametrize("name", ["dev", "staging", "prod"])
def test_shipped_environments_load_without_warnings_or_with_reasons(name):
    env = load_environment(name, CONFIG)
    assert env.name == name and env.kubernetes_version == "1.34"
    assert env.source == CONFIG / f"{name}.yaml"
    assert any(g.accelerator_family is None for g in env.node_groups), "a system node group"
    assert env.region == "us-east-2"


def test_dev_has_the_groups_the_issue_asks_for():
    env = load_environment("dev", CONFIG)
    groups = {g.name: g for g in env.node_groups}
    p5 = groups["p5-dra"]
    assert p5.instance_type == "p5.48xlarge" and p5.families == ("gpu", "efa") and p5.mig_profile is None
    assert p5.manager("gpu") == p5.manager("efa") == "dra" and p5.desired_size == 0
    trn2 = groups["trn2-dra"]
    assert trn2.families == ("neuron", "efa") and trn2.ami_type == "AL2023_x86_64_NEURON"
    g6e = groups["g6e-bottlerocket"]
    assert g6e.ami_type == "BOTTLEROCKET_x86_64_NVIDIA" and g6e.device_mode == "dra"
    assert groups["g6-device-plugin"].manager("gpu") == "device-plugin"
    assert groups["p4d-mig"].mig_profile == "1g.5gb" and groups["p4d-mig"].desired_size == 0
    assert [g.name for g in env.node_groups if g.mig_profile] == ["p4d-mig"]
    assert {g.name for g in env.dra_node_groups("gpu")} == {"p5-dra", "g6e-bottlerocket", "p4d-mig"}
    assert {g.name for g in env.device_plugin_node_groups("efa")} == {"g6-device-plugin"}
    assert env.account is None and not env.protected and env.drivers.names == DriverNames()


def test_prod_is_protected_with_reservations():
    env = load_environment("prod", CONFIG)
    assert env.protected and env.account == "222222222222"
    kinds = {g.capacity.kind for g in env.node_groups}
    assert {"capacity-block", "odcr"} <= kinds
    cb = next(g for g in env.node_groups if g.capacity.kind == "capacity-block")
    assert cb.capacity.reservation_id.startswith("cr-") and cb.desired_size == 0


def test_pipeline_lists_environments_in_order():
    pipeline = load_pipeline(CONFIG)
    assert [e.name for e in pipeline.environments] == ["staging", "prod"]
    assert pipeline.source.repository and pipeline.source.branch == "main"


# --- defaults and typed values ---

def test_defaults(tmp_path):
    env = load(tmp_path, "nodeGroups:\n" + SYSTEM + "  - {name: gpu, instanceType: g6e.48xlarge}\n")
    assert env.cluster_name == "eks-dra-test" and env.kubernetes_version == "1.34"
    assert env.vpc.cidr == "10.0.0.0/16" and env.vpc.vpc_id is None
    gpu = env.node_groups[1]
    assert (gpu.min_size, gpu.desired_size, gpu.max_size) == (0, 0, 1)
    assert gpu.ami_family == "al2023" and gpu.device_mode == "dra" and gpu.efa == "auto" and gpu.efa_enabled
    assert gpu.capacity.kind == "on-demand" and gpu.capacity.reservation_id is None
    assert env.drivers.gpu == "python" and env.driver_image is None and env.warnings == ()


def test_yaml_on_off_and_numeric_account_are_understood(tmp_path):
    env = load(tmp_path, """\
        account: 123456789012
        region: us-east-2
        nodeGroups:
          - {name: a, instanceType: g6e.48xlarge, efa: off}
          - {name: b, instanceType: p5.48xlarge, efa: on}
    """)
    assert env.account == "123456789012"
    assert not env.node_groups[0].efa_enabled and env.node_groups[0].families == ("gpu",)
    assert env.node_groups[1].efa == "on"


def test_per_family_device_mode(tmp_path):
    env = load(tmp_path, "nodeGroups:\n" + SYSTEM +
               "  - {name: p5, instanceType: p5.48xlarge, deviceMode: {gpu: dra, efa: device-plugin}}\n")
    group = env.node_groups[1]
    assert group.manager("gpu") == "dra" and group.manager("efa") == "device-plugin"
    assert env.node_labels(group)["eks-dra.io/efa"] == "device-plugin"
    assert [t.key for t in env.node_taints(group)] == ["nvidia.com/gpu", "gpu.nvidia.com/not-ready"]


def test_custom_driver_names_drive_the_readiness_taints(tmp_path):
    env = load(tmp_path, "drivers: {names: {gpu: gpu.example.com}}\nnodeGroups:\n" + SYSTEM +
               "  - {name: g, instanceType: g6e.xlarge}\n")
    assert env.drivers.names.gpu == "gpu.example.com"
    assert "gpu.example.com/not-ready" in [t.key for t in env.node_taints(env.node_groups[1])]


def test_upstream_drivers_get_no_readiness_taint(tmp_path):
    # Vendor drivers never remove our <driver>/not-ready taint, so it must not be set for them.
    env = load(tmp_path, "drivers: {gpu: upstream}\nnodeGroups:\n" + SYSTEM +
               "  - {name: p5, instanceType: p5.48xlarge}\n")
    keys = [t.key for t in env.node_taints(env.node_groups[1])]
    assert "gpu.nvidia.com/not-ready" not in keys
    assert "dra.net/not-ready" in keys and "nvidia.com/gpu" in keys


def test_our_driver_and_the_vendors_never_share_a_name(tmp_path):
    # The vendor's driver is always named as upstream: naming it is an error, as is one of ours taking that name.
    body = "nodeGroups:\n" + SYSTEM + "  - {name: p5, instanceType: p5.48xlarge}\n"
    assert "drivers.names.gpu: drivers.gpu is upstream: the vendor's driver is always named gpu.nvidia.com; remove " \
           "this name" in error(tmp_path, "drivers: {gpu: upstream, names: {gpu: gpu.example.com}}\n" + body)
    assert "drivers.names.efa: 'gpu.nvidia.com' is the name of the upstream gpu driver that drivers.gpu: upstream " \
           "installs; two drivers cannot share one name in a cluster" in error(
               tmp_path, "drivers: {gpu: upstream, names: {efa: gpu.nvidia.com}}\n" + body)
    env = load(tmp_path, "drivers: {gpu: upstream}\n" + body)  # our EFA and Neuron drivers keep their names
    assert (env.drivers.names.efa, env.drivers.names.neuron) == ("dra.net", "neuron.aws.com")


GB200 = "  - {name: gb200, instanceType: p6e-gb200.36xlarge, capacity: 'capacity-block:cr-0123456789abcdef0', " \
        "availabilityZone: us-east-2a}\n"


def test_compute_domains_need_the_vendor_gpu_driver_and_gb200(tmp_path):
    body = "region: us-east-2\nvpc: {availabilityZones: [us-east-2a, us-east-2b]}\nnodeGroups:\n" + SYSTEM + GB200
    env = load(tmp_path, "computeDomains: true\ndrivers: {gpu: upstream}\n" + body)
    assert env.compute_domains and not load(tmp_path, body).compute_domains
    assert "computeDomains: ComputeDomains come from the NVIDIA driver's ComputeDomain controller, which eks-dra's " \
           "GPU driver does not have: set drivers.gpu: upstream" in error(tmp_path, "computeDomains: true\n" + body)
    no_gb200 = "region: us-east-2\ncomputeDomains: true\ndrivers: {gpu: upstream}\nnodeGroups:\n" + SYSTEM + \
        "  - {name: p5, instanceType: p5.48xlarge}\n"
    assert "computeDomains: needs a p6e-gb200 node group" in error(tmp_path, no_gb200)
    assert "computeDomains: must be" in error(tmp_path, "computeDomains: yes please\ndrivers: {gpu: upstream}\n" + body)


def test_existing_vpc(tmp_path):
    env = load(tmp_path, """\
        region: us-east-2
        vpc: {vpcId: vpc-0123456789abcdef0, privateSubnets: {us-east-2a: subnet-0123456789abcdef0}}
        nodeGroups:
          - {name: system, instanceType: m7i.xlarge}
    """)
    assert env.vpc.vpc_id == "vpc-0123456789abcdef0" and env.vpc.cidr is None
    assert env.vpc.private_subnets == {"us-east-2a": "subnet-0123456789abcdef0"}


# --- error messages: file, field path, fix ---

def test_unknown_key_names_file_field_and_suggests(tmp_path):
    msg = error(tmp_path, "nodeGroups:\n  - {name: a, instanceType: g6e.xlarge, desiredSzie: 1}\n")
    assert msg.startswith(f"{tmp_path}/test.yaml: nodeGroups[0].desiredSzie: unknown setting")
    assert "did you mean 'desiredSize'?" in msg


def test_unknown_top_level_key(tmp_path):
    assert "clusterNmae: unknown setting; did you mean 'clusterName'?" in error(
        tmp_path, "clusterNmae: x\nnodeGroups:\n" + SYSTEM)


def test_wrong_type(tmp_path):
    msg = error(tmp_path, "nodeGroups:\n  - {name: a, instanceType: g6e.xlarge, maxSize: many}\n")
    assert "nodeGroups[0].maxSize: must be an integer, got a string 'many'" in msg


def test_bad_choice_suggests(tmp_path):
    msg = error(tmp_path, "nodeGroups:\n  - {name: a, instanceType: g6e.xlarge, amiFamily: bottlerock}\n")
    assert "nodeGroups[0].amiFamily: 'bottlerock' is not allowed (did you mean 'bottlerocket'?)" in msg


def test_sizes(tmp_path):
    msg = error(tmp_path, "nodeGroups:\n  - {name: a, instanceType: g6e.xlarge, minSize: 3, maxSize: 2}\n")
    assert "nodeGroups[0].minSize: 3 is more than maxSize (2)" in msg


def test_missing_file_lists_known_environments():
    with pytest.raises(UserError, match=r"config/nope.yaml: no such environment file.*known environments: dev"):
        load_environment("nope", CONFIG)


def test_invalid_yaml_names_the_line(tmp_path):
    msg = error(tmp_path, "nodeGroups:\n  - {name: a\n")
    assert msg.startswith(f"{tmp_path}/test.yaml: line") and "not valid YAML" in msg


def test_no_node_groups(tmp_path):
    assert "nodeGroups: at least one node group is required" in error(tmp_path, "clusterName: x\n")


def test_version_as_float_loses_zero(tmp_path):
    assert "quote it" in error(tmp_path, "kubernetesVersion: 1.30\nnodeGroups:\n" + SYSTEM)


def test_availability_zone_needs_region_and_matching_vpc(tmp_path):
    msg = error(tmp_path, "nodeGroups:\n  - {name: a, instanceType: p5.48xlarge, availabilityZone: us-east-2a}\n")
    assert "nodeGroups[0].availabilityZone: availability zone 'us-east-2a' needs the top-level region" in msg
    msg = error(tmp_path, "region: us-east-2\nvpc: {availabilityZones: [us-east-2a]}\nnodeGroups:\n"
                "  - {name: a, instanceType: p5.48xlarge, availabilityZone: us-east-2b}\n")
    assert "us-east-2b is not one of the VPC's AZs (us-east-2a); add it to vpc.availabilityZones" in msg
    msg = error(tmp_path, "region: us-east-2\nnodeGroups:\n"
                "  - {name: a, instanceType: p5.48xlarge, availabilityZone: us-west-2a}\n")
    assert "'us-west-2a' is not an availability zone of region us-east-2" in msg


def test_invalid_labels_and_taints(tmp_path):
    msg = error(tmp_path, "nodeGroups:\n  - {name: a, instanceType: g6e.xlarge, labels: {'bad key!': x}}\n")
    assert "nodeGroups[0].labels.bad key!: is not a valid Kubernetes label key" in msg
    msg = error(tmp_path, "nodeGroups:\n  - {name: a, instanceType: g6e.xlarge, taints: [{key: a, effect: Never}]}\n")
    assert "nodeGroups[0].taints[0].effect: 'Never' is not allowed" in msg


def test_warning_without_system_group(tmp_path):
    env = load(tmp_path, "nodeGroups:\n  - {name: a, instanceType: g6e.xlarge}\n")
    assert any("no system (non-accelerator) node group" in w for w in env.warnings)


def test_pipeline_environment_needs_account(tmp_path):
    write_env(tmp_path, "nodeGroups:\n" + SYSTEM, "dev")
    (tmp_path / "pipeline.yaml").write_text(
        "environments: [dev]\nsource: {repository: o/r, connectionArn: arn:aws:codeconnections:x}\n")
    pipeline = load_pipeline(tmp_path)
    assert pipeline.environments[0].account is None  # rejected by the PipelineStack (see test_guards)
    (tmp_path / "pipeline.yaml").write_text("environments: [dev, dev]\nsource: {repository: o/r}\n")
    with pytest.raises(UserError, match="pipeline.yaml: environments: an environment is listed twice"):
        load_pipeline(tmp_path)
