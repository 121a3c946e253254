"""What AWS does with the node groups on their first deploy and first update, read from the
synthesized templates of every shipped environment and of a generated one holding every catalogued instance type.
"""

from __future__ import annotations

import configparser
import email
import functools
import json
import tempfile
from pathlib import Path

import pytest
import yaml
from test_stacks import SHIPPED, cdk_json_context, cluster_template, resources, synth_environment

from eks_dra.catalog import INSTANCE_TYPES
from eks_dra.catalog.node_limits import max_pods, node_limits
from eks_dra.config import load_environment
from eks_dra.constructs.efa_launch_template import MIG_UNIT_NAME, efa_interface_layout

EVERY_TYPE = "every-type"
ENVS = (*SHIPPED, EVERY_TYPE)


@functools.cache
def _every_type_dir() -> Path:
    """One node group per catalogued accelerator type (EFA on where the type has it), plus a Bottlerocket and
    a MIG group."""
    groups = [{"name": "system", "instanceType": "m7i.xlarge", "minSize": 1, "desiredSize": 1, "maxSize": 2}]
    for i, (name, inst) in enumerate(sorted(INSTANCE_TYPES.items())):
        group = {"name": f"t{i}", "instanceType": name, "efa": "auto"}
        if inst.family == "p6e-gb200":
            group["capacity"] = "capacity-block:cr-0123456789abcdef0"
        groups.append(group)
    groups.append({"name": "br", "instanceType": "g6e.48xlarge", "amiFamily": "bottlerocket"})
    groups.append({"name": "br-neuron", "instanceType": "trn2.48xlarge", "amiFamily": "bottlerocket"})
    groups.append({"name": "mig", "instanceType": "p5.48xlarge", "migProfile": "1g.10gb", "imdsHopLimit": 2})
    config = Path(tempfile.mkdtemp(prefix="eks-dra-every-type-"))
    (config / f"{EVERY_TYPE}.yaml").write_text(yaml.safe_dump({
        "region": "us-east-2", "driverImage": "123456789012.dkr.ecr.us-east-2.amazonaws.com/eks-dra:1",
        "vpc": {"cidr": "10.0.0.0/16"}, "nodeGroups": groups}))
    return config


@functools.cache
def _every_type_template() -> dict:
    import aws_cdk as cdk

    from eks_dra.stacks.cluster_stack import ClusterStack

    outdir = Path(tempfile.mkdtemp(prefix="eks-dra-every-type-out-"))
    app = cdk.App(outdir=str(outdir), context=cdk_json_context())
    ClusterStack(app, "EveryType", load_environment(EVERY_TYPE, _every_type_dir()))
    app.synth()
    return json.loads((outdir / "EveryType.template.json").read_text())


def template(env: str) -> dict:
    return _every_type_template() if env == EVERY_TYPE else cluster_template(env)


def environment(env: str):
    return load_environment(env, _every_type_dir()) if env == EVERY_TYPE else load_environment(env, Path("config"))


def groups(env: str) -> dict[str, tuple]:
    """config name -> (config group, Nodegroup properties, LaunchTemplateData)."""
    tpl = template(env)
    lts = resources(tpl, "AWS::EC2::LaunchTemplate")
    config = {g.name: g for g in environment(env).node_groups}
    out = {}
    for ng in resources(tpl, "AWS::EKS::Nodegroup").values():
        props = ng["Properties"]
        name = props["Labels"]["eks-dra.io/node-group"]
        out[name] = (config[name], props, lts[props["LaunchTemplate"]["Id"]["Ref"]]["Properties"]["LaunchTemplateData"])
    assert set(out) == set(config)
    return out


def mime_parts(lt: dict) -> dict[str, str]:
    """Content type -> payload of an AL2023 MIME user data (empty when there is none)."""
    if "UserData" not in lt:
        return {}
    message = email.message_from_string(lt["UserData"]["Fn::Base64"])
    assert message.is_multipart()
    return {part.get_content_type(): part.get_payload() for part in message.get_payload()}


@pytest.fixture(scope="module", params=ENVS)
def env(request) -> str:
    return request.param


# --- 1. EFA security group ---

