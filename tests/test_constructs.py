"""The reusable constructs on their own, in a scratch stack (as another team's CDK app would use them)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from eks_dra.catalog import INSTANCE_TYPES
from eks_dra.constructs import efa_interface_layout

EFA_TYPES = sorted(n for n, t in INSTANCE_TYPES.items() if t.efa_supported and t.max_efa_interfaces)


@pytest.mark.parametrize("name", EFA_TYPES)
def test_efa_layout_follows_the_ec2_rule_for_every_catalog_type(name):
    inst = INSTANCE_TYPES[name]
    slots = efa_interface_layout(name)
    assert slots[0].network_card == 0 and slots[0].device_index == 0 and slots[0].interface_type == "interface"
    efa = [s for s in slots if s.interface_type == "efa-only"]
    assert len(efa) == inst.max_efa_interfaces
    assert len({(s.network_card, s.device_index) for s in slots}) == len(slots)
    assert all(s.network_card < inst.network_cards for s in slots)
    assert len(slots) <= inst.max_network_interfaces
    for s in efa:
        assert s.device_index == (1 if s.network_card == 0 else 0)
    assert any(s.network_card == 0 for s in efa) == inst.efa_on_card0


def test_card0_ena_only_layout():
    slots = efa_interface_layout("p6e-gb200.36xlarge")
    assert [(s.network_card, s.device_index, s.interface_type) for s in slots][:2] == [
        (0, 0, "interface"), (1, 0, "efa-only")]
    assert efa_interface_layout("p5.48xlarge", efa=False) == slots[:1]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """One stack with a cluster and one node group per interesting case, synthesized once."""
    import aws_cdk as cdk
    from aws_cdk import aws_ec2 as ec2
    from aws_cdk import aws_ecr_assets as ecr_assets

    from eks_dra.constructs import AcceleratorCluster, AcceleratorClusterProps, AcceleratorNodeGroupProps, NodeTaint
    from eks_dra.stacks.cluster_stack import IMAGE_EXCLUDE

    outdir = tmp_path_factory.mktemp("cdk")
    app = cdk.App(outdir=str(outdir))
    stack = cdk.Stack(app, "Scratch")
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=1)
    cluster = AcceleratorCluster(stack, "Gpu", AcceleratorClusterProps(vpc=vpc, cluster_name="scratch",
                                                                      admin_role_arns=["arn:aws:iam::1:role/a"]))
    one_az = cluster.private_subnets()[:1]

    def add(cid, **kw):
        kw.setdefault("subnets", one_az)
        return cluster.add_node_group(cid, AcceleratorNodeGroupProps(cluster=cluster.cluster, nodegroup_name=cid, **kw))

    add("system", instance_type="m7i.large", ami_type="AL2023_x86_64_STANDARD", subnets=cluster.private_subnets(),
        min_size=1, desired_size=1, max_size=2)
    add("b200", instance_type="p6-b200.48xlarge", ami_type="AL2023_x86_64_NVIDIA", efa=True,
        taints=[NodeTaint("nvidia.com/gpu")])
    add("trn2-br", instance_type="trn2.48xlarge", ami_type="BOTTLEROCKET_x86_64", efa=True,
        neuron_device_ownership=True, capacity_kind="odcr", reservation_id="cr-0123456789abcdef0")
    add("gb200", instance_type="p6e-gb200.36xlarge", ami_type="AL2023_ARM_64_NVIDIA", efa=True,
        capacity_kind="capacity-block", reservation_id="cr-0123456789abcdef1")
    add("g6e-br", instance_type="g6e.48xlarge", ami_type="BOTTLEROCKET_x86_64_NVIDIA",
        disable_nvidia_device_plugin=True)

    # The driver image's build context: only the allowed paths are staged, never .venv or node_modules.
    context = tmp_path_factory.mktemp("context")
    for rel in ("Dockerfile", "pyproject.toml", "requirements.lock", "README.md", "eks_dra/__init__.py",
                "eks_dra/drivers/main.py", ".venv/bin/python", "node_modules/x/index.js", "tests/test_x.py",
                "cdk.out/manifest.json", "eks_dra/__pycache__/x.pyc"):
        (context / rel).parent.mkdir(parents=True, exist_ok=True)
        (context / rel).write_text("FROM scratch\n" if rel == "Dockerfile" else "x\n")
    ecr_assets.DockerImageAsset(stack, "Image", directory=str(context), exclude=IMAGE_EXCLUDE)

    app.synth()
    template = json.loads((outdir / "Scratch.template.json").read_text())
    return outdir, template


def _node_groups(template):
    res = template["Resources"]
    out = {}
    for ng in (v for v in res.values() if v["Type"] == "AWS::EKS::Nodegroup"):
        props = ng["Properties"]
        out[props["NodegroupName"]] = (props, res[props["LaunchTemplate"]["Id"]["Ref"]]["Properties"]
                                       ["LaunchTemplateData"])
    return out


def test_hyphenated_p6_names_pass_through_the_launch_template(scratch):
    _, template = scratch
    groups = _node_groups(template)
    props, lt = groups["b200"]
    assert lt["InstanceType"] == "p6-b200.48xlarge" and props["AmiType"] == "AL2023_x86_64_NVIDIA"
    assert len([i for i in lt["NetworkInterfaces"] if i["InterfaceType"] == "efa-only"]) == 8
    assert "Placement" in lt
    props, lt = groups["gb200"]
    assert props["AmiType"] == "AL2023_ARM_64_NVIDIA" and props["CapacityType"] == "CAPACITY_BLOCK"
    assert lt["InstanceMarketOptions"]["MarketType"] == "capacity-block" and "Placement" not in lt


def test_bottlerocket_settings(scratch):
    _, template = scratch
    groups = _node_groups(template)
    _, trn2 = groups["trn2-br"]
    toml = trn2["UserData"]["Fn::Base64"]
    assert tomllib.loads(toml)["settings"]["kubernetes"]["device-ownership-from-security-context"] is True
    assert "kubelet-device-plugins" not in toml
    assert [b["DeviceName"] for b in trn2["BlockDeviceMappings"]] == ["/dev/xvda", "/dev/xvdb"]
    assert "Placement" not in trn2  # ODCR: never a placement group
    assert "InstanceMarketOptions" not in trn2
    _, g6e = groups["g6e-br"]
    assert "[settings.kubelet-device-plugins.nvidia]\nenabled = false" in g6e["UserData"]["Fn::Base64"]
    assert "NetworkInterfaces" not in g6e


def test_system_group_spans_azs_and_carries_no_user_data(scratch):
    _, template = scratch
    props, lt = _node_groups(template)["system"]
    assert len(props["Subnets"]) == 2 and "UserData" not in lt and "NetworkInterfaces" not in lt
    assert lt["MetadataOptions"] == {"HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1, "HttpTokens": "required"}


def test_efa_security_group_references_itself(scratch):
    _, template = scratch
    res = template["Resources"]
    ingress = [v["Properties"] for v in res.values() if v["Type"] == "AWS::EC2::SecurityGroupIngress"
               and "EfaSecurityGroup" in json.dumps(v["Properties"].get("SourceSecurityGroupId", ""))]
    assert ingress and all(i["IpProtocol"] == "-1" for i in ingress)
    assert all(json.dumps(i["GroupId"]) == json.dumps(i["SourceSecurityGroupId"]) for i in ingress)


def test_no_hidden_neuron_device_plugin_and_no_auto_mode(scratch):
    _, template = scratch
    types = {v["Type"] for v in template["Resources"].values()}
    assert "Custom::AWSCDK-EKS-KubernetesResource" not in types
    cluster = next(v for v in template["Resources"].values() if v["Type"] == "AWS::EKS::Cluster")["Properties"]
    assert cluster["ComputeConfig"] == {"Enabled": False} and cluster["Version"] == "1.34"
    assert cluster["BootstrapSelfManagedAddons"] is False


def test_coredns_waits_for_the_first_untainted_group_and_nodes_for_the_cni(scratch):
    _, template = scratch
    res = template["Resources"]
    coredns = next(k for k, v in res.items() if v["Type"] == "AWS::EKS::Addon"
                   and v["Properties"]["AddonName"] == "coredns")
    vpc_cni = next(k for k, v in res.items() if v["Type"] == "AWS::EKS::Addon"
                   and v["Properties"]["AddonName"] == "vpc-cni")
    system_ng = next(k for k, v in res.items() if v["Type"] == "AWS::EKS::Nodegroup"
                     and v["Properties"]["NodegroupName"] == "system")
    assert system_ng in res[coredns].get("DependsOn", [])
    for k, v in res.items():
        if v["Type"] == "AWS::EKS::Nodegroup":
            assert vpc_cni in v.get("DependsOn", []), k


def test_access_entry_for_admin_role(scratch):
    _, template = scratch
    entries = [v["Properties"] for v in template["Resources"].values() if v["Type"] == "AWS::EKS::AccessEntry"]
    admin = [e for e in entries if e["PrincipalArn"] == "arn:aws:iam::1:role/a"]
    assert admin and "AmazonEKSClusterAdminPolicy" in json.dumps(admin[0]["AccessPolicies"])


def test_driver_image_context_is_only_the_allowed_paths(scratch):
    outdir, _ = scratch
    staged = [p for p in Path(outdir).iterdir() if p.is_dir() and p.name.startswith("asset.")
              and (p / "Dockerfile").exists()]
    assert len(staged) == 1
    files = sorted(p.relative_to(staged[0]).as_posix() for p in staged[0].rglob("*") if p.is_file())
    assert files == ["Dockerfile", "README.md", "eks_dra/__init__.py", "eks_dra/drivers/main.py", "pyproject.toml",
                     "requirements.lock"]
