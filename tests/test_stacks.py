"""The shipped environments' synthesized templates: cluster, node groups, launch templates, pipeline.

Synth costs seconds per app, so every environment is synthesized once per test session (`synth_environment`
is cached and also used by test_cfn_lint_nag.py).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from eks_dra.catalog import get_instance_type
from eks_dra.config import load_environment

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "config"
SHIPPED = ("dev", "staging", "prod")


@dataclass
class Synthesized:
    outdir: Path
    templates: dict[str, dict]  # template file name -> template
    nag_report: dict | None  # validation-report.json when the cdk-nag plugin failed the synth
    synth_error: str | None


def _load_app_module():
    spec = importlib.util.spec_from_file_location("eks_dra_app", REPO / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cdk_json_context() -> dict:
    return json.loads((REPO / "cdk.json").read_text())["context"]


@functools.cache
def synth_environment(name: str) -> Synthesized:
    """Synthesize `-c env=NAME` (or `-c pipeline=true` for name 'pipeline') exactly as app.py does."""
    import aws_cdk as cdk

    outdir = Path(tempfile.mkdtemp(prefix=f"eks-dra-synth-{name}-"))
    # The CLI passes cdk.json's context (the feature flags) to the app; so does this.
    context = {**cdk_json_context(), **({"pipeline": "true"} if name == "pipeline" else {"env": name})}
    app = cdk.App(outdir=str(outdir), context=context)
    _load_app_module().build_app(app, CONFIG, manifests_dir=outdir / "dist")
    error = None
    try:
        app.synth()
    except RuntimeError as exc:  # cdk-nag findings: the templates are written, the report says why
        error = str(exc)
    templates = {p.relative_to(outdir).as_posix(): json.loads(p.read_text()) for p in outdir.rglob("*.template.json")}
    report_path = outdir / "validation-report.json"
    report = json.loads(report_path.read_text()) if error and report_path.exists() else None
    return Synthesized(outdir, templates, report, error)


def cluster_template(name: str) -> dict:
    synthesized = synth_environment(name)
    return synthesized.templates[f"EksDra-{name}.template.json"]


def resources(template: dict, kind: str) -> dict[str, dict]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == kind}


def node_groups_with_templates(name: str) -> list[tuple[dict, dict]]:
    """(Nodegroup properties, LaunchTemplateData) per node group."""
    template = cluster_template(name)
    lts = resources(template, "AWS::EC2::LaunchTemplate")
    out = []
    for ng in resources(template, "AWS::EKS::Nodegroup").values():
        props = ng["Properties"]
        lt_id = props["LaunchTemplate"]["Id"]["Ref"]
        out.append((props, lts[lt_id]["Properties"]["LaunchTemplateData"]))
    return out


def _group_name(props: dict) -> str:
    """Node groups have generated names (replaceable); the config name is the eks-dra.io/node-group label."""
    return props["Labels"]["eks-dra.io/node-group"]


@pytest.fixture(scope="module", params=SHIPPED)
def env_name(request) -> str:
    return request.param


def test_cluster_is_1_34_without_auto_mode(env_name):
    from aws_cdk.assertions import Match, Template

    template = Template.from_json(cluster_template(env_name))
    template.resource_count_is("AWS::EKS::Cluster", 1)
    template.has_resource_properties("AWS::EKS::Cluster", {
        "Version": "1.34",
        "ComputeConfig": {"Enabled": False},
        "AccessConfig": {"AuthenticationMode": "API"},
        "EncryptionConfig": [{"Resources": ["secrets"], "Provider": {"KeyArn": Match.any_value()}}],
        "Logging": {"ClusterLogging": {"EnabledTypes": Match.array_with([{"Type": "api"}, {"Type": "audit"}])}},
    })
    cluster = next(iter(resources(cluster_template(env_name), "AWS::EKS::Cluster").values()))["Properties"]
    assert "StorageConfig" not in cluster or not cluster["StorageConfig"]["BlockStorage"]["Enabled"]
    assert cluster.get("KubernetesNetworkConfig", {}).get("ElasticLoadBalancing", {}).get("Enabled") is not True


def test_core_addons_and_vpc_cni_supports_efa_only(env_name):
    addons = {a["Properties"]["AddonName"]: a["Properties"] for a in
              resources(cluster_template(env_name), "AWS::EKS::Addon").values()}
    assert set(addons) == {"vpc-cni", "coredns", "kube-proxy", "eks-pod-identity-agent"}
    major, minor, patch = (int(x) for x in addons["vpc-cni"]["AddonVersion"][1:].split("-")[0].split("."))
    assert (major, minor, patch) >= (1, 18, 5)


def test_kubectl_provider_uses_v34_layer(env_name):
    tree = json.loads((synth_environment(env_name).outdir / "tree.json").read_text())
    paths = []

    def walk(node):
        paths.append((node.get("path", ""), node.get("constructInfo", {}).get("fqn", "")))
        for child in node.get("children", {}).values():
            walk(child)

    walk(tree["tree"])
    assert any(fqn.endswith("KubectlV34Layer") for _, fqn in paths)
    assert not any("add_nodegroup_capacity" in p or "NeuronDevicePlugin" in p for p, _ in paths)


def test_every_node_group_matches_its_config(env_name):
    env = load_environment(env_name, CONFIG)
    by_name = {_group_name(props): (props, lt) for props, lt in node_groups_with_templates(env_name)}
    assert set(by_name) == {g.name for g in env.node_groups}
    for group in env.node_groups:
        props, lt = by_name[group.name]
        assert props["AmiType"] == group.ami_type, group.name
        expected_capacity = "CAPACITY_BLOCK" if group.capacity.kind == "capacity-block" else "ON_DEMAND"
        assert props["CapacityType"] == expected_capacity, group.name
        assert props["ScalingConfig"] == {"MinSize": group.min_size, "DesiredSize": group.desired_size,
                                          "MaxSize": group.max_size}
        # The instance type lives only in the launch template.
        assert "InstanceTypes" not in props
        assert lt["InstanceType"] == group.instance_type
        assert props["Labels"] == env.node_labels(group)
        taints = {(t["Key"], t["Value"], t["Effect"]) for t in props.get("Taints", [])}
        effect = {"NoSchedule": "NO_SCHEDULE", "PreferNoSchedule": "PREFER_NO_SCHEDULE", "NoExecute": "NO_EXECUTE"}
        assert taints == {(t.key, t.value, effect[t.effect]) for t in env.node_taints(group)}
        # IMDSv2 and encrypted volumes everywhere.
        assert lt["MetadataOptions"]["HttpTokens"] == "required"
        assert lt["BlockDeviceMappings"] and all(b["Ebs"]["Encrypted"] for b in lt["BlockDeviceMappings"])
        if group.efa_enabled or group.capacity.reserved:
            assert len(props["Subnets"]) == 1, f"{group.name}: EFA/reserved groups use one AZ"


def test_labels_and_taints_follow_the_contract():
    env = load_environment("dev", CONFIG)
    by_name = {_group_name(props): props for props, _ in node_groups_with_templates("dev")}
    p5 = by_name["p5-dra"]
    assert p5["Labels"]["eks-dra.io/gpu"] == "dra" and p5["Labels"]["eks-dra.io/efa"] == "dra"
    assert p5["Labels"]["nvidia.com/gpu.present"] == "true"
    assert {"Key": "gpu.nvidia.com/not-ready", "Value": "true", "Effect": "NO_SCHEDULE"} in p5["Taints"]
    trn2 = by_name["trn2-dra"]
    assert trn2["Labels"]["eks-dra.io/neuron"] == "dra"
    assert {"Key": "aws.amazon.com/neuron", "Value": "true", "Effect": "NO_SCHEDULE"} in trn2["Taints"]
    plugin = by_name["g6-device-plugin"]
    assert plugin["Labels"]["eks-dra.io/gpu"] == "device-plugin"
    assert not any(t["Key"].endswith("/not-ready") for t in plugin["Taints"])
    assert by_name["system"].get("Taints", []) == []
    assert env.dra_node_groups("neuron")[0].name == "trn2-dra"


def test_efa_interfaces_follow_the_catalog(env_name):
    env = load_environment(env_name, CONFIG)
    lts = {_group_name(props): lt for props, lt in node_groups_with_templates(env_name)}
    for group in env.node_groups:
        lt = lts[group.name]
        if not group.efa_enabled:
            assert "NetworkInterfaces" not in lt, group.name
            continue
        inst = get_instance_type(group.instance_type)
        interfaces = lt["NetworkInterfaces"]
        efa_only = [i for i in interfaces if i["InterfaceType"] == "efa-only"]
        assert len(efa_only) == inst.max_efa_interfaces
        primary = [i for i in interfaces if i["InterfaceType"] == "interface"]
        assert [(i["NetworkCardIndex"], i["DeviceIndex"]) for i in primary] == [(0, 0)]
        cards = sorted(i["NetworkCardIndex"] for i in efa_only)
        assert cards == list(range(inst.max_efa_interfaces))
        assert all(i["DeviceIndex"] == (1 if i["NetworkCardIndex"] == 0 else 0) for i in efa_only)
        assert max(cards) < inst.network_cards
        for i in interfaces:
            assert "SubnetId" not in i
            assert len(i["Groups"]) == 2  # the self-referencing EFA group and the cluster security group


def test_placement_group_only_for_plain_on_demand_efa(env_name):
    env = load_environment(env_name, CONFIG)
    lts = {_group_name(props): lt for props, lt in node_groups_with_templates(env_name)}
    for group in env.node_groups:
        has_pg = "Placement" in lts[group.name]
        assert has_pg == (group.efa_enabled and group.capacity.kind == "on-demand"), group.name
    pgs = resources(cluster_template(env_name), "AWS::EC2::PlacementGroup")
    assert all(pg["Properties"]["Strategy"] == "cluster" for pg in pgs.values())


def test_reservations_in_prod():
    lts = {_group_name(props): (props, lt) for props, lt in node_groups_with_templates("prod")}
    props, lt = lts["p5-capacity-block"]
    assert props["CapacityType"] == "CAPACITY_BLOCK"
    assert lt["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert lt["CapacityReservationSpecification"]["CapacityReservationTarget"]["CapacityReservationId"] == \
        "cr-0123456789abcdef0"
    props, lt = lts["trn2-odcr"]
    assert props["CapacityType"] == "ON_DEMAND"
    assert "InstanceMarketOptions" not in lt
    assert lt["CapacityReservationSpecification"]["CapacityReservationTarget"]["CapacityReservationId"] == \
        "cr-0fedcba9876543210"


def test_bottlerocket_user_data_and_mig_script():
    lts = {_group_name(props): lt for props, lt in node_groups_with_templates("dev")}
    toml = lts["g6e-bottlerocket"]["UserData"]["Fn::Base64"]
    assert "[settings.kubelet-device-plugins.nvidia]\nenabled = false" in toml
    mig = lts["p4d-mig"]["UserData"]["Fn::Base64"]
    assert "text/cloud-config" in mig and "nvidia-smi mig -cgi " + ",".join(["1g.5gb"] * 7) + " -C" in mig
    assert "eks-dra-mig.service" in mig and "eks-dra-mig.service" not in lts["p5-dra"]["UserData"]["Fn::Base64"]
    # last step of the unit's script: the marker the GPU driver waits for before publishing MIG devices
    # (eks_dra/drivers/gpu/mig.py)
    config = json.loads(mig.split("#cloud-config\n", 1)[1].split("\n--", 1)[0])
    script = next(f["content"] for f in config["write_files"] if f["path"].endswith("/eks-dra-mig"))
    assert script.rstrip().splitlines()[-1] == "cat /proc/sys/kernel/random/boot_id > /var/lib/eks-dra/mig-partitioned"


def test_explicit_environment_has_no_context_lookups():
    for name in ("staging", "prod"):
        manifest = json.loads((synth_environment(name).outdir / "manifest.json").read_text())
        assert not manifest.get("missing"), manifest.get("missing")
    subnets = resources(cluster_template("prod"), "AWS::EC2::Subnet")
    assert {s["Properties"]["AvailabilityZone"] for s in subnets.values()} == {"us-east-2a", "us-east-2b", "us-east-2c"}


def test_pipeline_deploys_in_order_with_approval_before_protected():
    synthesized = synth_environment("pipeline")
    assert synthesized.synth_error is None, synthesized.synth_error
    template = synthesized.templates["EksDraPipeline.template.json"]
    pipeline = next(iter(resources(template, "AWS::CodePipeline::Pipeline").values()))["Properties"]
    stages = [s["Name"] for s in pipeline["Stages"]]
    assert stages[:3] == ["Source", "Build", "UpdatePipeline"]
    assert stages.index("Staging") < stages.index("Prod")
    prod_actions = next(s for s in pipeline["Stages"] if s["Name"] == "Prod")["Actions"]
    staging_actions = next(s for s in pipeline["Stages"] if s["Name"] == "Staging")["Actions"]
    approvals = [a for a in prod_actions if a["ActionTypeId"]["Category"] == "Approval"]
    assert len(approvals) == 1
    assert approvals[0]["RunOrder"] < min(a["RunOrder"] for a in prod_actions if a["ActionTypeId"]["Category"] ==
                                           "Deploy")
    assert not [a for a in staging_actions if a["ActionTypeId"]["Category"] == "Approval"]
    build = json.dumps(resources(template, "AWS::CodeBuild::Project"))
    assert "make synth ENV=staging" in build and "make synth ENV=prod" in build and "cdk synth -c pipeline=true" in build
    assert "@latest" not in json.dumps(template), "the pipeline installs pinned tools only"


def test_manifests_are_applied_in_chart_order():
    from eks_dra.stacks.cluster_stack import _construct_id
    from eks_dra.stacks.manifests import build_k8s_app

    env = load_environment("dev", CONFIG)
    chart_ids = [_construct_id(c.node.id) for c in build_k8s_app(env).charts]
    manifests = resources(cluster_template("dev"), "Custom::AWSCDK-EKS-KubernetesResource")
    ordered = [next(k for k in manifests if k.startswith(f"AcceleratorCluster{cid}")) for cid in chart_ids]
    assert len(ordered) == len(manifests) == len(chart_ids)
    for before, after in zip(ordered, ordered[1:], strict=False):
        assert before in manifests[after]["DependsOn"]
    assert any("DeviceClass" in m["Properties"]["Manifest"] for m in manifests.values())
    dist = synth_environment("dev").outdir / "dist" / "dev"
    assert sorted(p.name for p in dist.glob("*.k8s.yaml"))


def test_driver_image_asset_and_upstream_helm_chart(tmp_path, monkeypatch):
    """With a Dockerfile the stack builds the driver image as an asset and the DaemonSets use it; a family
    served by the vendor driver is a Helm chart applied before the cdk8s charts."""
    import aws_cdk as cdk

    from eks_dra.stacks import cluster_stack

    context = tmp_path / "context"
    (context / "eks_dra").mkdir(parents=True)
    (context / "Dockerfile").write_text("FROM scratch\n")
    (context / "eks_dra" / "__init__.py").write_text("")
    (context / "node_modules").mkdir()
    (context / "node_modules" / "big.js").write_text("x")
    monkeypatch.setattr(cluster_stack, "REPO_ROOT", context)
    config = tmp_path / "config"
    config.mkdir()
    (config / "img.yaml").write_text(
        "region: us-east-2\ndrivers: {gpu: upstream}\nnodeGroups:\n"
        "  - {name: system, instanceType: m7i.large}\n  - {name: g6e, instanceType: g6e.48xlarge}\n")
    outdir = tmp_path / "out"
    app = cdk.App(outdir=str(outdir))
    cluster_stack.ClusterStack(app, "Img", load_environment("img", config))
    app.synth()
    assets = json.loads((outdir / "Img.assets.json").read_text())
    assert len(assets["dockerImages"]) == 1
    staged = outdir / f"asset.{next(iter(assets['dockerImages']))}"
    assert sorted(p.name for p in staged.iterdir()) == ["Dockerfile", "eks_dra"]
    template = json.loads((outdir / "Img.template.json").read_text())
    helm = resources(template, "Custom::AWSCDK-EKS-HelmChart")
    assert [h["Properties"]["Chart"] for h in helm.values()] == ["dra-driver-nvidia-gpu"]
    manifests = resources(template, "Custom::AWSCDK-EKS-KubernetesResource")
    first = next(k for k, m in manifests.items() if not any(d in manifests for d in m.get("DependsOn", [])))
    assert next(iter(helm)) in manifests[first]["DependsOn"]
    efa_driver = json.dumps(next(m for k, m in manifests.items() if "DriverEfa" in k)["Properties"]["Manifest"])
    assert "dkr.ecr" in efa_driver and "container-assets" in efa_driver