def test_one_shared_efa_group_allows_all_traffic_to_and_from_itself(env):
    tpl = template(env)
    efa = [(g, lt) for g, _, lt in groups(env).values() if g.efa_enabled]
    if not efa:
        pytest.skip(f"{env} has no EFA node group")
    efa_groups = {json.dumps(i["Groups"][0]) for _, lt in efa for i in lt["NetworkInterfaces"]}
    assert len(efa_groups) == 1, f"one EFA security group per cluster, got {efa_groups}"
    sg_id = json.loads(efa_groups.pop())["Fn::GetAtt"][0]
    sg = tpl["Resources"][sg_id]["Properties"]
    to_self = {"Fn::GetAtt": [sg_id, "GroupId"]}
    egress = list(sg.get("SecurityGroupEgress", [])) + [
        r["Properties"] for r in resources(tpl, "AWS::EC2::SecurityGroupEgress").values()
        if r["Properties"]["GroupId"] == to_self]
    ingress = list(sg.get("SecurityGroupIngress", [])) + [
        r["Properties"] for r in resources(tpl, "AWS::EC2::SecurityGroupIngress").values()
        if r["Properties"]["GroupId"] == to_self]
    assert any(e.get("DestinationSecurityGroupId") == to_self and e["IpProtocol"] == "-1" for e in egress), egress
    assert any(e.get("CidrIp") == "0.0.0.0/0" and e["IpProtocol"] == "-1" for e in egress), egress
    assert any(i.get("SourceSecurityGroupId") == to_self and i["IpProtocol"] == "-1" for i in ingress), ingress


# --- 2. replaceable node groups ---

def test_node_groups_have_generated_names(env):
    for name, (_, props, _) in groups(env).items():
        assert "NodegroupName" not in props, f"{name}: a named node group cannot be replaced by CloudFormation"


# --- 3. updates respect PodDisruptionBudgets on accelerator nodes ---

def test_accelerator_groups_are_never_force_updated(env):
    for name, (group, props, _) in groups(env).items():
        assert props["UpdateConfig"] == {"MaxUnavailable": 1}, name
        if group.instance is not None:
            assert props["ForceUpdateEnabled"] is False, name


# --- 4. max pods from the interface layout ---

def _expected_max_pods(group) -> int | None:
    taken = sum(1 for s in efa_interface_layout(group.instance_type, group.efa_enabled)
                if s.network_card == 0 and s.interface_type == "efa-only")
    return max_pods(group.instance_type, taken) if taken else None


def _max_pods_in(group, lt) -> int | None:
    if group.ami_family == "bottlerocket":
        settings = lt["UserData"]["Fn::Base64"]
        import tomllib

        return tomllib.loads(settings).get("settings", {}).get("kubernetes", {}).get("max-pods")
    node_config = mime_parts(lt).get("application/node.eks.aws")
    return yaml.safe_load(node_config)["spec"].get("kubelet", {}).get("config", {}).get("maxPods") \
        if node_config else None


def test_max_pods_leave_out_the_eni_slot_efa_only_takes(env):
    for name, (group, _, lt) in groups(env).items():
        assert _max_pods_in(group, lt) == _expected_max_pods(group), name


def test_max_pods_of_the_two_eni_types_with_efa():
    """p5.48xlarge and trn2.48xlarge: 2 ENIs on card 0, one taken by efa-only: 1 x (50 - 1) + 2."""
    for instance_type in ("p5.48xlarge", "trn2.48xlarge"):
        assert max_pods(instance_type, 0) == 100  # what nodeadm computes
        assert max_pods(instance_type, 1) == 51


# --- 5. local NVMe ---

def test_instance_store_is_raid0_and_root_volume_is_fast(env):
    for name, (group, _, lt) in groups(env).items():
        has_store = node_limits(group.instance_type).instance_store_disks > 0
        if group.ami_family == "bottlerocket":
            user_data = lt.get("UserData", {}).get("Fn::Base64", "")
            assert ('"apiclient", "ephemeral-storage", "init"' in user_data) == has_store, name
        else:
            node_config = mime_parts(lt).get("application/node.eks.aws")
            strategy = (yaml.safe_load(node_config)["spec"].get("instance", {}).get("localStorage", {})
                        .get("strategy")) if node_config else None
            assert strategy == ("RAID0" if has_store else None), name
        data_volume = lt["BlockDeviceMappings"][-1]["Ebs"]
        assert data_volume["VolumeType"] == "gp3" and data_volume["Throughput"] == (
            500 if group.instance is not None else 125), name


