"""The versions table: what each Kubernetes version accepts, warns about and synthesizes."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from eks_dra.errors import UserError
from eks_dra.versions import (
    DEFAULT_KUBERNETES_VERSION,
    DRA_DEVICE_TAINTS,
    DRA_EXTENDED_RESOURCE,
    RESOURCE_HEALTH_STATUS,
    VERSIONS,
    check_upgrade,
    validate_kubernetes_version,
)

DAY = dt.date(2026, 12, 1)
SYSTEM = "  - {name: system, instanceType: m7i.xlarge, minSize: 1, desiredSize: 1, maxSize: 2}\n"


def test_supported_versions_and_default():
    assert list(VERSIONS) == ["1.33", "1.34", "1.35", "1.36"]
    assert DEFAULT_KUBERNETES_VERSION == "1.34"
    assert validate_kubernetes_version("1.34", DAY) == []
    assert validate_kubernetes_version("1.35", DAY) == []
    assert validate_kubernetes_version("1.36", DAY) == []


def test_1_33_warns_of_the_bug_and_of_extended_support():
    warnings = validate_kubernetes_version("1.33", DAY)
    assert any("kubernetes/kubernetes#133920" in w for w in warnings)
    assert any("left EKS standard support on 2026-07-29" in w and "$0.60 per cluster-hour instead of $0.10" in w
               and 'upgrade to "1.34"' in w for w in warnings)


def test_past_end_of_standard_support_warns_with_date_and_price():
    assert validate_kubernetes_version("1.34", dt.date(2026, 12, 1)) == []
    (warning,) = validate_kubernetes_version("1.34", dt.date(2026, 12, 2))
    assert warning == ('1.34 left EKS standard support on 2026-12-02: the cluster costs $0.60 per cluster-hour '
                       'instead of $0.10 until 2027-12-02; upgrade to "1.35" (one minor at a time)')
    assert validate_kubernetes_version("1.36", dt.date(2027, 8, 1)) == []
    assert "2027-08-02" in validate_kubernetes_version("1.36", dt.date(2027, 8, 2))[0]


def test_past_end_of_extended_support_is_refused():
    with pytest.raises(ValueError, match=r'^1.34 left EKS extended support on 2027-12-02; EKS has upgraded such '
                                         r'clusters: set kubernetesVersion: "1.35"$'):
        validate_kubernetes_version("1.34", dt.date(2027, 12, 2))


@pytest.mark.parametrize("version", ["1.37", "1.40"])
def test_newer_versions_are_refused_with_the_reason(version):
    with pytest.raises(ValueError) as info:
        validate_kubernetes_version(version, DAY)
    message = str(info.value)
    assert message.startswith(f"{version} is not supported yet: the pinned aws-cdk-lib has no KubernetesVersion")
    assert "EKS availability is unconfirmed" in message and "use 1.36 or older" in message
    assert "\n" not in message


@pytest.mark.parametrize(("version", "reason"), [
    ("1.32", "1.32 is too old: DRA on EKS needs 1.33 or later"),
    ("2.0", "'2.0' is not a Kubernetes minor version"),
    ("1.36.3", "'1.36.3' is not a Kubernetes minor version"),
])
def test_bad_versions(version, reason):
    with pytest.raises(ValueError, match="^" + reason.replace(".", r"\.")):
        validate_kubernetes_version(version, DAY)


def test_the_config_file_names_the_field_and_carries_the_warnings(tmp_path):
    from eks_dra.config import load_environment

    (tmp_path / "new.yaml").write_text('kubernetesVersion: "1.37"\nnodeGroups:\n' + SYSTEM)
    with pytest.raises(UserError, match=r"new\.yaml: kubernetesVersion: 1\.37 is not supported yet"):
        load_environment("new", tmp_path)
    (tmp_path / "old.yaml").write_text('kubernetesVersion: "1.33"\nnodeGroups:\n' + SYSTEM)
    warnings = load_environment("old", tmp_path).warnings
    assert any("old.yaml: kubernetesVersion: 1.33 left EKS standard support" in w for w in warnings)
    (tmp_path / "now.yaml").write_text('kubernetesVersion: "1.36"\nnodeGroups:\n' + SYSTEM)
    assert load_environment("now", tmp_path).kubernetes_version == "1.36"


def test_dra_gates_follow_the_kubernetes_feature_table():
    for version in ("1.33", "1.34", "1.35"):
        row = VERSIONS[version]
        assert not row.gate(DRA_EXTENDED_RESOURCE) and not row.gate(DRA_DEVICE_TAINTS)
        assert not row.gate(RESOURCE_HEALTH_STATUS)
    row = VERSIONS["1.36"]
    assert row.gate(DRA_EXTENDED_RESOURCE) and row.gate(DRA_DEVICE_TAINTS) and row.gate(RESOURCE_HEALTH_STATUS)


@pytest.mark.parametrize(("deployed", "wanted", "reason"), [
    ("1.34", "1.34", None),
    ("1.34", "1.35", None),
    ("1.35", "1.36", None),
    ("1.34", "1.36", 'the cluster runs 1.34 and EKS upgrades one minor version at a time; set kubernetesVersion: '
                     '"1.35", deploy, then "1.36"'),
    ("1.36", "1.35", 'the cluster runs 1.36 and EKS cannot downgrade a control plane to 1.35; keep '
                     'kubernetesVersion: "1.36"'),
])
def test_upgrades_go_one_minor_at_a_time(deployed, wanted, reason):
    assert check_upgrade(deployed, wanted) == reason


def test_every_kubectl_layer_of_the_table_is_installed():
    import importlib
    import importlib.metadata

    for row in VERSIONS.values():
        assert importlib.metadata.version(row.kubectl_layer_package)
        assert hasattr(importlib.import_module(row.kubectl_layer_module), row.kubectl_layer_class)
        assert importlib.metadata.version(row.cdk8s_plus_package)


# --- synthesized, one stack per version ---

@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    import aws_cdk as cdk
    from aws_cdk import aws_ec2 as ec2

    from eks_dra.constructs import AcceleratorCluster, AcceleratorClusterProps, AcceleratorNodeGroupProps

    outdir = tmp_path_factory.mktemp("cdk")
    app = cdk.App(outdir=str(outdir))
    for version in VERSIONS:
        stack = cdk.Stack(app, "V" + version.replace(".", ""))
        vpc = ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=1)
        cluster = AcceleratorCluster(stack, "Cluster", AcceleratorClusterProps(vpc=vpc, kubernetes_version=version))
        cluster.add_node_group("System", AcceleratorNodeGroupProps(
            cluster=cluster.cluster, instance_type="m7i.large", ami_type="AL2023_x86_64_STANDARD",
            subnets=cluster.private_subnets()))
    app.synth()
    return {v: json.loads((outdir / f"V{v.replace('.', '')}.template.json").read_text()) for v in VERSIONS}


def _resources(template: dict, kind: str) -> list[dict]:
    return [r["Properties"] for r in template["Resources"].values() if r["Type"] == kind]


@pytest.mark.parametrize("version", list(VERSIONS))
def test_synth_per_version(templates, version):
    template = templates[version]
    row = VERSIONS[version]
    (cluster,) = _resources(template, "AWS::EKS::Cluster")
    assert cluster["Version"] == version
    # The node group names the version too: changing kubernetesVersion rolls it after the control plane.
    (group,) = _resources(template, "AWS::EKS::Nodegroup")
    assert group["Version"] == version
    (layer,) = [p for p in _resources(template, "AWS::Lambda::LayerVersion") if "kubectl" in p.get("Description", "")]
    minor = row.kubectl_layer_module.rsplit("_v", 1)[1]
    assert f"kubectl 1.{minor}" in layer["Description"] or f"kubectl v1.{minor}" in layer["Description"], layer
    addons = {a["AddonName"]: a.get("AddonVersion") for a in _resources(template, "AWS::EKS::Addon")}
    assert addons == {"vpc-cni": row.addons.vpc_cni, "kube-proxy": row.addons.kube_proxy,
                      "eks-pod-identity-agent": row.addons.pod_identity_agent, "coredns": row.addons.coredns}


def test_each_new_version_has_its_own_kubectl_layer():
    assert [VERSIONS[v].kubectl_layer_class for v in ("1.34", "1.35", "1.36")] == [
        "KubectlV34Layer", "KubectlV35Layer", "KubectlV36Layer"]

