"""EksDraChecks: cdk-nag rules for the `aws_eks_v2` cluster, which the AwsSolutions EKS rules never see.

cdk-nag's AwsSolutions-EKS1/EKS2 test `instanceof aws_eks.CfnCluster`; `aws_eks_v2.CfnCluster` is another class
(checked with cdk-nag 3.0.2 / aws-cdk-lib 2.275.0), so a clean AwsSolutions report says nothing about our cluster.
These rules read the CloudFormation properties of every `AWS::EKS::Cluster`, whichever module made it.
Register with `Validations.of(app).add_plugins(EksDraChecks(app))`; acknowledge with `Validations.of(c).acknowledge(
Acknowledgment(id="EksDra-EKS1", reason=...))` like any cdk-nag rule.
"""

from __future__ import annotations

from collections.abc import Callable

import jsii
from aws_cdk import CfnResource, Stack
from cdk_nag import IApplyRule, NagMessageLevel, NagPack, NagRuleCompliance
from constructs import IConstruct

PACK_NAME = "EksDra"
CONTROL_PLANE_LOG_TYPES = ("api", "audit", "authenticator", "controllerManager", "scheduler")


def _get(props: dict, key: str):
    """A resolved property under its CloudFormation (PascalCase) or jsii (camelCase) name."""
    return props.get(key, props.get(key[:1].lower() + key[1:])) if isinstance(props, dict) else None


def _public_endpoint_without_cidrs(cluster: dict) -> bool:
    vpc = _get(cluster, "ResourcesVpcConfig") or {}
    public = _get(vpc, "EndpointPublicAccess")
    cidrs = _get(vpc, "PublicAccessCidrs") or []
    return public is not False and (not cidrs or "0.0.0.0/0" in cidrs)  # unset means public (EKS default)


def _missing_log_types(cluster: dict) -> bool:
    enabled = _get(_get(_get(cluster, "Logging") or {}, "ClusterLogging") or {}, "EnabledTypes") or []
    return not set(CONTROL_PLANE_LOG_TYPES) <= {_get(t, "Type") for t in enabled}


def _secrets_unencrypted(cluster: dict) -> bool:
    return not any("secrets" in (_get(c, "Resources") or []) and _get(_get(c, "Provider") or {}, "KeyArn")
                   for c in _get(cluster, "EncryptionConfig") or [])


RULES: tuple[tuple[str, str, str, Callable[[dict], bool]], ...] = (
    ("EKS1", "The EKS API endpoint is public without publicAccessCidrs (open to 0.0.0.0/0).",
     "Make the endpoint private, or restrict it to the operators' CIDRs.", _public_endpoint_without_cidrs),
    ("EKS2", "The EKS cluster does not send every control-plane log type to CloudWatch Logs.",
     f"Enable {', '.join(CONTROL_PLANE_LOG_TYPES)}: audit logs are what an incident review reads.", _missing_log_types),
    ("EKS3", "Kubernetes secrets are not envelope-encrypted with a KMS key.",
     "Set secrets encryption (EncryptionConfig resources [secrets] with a KMS key).", _secrets_unencrypted),
)


@jsii.implements(IApplyRule)
class _Rule:
    def __init__(self, node: CfnResource, suffix: str, info: str, explanation: str, failed: bool) -> None:
        self._node, self._suffix, self._info, self._explanation, self._failed = node, suffix, info, explanation, failed

    @property
    def node(self) -> CfnResource:
        return self._node

    @property
    def rule_suffix_override(self) -> str:
        return self._suffix

    @property
    def info(self) -> str:
        return self._info

    @property
    def explanation(self) -> str:
        return self._explanation

    @property
    def level(self) -> NagMessageLevel:
        return NagMessageLevel.ERROR

    def rule(self, node: CfnResource) -> NagRuleCompliance:
        return NagRuleCompliance.NON_COMPLIANT if self._failed else NagRuleCompliance.COMPLIANT


class EksDraChecks(NagPack):
    """EksDra-EKS1 (public endpoint without CIDRs), EKS2 (control-plane logging), EKS3 (secrets encryption)."""

    def __init__(self, scope: IConstruct | None = None) -> None:
        super().__init__(scope)
        self._pack_name = PACK_NAME

    @property
    def name(self) -> str:
        return "eks-dra"

    @jsii.member(jsii_name="checkResource")
    def _check_resource(self, node: CfnResource) -> None:
        if node.cfn_resource_type != "AWS::EKS::Cluster":
            return
        cluster = cluster_properties(node)
        for suffix, info, explanation, failed in RULES:
            self._apply_rule(_Rule(node, suffix, info, explanation, failed(cluster)))


def cluster_properties(node: CfnResource) -> dict:
    """The cluster's CloudFormation properties, resolved (tokens of other resources stay as Ref/GetAtt)."""
    stack = Stack.of(node)
    props = {}
    for key in ("resources_vpc_config", "logging", "encryption_config"):
        value = stack.resolve(getattr(node, key, None))
        if value is not None:
            props[key.title().replace("_", "")] = value
    return props