def test_every_catalogued_accelerator_with_nvme_gets_local_storage():
    for name in ("p4d.24xlarge", "p5.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge", "trn2.48xlarge", "g6e.48xlarge"):
        assert node_limits(name).instance_store_disks > 0, name


# --- 6. static MIG on every boot ---

def test_mig_is_a_systemd_unit_ordered_before_kubelet():
    found = 0
    for env_name in ("dev", EVERY_TYPE):
        for name, (group, _, lt) in groups(env_name).items():
            if group.ami_family == "bottlerocket":
                continue
            parts = mime_parts(lt)
            assert "text/x-shellscript" not in parts, f"{name}: a shell part runs once per instance, not every boot"
            if not group.mig_profile:
                assert "text/cloud-config" not in parts, name
                continue
            found += 1
            cloud_config = yaml.safe_load(parts["text/cloud-config"])
            files = {f["path"]: f for f in cloud_config["write_files"]}
            unit_text = files[f"/etc/systemd/system/{MIG_UNIT_NAME}"]["content"]
            unit = configparser.ConfigParser()
            unit.read_string(unit_text)
            assert {"kubelet.service", "nodeadm-run.service"} <= set(unit["Unit"]["Before"].split()), name
            assert "nvidia-persistenced.service" in unit["Unit"]["After"].split()
            assert unit["Install"]["RequiredBy"] == "kubelet.service"
            assert unit["Service"]["Type"] == "oneshot"
            script = files[unit["Service"]["ExecStart"]]
            assert script["permissions"] == "0755"
            count = group.instance.gpu.mig_profile(group.mig_profile).max_instances
            assert f"nvidia-smi mig -cgi {','.join([group.mig_profile] * count)} -C" in script["content"]
            assert "--gpu-reset" in script["content"]  # A100: MIG mode needs a reset (or one reboot)
            assert ["systemctl", "enable", "--now", MIG_UNIT_NAME] in cloud_config["runcmd"]
    assert found == 2


# --- 7. IMDS hop limit ---

def test_imds_hop_limit_is_per_group(env):
    for name, (group, _, lt) in groups(env).items():
        assert lt["MetadataOptions"]["HttpPutResponseHopLimit"] == group.imds_hop_limit, name
    if env == EVERY_TYPE:
        assert groups(env)["mig"][0].imds_hop_limit == 2


# --- 8. the way to the cluster ---

@pytest.mark.parametrize("env_name", SHIPPED)
def test_outputs_give_the_kubeconfig_command(env_name):
    tpl, env = cluster_template(env_name), load_environment(env_name, Path("config"))
    outputs = tpl["Outputs"]
    cluster_id = next(iter(resources(tpl, "AWS::EKS::Cluster")))
    assert outputs["ClusterName"]["Value"] == {"Ref": cluster_id}
    assert outputs["Region"]["Value"] == env.region
    command = outputs["UpdateKubeconfigCommand"]["Value"]["Fn::Join"][1]
    assert command[:3] == ["aws eks update-kubeconfig --name ", {"Ref": cluster_id}, f" --region {env.region}" + (
        f" --role-arn {env.cluster_admin_role_arns[0]}" if env.cluster_admin_role_arns else "")]
    cluster = next(iter(resources(tpl, "AWS::EKS::Cluster").values()))["Properties"]
    assert cluster["AccessConfig"]["BootstrapClusterCreatorAdminPermissions"] is True
    entries = [e["Properties"]["PrincipalArn"] for e in resources(tpl, "AWS::EKS::AccessEntry").values()
               if isinstance(e["Properties"]["PrincipalArn"], str)]
    assert set(env.cluster_admin_role_arns) <= set(entries)


# --- 9. protected environments: private endpoint, data retained ---

