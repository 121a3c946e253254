"""ClusterStack: one environment's VPC, EKS cluster, node groups and Kubernetes manifests.

The only place where an `EnvironmentConfig` meets the constructs. Synthesizes offline with no context
lookups: an env-agnostic stack when the config has no account, otherwise an explicit Environment whose
availability zones are written down (never looked up).
"""

from __future__ import annotations

from pathlib import Path

import jsii
from aws_cdk import (
    Acknowledgment,
    Aspects,
    CfnOutput,
    DefaultStackSynthesizer,
    Environment,
    IAspect,
    RemovalPolicy,
    Stack,
    Tags,
    Token,
    Validations,
)
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_logs as logs
from constructs import Construct

from eks_dra.config import EnvironmentConfig, NodeGroupConfig
from eks_dra.constructs import (
    AcceleratorCluster,
    AcceleratorClusterProps,
    AcceleratorNodeGroup,
    AcceleratorNodeGroupProps,
    NodeTaint,
)
from eks_dra.errors import UserError
from eks_dra.stacks.manifests import build_k8s_app, needs_driver_image, upstream_helm_charts

REPO_ROOT = Path(__file__).resolve().parents[2]
# The driver image's build context: only these paths are staged into cdk.out (never .venv or node_modules).
IMAGE_CONTEXT = ("Dockerfile", "pyproject.toml", "requirements.lock", "README.md", "eks_dra")
IMAGE_EXCLUDE = ["*", *(f"!{p}" for p in IMAGE_CONTEXT), "!eks_dra/**", "**/__pycache__", "**/*.pyc"]


def stack_environment(env: EnvironmentConfig) -> Environment | None:
    if env.account is None and env.region is None:
        return None
    return Environment(account=env.account, region=env.region)


def availability_zones(env: EnvironmentConfig) -> list[str] | None:
    """AZs written in the config (which writes <region>a/b for an explicit account): never a context lookup."""
    return list(env.vpc.availability_zones) or None


