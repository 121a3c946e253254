"""Every guard of the issue (§5) fails with one clear sentence naming the field and the fix; construct-level
guards name the construct; a bad config makes the CDK app exit 2 with one line and no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_config import SYSTEM, error, load

REPO = Path(__file__).resolve().parent.parent


def group(extra: str) -> str:
    return "region: us-east-2\nnodeGroups:\n" + SYSTEM + "  - {name: acc, " + extra + "}\n"


# --- config guards ---

def test_kubernetes_older_than_1_33_is_an_error(tmp_path):
    msg = error(tmp_path, 'kubernetesVersion: "1.32"\nnodeGroups:\n' + SYSTEM)
    assert msg.endswith('kubernetesVersion: 1.32 is too old: DRA on EKS needs 1.33 or later (GA in 1.34); '
                        'set kubernetesVersion: "1.34"')


def test_kubernetes_1_33_warns_naming_the_bug(tmp_path):
    env = load(tmp_path, 'kubernetesVersion: "1.33"\nnodeGroups:\n' + SYSTEM)
    assert env.kubernetes_version == "1.33"
    assert any("kubernetes/kubernetes#133920" in w and "kubernetesVersion" in w for w in env.warnings)


def test_auto_mode_is_rejected(tmp_path):
    msg = error(tmp_path, "autoMode: true\nnodeGroups:\n" + SYSTEM)
    assert "autoMode: EKS Auto Mode cannot be used with eks-dra's DRA drivers" in msg and "remove autoMode" in msg
    assert load(tmp_path, "autoMode: false\nnodeGroups:\n" + SYSTEM).node_groups


def test_karpenter_dynamic_capacity_is_rejected(tmp_path):
    msg = error(tmp_path, "karpenter: {nodePools: [gpu]}\nnodeGroups:\n" + SYSTEM)
    assert "karpenter: Karpenter dynamic capacity is not supported" in msg


def test_one_group_cannot_be_dra_and_device_plugin_for_one_family(tmp_path):
    msg = error(tmp_path, group("instanceType: p5.48xlarge, deviceMode: {gpu: [dra, device-plugin]}"))
    assert "nodeGroups[1].deviceMode.gpu: one node group cannot be in both DRA and device-plugin mode for gpu" in msg


def test_labels_that_would_steer_a_driver_and_a_plugin_onto_one_node_are_rejected(tmp_path):
    msg = error(tmp_path, group("instanceType: p5.48xlarge, labels: {eks-dra.io/gpu: device-plugin}"))
    assert "nodeGroups[1].labels.eks-dra.io/gpu: is set by eks-dra from the node group" in msg
    msg = error(tmp_path, group("instanceType: g6.12xlarge, deviceMode: device-plugin, "
                                "labels: {eks-dra.io/node-group: system}"))
    assert "labels.eks-dra.io/node-group: is set by eks-dra" in msg


def test_two_groups_with_one_name_are_rejected(tmp_path):
    msg = error(tmp_path, "nodeGroups:\n" + SYSTEM + "  - {name: gpu, instanceType: g6e.xlarge}\n"
                "  - {name: gpu, instanceType: g6e.xlarge, deviceMode: device-plugin}\n")
    assert "nodeGroups[2].name: 'gpu' is already used by nodeGroups[1]" in msg
    assert "a DRA driver and a device plugin could land on the same nodes" in msg


def test_instance_type_not_in_catalog_names_the_closest(tmp_path):
    msg = error(tmp_path, group("instanceType: p5.48xlarg"))
    assert "nodeGroups[1].instanceType: 'p5.48xlarge'" not in msg
    assert "'p5.48xlarg' is not in the eks-dra instance catalog; closest: p5.48xlarge" in msg


def test_efa_on_for_a_type_without_efa(tmp_path):
    for instance in ("inf2.48xlarge", "g6.xlarge"):
        msg = error(tmp_path, group(f"instanceType: {instance}, efa: 'on'"))
        assert f"nodeGroups[1].efa: {instance} has no EFA; set efa: off (or auto)" in msg


def test_capacity_block_without_reservation_id(tmp_path):
    msg = error(tmp_path, group("instanceType: p5.48xlarge, capacity: capacity-block"))
    assert msg.endswith("nodeGroups[1].capacity: a Capacity Block needs its reservation id; write "
                        "capacity-block:cr-0123456789abcdef0")
    msg = error(tmp_path, group("instanceType: p5.48xlarge, capacity: 'odcr:'"))
    assert "an On-Demand Capacity Reservation needs its reservation id; write odcr:cr-" in msg
    msg = error(tmp_path, group("instanceType: p5.48xlarge, capacity: 'odcr:abc'"))
    assert "'abc' is not a capacity reservation id" in msg


def test_capacity_block_desired_size_warns(tmp_path):
    env = load(tmp_path, group("instanceType: p5.48xlarge, capacity: 'capacity-block:cr-0123456789abcdef0', "
                               "desiredSize: 1, maxSize: 1"))
    assert any("desiredSize 0 before" in w for w in env.warnings)


def test_ami_family_that_cannot_run_the_type(tmp_path):
    msg = error(tmp_path, group("instanceType: p6e-gb200.36xlarge, amiFamily: bottlerocket, "
                                "capacity: 'capacity-block:cr-0123456789abcdef0'"))
    assert "nodeGroups[1].amiFamily: Bottlerocket NVIDIA AMIs do not support p6e-gb200.36xlarge" in msg
    msg = error(tmp_path, group("instanceType: trn2.48xlarge, amiType: AL2023_x86_64_NVIDIA"))
    assert "nodeGroups[1].amiType: AL2023_x86_64_NVIDIA cannot run trn2.48xlarge" in msg
    assert "use AL2023_x86_64_NEURON" in msg
    msg = error(tmp_path, group("instanceType: p6e-gb200.36xlarge, amiType: AL2023_x86_64_NVIDIA, "
                                "capacity: 'capacity-block:cr-0123456789abcdef0'"))
    assert "cannot run p6e-gb200.36xlarge (arm64, gpu)" in msg and "use AL2023_ARM_64_NVIDIA" in msg


def test_ami_types_per_family_and_architecture(tmp_path):
    env = load(tmp_path, """\
        nodeGroups:
          - {name: sys-arm, instanceType: m7g.large}
          - {name: gb200, instanceType: p6e-gb200.36xlarge, capacity: 'capacity-block:cr-0123456789abcdef0'}
          - {name: trn-br, instanceType: trn2.48xlarge, amiFamily: bottlerocket, amiType: BOTTLEROCKET_x86_64}
          - {name: inf2, instanceType: inf2.xlarge}
    """)
    assert [g.ami_type for g in env.node_groups] == [
        "AL2023_ARM_64_STANDARD", "AL2023_ARM_64_NVIDIA", "BOTTLEROCKET_x86_64", "AL2023_x86_64_NEURON"]
    assert any("Neuron DRA on Bottlerocket" in w for w in env.warnings)


def test_p6e_gb200_needs_a_capacity_block(tmp_path):
    msg = error(tmp_path, group("instanceType: p6e-gb200.36xlarge"))
    assert "p6e-gb200.36xlarge is sold only as Capacity Blocks" in msg


def test_mig_profile_guards(tmp_path):
    assert "NVIDIA L40S (g6e.48xlarge) is not MIG-capable" in error(
        tmp_path, group("instanceType: g6e.48xlarge, migProfile: 1g.5gb"))
    assert "'1g.5gb' is not a MIG profile of NVIDIA H100 80GB HBM3; use one of: 1g.10gb" in error(
        tmp_path, group("instanceType: p5.48xlarge, migProfile: 1g.5gb"))
    assert "static MIG is created at boot by an AL2023 script" in error(
        tmp_path, group("instanceType: p4d.24xlarge, amiFamily: bottlerocket, migProfile: 1g.5gb"))
    assert "trn2.48xlarge has no NVIDIA GPU; remove migProfile" in error(
        tmp_path, group("instanceType: trn2.48xlarge, migProfile: 1g.5gb"))


# --- construct guards (for users of the constructs from their own CDK app) ---

@pytest.fixture(scope="module")
def scratch_stack():
    import aws_cdk as cdk
    from aws_cdk import aws_ec2 as ec2

    stack = cdk.Stack(cdk.App(), "Guards")
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=1)
    return stack, vpc


def test_construct_guards_name_the_construct_and_fix(scratch_stack):
    from eks_dra.constructs import (
        AcceleratorCluster,
        AcceleratorClusterProps,
        AcceleratorNodeGroupProps,
        EfaLaunchTemplate,
        EfaLaunchTemplateProps,
    )

    stack, vpc = scratch_stack
    with pytest.raises(ValueError, match=r"AcceleratorCluster Guards/Old: vpc_cni_version v1.18.0-eksbuild.1 is "
                                         r"older than v1.18.5, which efa-only interfaces need"):
        AcceleratorCluster(stack, "Old", AcceleratorClusterProps(vpc=vpc, vpc_cni_version="v1.18.0-eksbuild.1"))
    with pytest.raises(ValueError, match=r"AcceleratorCluster Guards/V132: kubernetes_version '1.32' is not supported"):
        AcceleratorCluster(stack, "V132", AcceleratorClusterProps(vpc=vpc, kubernetes_version="1.32"))
    with pytest.raises(ValueError, match=r"EfaLaunchTemplate Guards/Cb: capacity_kind 'capacity-block' needs "
                                         r"reservation_id='cr-...'"):
        EfaLaunchTemplate(stack, "Cb", EfaLaunchTemplateProps(instance_type="p5.48xlarge", capacity_kind="capacity-block"))
    with pytest.raises(ValueError, match=r"a placement group with a reservation rejects the reserved instances"):
        EfaLaunchTemplate(stack, "Pg", EfaLaunchTemplateProps(
            instance_type="p5.48xlarge", capacity_kind="odcr", reservation_id="cr-0123456789abcdef0",
            placement_group=True))
    with pytest.raises(ValueError, match=r"efa=True needs cluster_security_group_id and efa_security_group"):
        EfaLaunchTemplate(stack, "NoSg", EfaLaunchTemplateProps(instance_type="p5.48xlarge", efa=True))

    cluster = AcceleratorCluster(stack, "Cluster", AcceleratorClusterProps(vpc=vpc))
    with pytest.raises(ValueError, match=r"AcceleratorNodeGroup Guards/Cluster/TwoAz: EFA and reserved capacity need "
                                         r"exactly one subnet \(one AZ\), got 2"):
        cluster.add_node_group("TwoAz", AcceleratorNodeGroupProps(
            cluster=cluster.cluster, instance_type="p5.48xlarge", ami_type="AL2023_x86_64_NVIDIA",
            subnets=cluster.private_subnets(), efa=True))
    with pytest.raises(ValueError, match=r"ami_type 'AL2_GPU' is not an EKS AMI type"):
        cluster.add_node_group("BadAmi", AcceleratorNodeGroupProps(
            cluster=cluster.cluster, instance_type="p5.48xlarge", ami_type="AL2_GPU",
            subnets=cluster.private_subnets()[:1]))


def test_pipeline_rejects_environment_without_account(tmp_path):
    import aws_cdk as cdk

    from eks_dra.config import load_pipeline
    from eks_dra.errors import UserError
    from eks_dra.stacks.pipeline_stack import PipelineStack

    (tmp_path / "dev.yaml").write_text("nodeGroups:\n" + SYSTEM)
    (tmp_path / "pipeline.yaml").write_text(
        "environments: [dev]\nsource: {repository: o/r, connectionArn: arn:aws:codeconnections:x}\n")
    with pytest.raises(UserError, match=r"dev.yaml: account and region are required for an environment the pipeline"):
        PipelineStack(cdk.App(), "P", load_pipeline(tmp_path))


# --- the app: exit 2, one line, no traceback ---

@pytest.mark.parametrize("context, expected", [
    ({"env": "does-not-exist"}, "eks-dra: error: config/does-not-exist.yaml: no such environment file"),
    ({"env": "../etc"}, "eks-dra: error: environment name '../etc' is not valid"),
])
def test_app_exits_2_with_one_line(tmp_path, context, expected):
    env = dict(os.environ, CDK_CONTEXT_JSON=json.dumps(context), CDK_OUTDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "app.py"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("eks-dra")]
    assert lines == [lines[0]] and lines[0].startswith(expected)
    assert "Traceback" not in proc.stderr