@pytest.mark.parametrize("env_name", SHIPPED)
def test_protected_environments_keep_data_and_a_private_endpoint(env_name):
    tpl, env = cluster_template(env_name), load_environment(env_name, Path("config"))
    vpc_config = next(iter(resources(tpl, "AWS::EKS::Cluster").values()))["Properties"]["ResourcesVpcConfig"]
    assert vpc_config["EndpointPublicAccess"] is env.endpoint_public
    assert vpc_config.get("PublicAccessCidrs", []) == list(env.endpoint_public_cidrs)
    if env.protected:
        assert not env.endpoint_public or env.endpoint_public_cidrs
    policy = "Retain" if env.protected else "Delete"
    for kind in ("AWS::KMS::Key", "AWS::Logs::LogGroup"):
        found = resources(tpl, kind)
        assert found and all(r["DeletionPolicy"] == policy for r in found.values()), (kind, env_name)
    for group in resources(tpl, "AWS::Logs::LogGroup").values():
        assert group["Properties"]["RetentionInDays"] == env.log_retention_days


# --- 14. plain manifests: a real image, samples apart ---

def _dist_text(env_name: str) -> str:
    dist = synth_environment(env_name).outdir / "dist" / env_name
    return "\n".join(p.read_text() for p in sorted(dist.glob("*.k8s.yaml")))


def test_dist_names_only_an_image_a_cluster_can_pull():
    from eks_dra.charts.driver_chart import DEFAULT_IMAGE

    # staging/prod: account and region known, so the CDK asset's ECR URI is a literal with the asset hash as tag.
    for env_name in ("staging", "prod"):
        synthesized = synth_environment(env_name)
        assets = json.loads(next(synthesized.outdir.glob(f"EksDra-{env_name}.assets.json")).read_text())
        (image,) = assets["dockerImages"].values()
        destination = next(iter(image["destinations"].values()))
        env = load_environment(env_name, Path("config"))
        expected = (f"{env.account}.dkr.ecr.{env.region}.amazonaws.com/{destination['repositoryName']}:"
                    f"{destination['imageTag']}")
        text = _dist_text(env_name)
        assert f"image: {expected}" in text and DEFAULT_IMAGE not in text, env_name
    # dev: env-agnostic, no driverImage: the asset URI is unknown before deploy, so no driver DaemonSet at all.
    docs = [d for d in yaml.safe_load_all(_dist_text("dev")) if d]
    assert DEFAULT_IMAGE not in _dist_text("dev") and any(d["kind"] == "DeviceClass" for d in docs)
    assert not [d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["namespace"] == "eks-dra-system"]


def test_samples_live_apart_and_are_off_in_protected_environments():
    for env_name in SHIPPED:
        env = load_environment(env_name, Path("config"))
        dist = synth_environment(env_name).outdir / "dist" / env_name
        assert "dra-samples" not in _dist_text(env_name)
        assert (dist / "samples").is_dir() == env.samples == (not env.protected), env_name
        manifests = json.dumps(resources(cluster_template(env_name), "Custom::AWSCDK-EKS-KubernetesResource"))
        assert ("dra-samples" in manifests) == env.samples, env_name


# --- 15. as a library: the image build context ---

def test_cluster_stack_without_a_build_context_fails_with_the_fix(tmp_path, monkeypatch):
    """A non-editable install has no Dockerfile beside the package: refuse, naming driverImage, instead of
    deploying DaemonSets with an image no registry has."""
    import aws_cdk as cdk

    from eks_dra.errors import UserError
    from eks_dra.stacks import cluster_stack

    monkeypatch.setattr(cluster_stack, "REPO_ROOT", tmp_path)
    env = load_environment("staging", Path("config"))
    with pytest.raises(UserError, match=r"staging.yaml: driverImage: eks-dra is installed without the driver image's "
                                        r"build context.*set driverImage: REPO:TAG"):
        cluster_stack.ClusterStack(cdk.App(), "NoContext", env)
    stack = cluster_stack.ClusterStack(cdk.App(), "WithImage", env, driver_image="registry.example.com/eks-dra:1")
    assert stack.driver_image_reference == "registry.example.com/eks-dra:1"