class ClusterStack(Stack):
    """Everything one environment deploys."""

    _configured_azs: list[str] | None = None

    def __init__(self, scope: Construct, construct_id: str, env_config: EnvironmentConfig,
                 driver_image: str | None = None, **kwargs) -> None:
        self._configured_azs = availability_zones(env_config)
        # One CloudFormation stack name per environment, whether `cdk deploy` or the pipeline deploys it.
        kwargs.setdefault("stack_name", f"EksDra-{env_config.name}")
        super().__init__(scope, construct_id, env=stack_environment(env_config),
                         description=f"eks-dra {env_config.name}: EKS {env_config.kubernetes_version} with DRA "
                                     "accelerator node groups", **kwargs)
        self.env_config = env_config
        Tags.of(self).add("eks-dra:environment", env_config.name)
        Aspects.of(self).add(_LogRetention(env_config.log_retention_days, self._data_removal_policy))
        self.vpc = self._vpc()
        self.accelerator_cluster = AcceleratorCluster(self, "AcceleratorCluster", AcceleratorClusterProps(
            vpc=self.vpc,
            cluster_name=env_config.cluster_name,
            kubernetes_version=env_config.kubernetes_version,
            admin_role_arns=list(env_config.cluster_admin_role_arns),
            public_endpoint=env_config.endpoint_public,
            public_access_cidrs=list(env_config.endpoint_public_cidrs),
            removal_policy=self._data_removal_policy,
        ))
        self.cluster = self.accelerator_cluster.cluster
        if env_config.endpoint_public and not env_config.endpoint_public_cidrs:
            Validations.of(self.accelerator_cluster).acknowledge(Acknowledgment(
                id="EksDra-EKS1", reason=f"{env_config.source}: environment {env_config.name} is not protected and "
                "sets no apiEndpoint.publicAccessCidrs: kubectl from anywhere, authenticated by IAM (protected "
                "environments refuse this)."))
        self._outputs()
        self.node_groups: dict[str, AcceleratorNodeGroup] = {}
        for group in env_config.node_groups:
            self.node_groups[group.name] = self.accelerator_cluster.add_node_group(
                _construct_id(group.name), self._node_group_props(group))
        self.driver_image_asset: ecr_assets.DockerImageAsset | None = None
        self.driver_image = driver_image or env_config.driver_image or self._driver_image_asset()
        self.manifests = self._add_manifests()

    @property
    def _data_removal_policy(self) -> RemovalPolicy:
        """Protected environments keep what holds data (the secrets key, logs) when the stack is deleted."""
        return RemovalPolicy.RETAIN if self.env_config.protected else RemovalPolicy.DESTROY

    def _outputs(self) -> None:
        """What an operator needs after `cdk deploy`: the cluster, its region and the kubeconfig command."""
        env = self.env_config
        command = f"aws eks update-kubeconfig --name {self.cluster.cluster_name} --region {self.region}"
        if env.cluster_admin_role_arns:
            command += f" --role-arn {env.cluster_admin_role_arns[0]}"
        CfnOutput(self, "ClusterName", value=self.cluster.cluster_name, description="EKS cluster name")
        CfnOutput(self, "Region", value=self.region, description="AWS region of the cluster")
        CfnOutput(self, "UpdateKubeconfigCommand", value=command,
                  description="Run this to use kubectl (needs an access entry: clusterAdminRoleArns)")

    @property
    def availability_zones(self) -> list[str]:
        """The config's AZs: with an explicit account the CDK would otherwise look them up (needs credentials)."""
        return self._configured_azs or super().availability_zones

    # --- network ---

    def _vpc(self) -> ec2.IVpc:
        vpc_config = self.env_config.vpc
        if vpc_config.vpc_id:
            azs = list(vpc_config.private_subnets)
            return ec2.Vpc.from_vpc_attributes(
                self, "Vpc", vpc_id=vpc_config.vpc_id, availability_zones=azs,
                private_subnet_ids=[vpc_config.private_subnets[az] for az in azs])
        azs = availability_zones(self.env_config)
        vpc = self._new_vpc(azs)
        if azs:
            Validations.of(vpc).acknowledge(Acknowledgment(
                id="CloudFormation-Validate::W3010", reason="The AZs are written in the config: synth makes no "
                "lookups, and reserved capacity and EFA groups name their AZ."))
        return vpc

    def _new_vpc(self, azs: list[str] | None) -> ec2.Vpc:
        vpc_config = self.env_config.vpc
        vpc = ec2.Vpc(
            self, "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(vpc_config.cidr or "10.0.0.0/16"),
            availability_zones=azs,
            max_azs=None if azs else 2,
            nat_gateways=1 if not self.env_config.protected else None,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                # EFA nodes and their pods take many addresses: large private subnets.
                ec2.SubnetConfiguration(name="private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                                        cidr_mask=19),
            ],
        )
        flow_logs = logs.LogGroup(self, "FlowLogs")  # retention and removal: _LogRetention
        vpc.add_flow_log("FlowLog", destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs))
        return vpc

    def _subnets(self, group: NodeGroupConfig) -> list[ec2.ISubnet]:
        subnets = self.accelerator_cluster.private_subnets(group.availability_zone)
        if group.efa_enabled or group.capacity.reserved:
            return subnets[:1]  # EFA and reservations: one AZ
        return subnets

    # --- node groups ---

    def _node_group_props(self, group: NodeGroupConfig) -> AcceleratorNodeGroupProps:
        env = self.env_config
        bottlerocket = group.ami_family == "bottlerocket"
        gpu_dra = "gpu" in group.families and group.manager("gpu") == "dra"
        neuron = group.accelerator_family == "neuron"
        return AcceleratorNodeGroupProps(
            cluster=self.cluster,
            # No NodegroupName: CloudFormation must be able to replace the group when a create-only setting
            # (amiFamily, capacity, efa, availabilityZone) changes; the name is the eks-dra.io/node-group label.
            instance_type=group.instance_type,
            ami_type=group.ami_type,
            subnets=self._subnets(group),
            min_size=group.min_size, desired_size=group.desired_size, max_size=group.max_size,
            labels=env.node_labels(group),
            taints=[NodeTaint(t.key, t.value, t.effect) for t in env.node_taints(group)],
            efa=group.efa_enabled,
            capacity_kind=group.capacity.kind,
            reservation_id=group.capacity.reservation_id,
            disable_nvidia_device_plugin=bottlerocket and gpu_dra,
            neuron_device_ownership=bottlerocket and neuron,
            mig_profile=group.mig_profile,
            root_volume_gib=200 if group.instance is not None else 50,
            # Fast image pulls where images are large (accelerator nodes); the gp3 baseline elsewhere.
            root_volume_throughput=500 if group.instance is not None else 125,
            local_storage=group.local_storage,
            http_put_response_hop_limit=group.imds_hop_limit,
            # Accelerator nodes run jobs a forced drain would kill; system pods are stateless and replicated.
            force_update=group.instance is None,
        )

    # --- workloads ---

    def _driver_image_asset(self) -> str | None:
        """Build the driver image from the repository's Dockerfile (staged at synth, built at deploy)."""
        if not needs_driver_image(self.env_config):
            return None
        if not (REPO_ROOT / "Dockerfile").is_file():
            raise UserError(
                f"{self.env_config.source}: driverImage: eks-dra is installed without the driver image's build context "
                f"(no Dockerfile beside {REPO_ROOT / 'eks_dra'}), so the stack cannot build the image; push the image "
                "to a registry and set driverImage: REPO:TAG (or pass driver_image= to ClusterStack), or deploy "
                "from a clone of the repository")
        self.driver_image_asset = ecr_assets.DockerImageAsset(
            self, "DriverImage", directory=str(REPO_ROOT), exclude=IMAGE_EXCLUDE,
            platform=ecr_assets.Platform.LINUX_AMD64)
        return self.driver_image_asset.image_uri

    @property
    def driver_image_reference(self) -> str | None:
        """The driver image as a literal a plain-manifest user can pull: the configured image, or the CDK asset's
        ECR URI when the account and region are known (the bootstrap repository and the asset hash as tag);
        None for an env-agnostic stack whose asset URI is known only at deploy."""
        if self.driver_image_asset is None:
            return self.driver_image
        if Token.is_unresolved(self.account) or Token.is_unresolved(self.region):
            return None
        qualifier = self.node.try_get_context("@aws-cdk/core:bootstrapQualifier") or \
            DefaultStackSynthesizer.DEFAULT_QUALIFIER
        suffix = "amazonaws.com.cn" if self.region.startswith("cn-") else "amazonaws.com"
        return (f"{self.account}.dkr.ecr.{self.region}.{suffix}/cdk-{qualifier}-container-assets-{self.account}-"
                f"{self.region}:{self.driver_image_asset.asset_hash}")

    def _add_manifests(self) -> list:
        """Apply the vendor Helm charts (drivers: <family>: upstream), then the environment's cdk8s charts
        (drivers, DeviceClasses, device plugins, samples), each after the previous one."""
        applied: list = []
        for spec in upstream_helm_charts(self.env_config):
            applied.append(self.cluster.add_helm_chart(
                _construct_id(spec.id), chart=spec.chart, repository=spec.repository, version=spec.version,
                namespace=spec.namespace, values=spec.values, create_namespace=spec.create_namespace))
        for chart in build_k8s_app(self.env_config, self.driver_image).charts:
            applied.append(self.cluster.add_cdk8s_chart(_construct_id(chart.node.id), chart))
        for before, after in zip(applied, applied[1:], strict=False):
            after.node.add_dependency(before)
        return applied

@jsii.implements(IAspect)
class _LogRetention:
    """Every log group of the stack (flow logs, the kubectl provider's Lambdas) keeps the environment's retention
    and removal policy: protected environments keep their logs when the stack is deleted."""

    def __init__(self, days: int, removal_policy: RemovalPolicy) -> None:
        self.days, self.removal_policy = days, removal_policy

    def visit(self, node) -> None:
        if isinstance(node, logs.CfnLogGroup):
            node.retention_in_days = self.days  # the number CloudFormation takes (validated in the config)
            node.apply_removal_policy(self.removal_policy)


def _construct_id(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.replace("_", "-").replace(".", "-").split("-"))
