"""EksDraChecks: the cdk-nag rules of our own for the aws_eks_v2 cluster fire on a deliberately bad cluster,
stay quiet on a good one, and run in the app's synth (the AwsSolutions EKS rules do not see this class)."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk import aws_eks_v2 as eks
from cdk_nag import AwsSolutionsChecks
from test_stacks import CONFIG, synth_environment

from eks_dra.constructs.eks_checks import CONTROL_PLANE_LOG_TYPES, EksDraChecks


def _cluster(stack: cdk.Stack, cid: str, *, public: bool | None = None, cidrs: list[str] | None = None,
             logs: tuple[str, ...] = (), encrypted: bool = False) -> eks.CfnCluster:
    return eks.CfnCluster(
        stack, cid, role_arn="arn:aws:iam::123456789012:role/eks",
        resources_vpc_config=eks.CfnCluster.ResourcesVpcConfigProperty(
            subnet_ids=["subnet-0123456789abcdef0"], endpoint_public_access=public, public_access_cidrs=cidrs),
        logging=eks.CfnCluster.LoggingProperty(cluster_logging=eks.CfnCluster.ClusterLoggingProperty(
            enabled_types=[eks.CfnCluster.LoggingTypeConfigProperty(type=t) for t in logs])) if logs else None,
        encryption_config=[eks.CfnCluster.EncryptionConfigProperty(
            resources=["secrets"], provider=eks.CfnCluster.ProviderProperty(key_arn="arn:aws:kms:us-east-2:1:key/k"))]
        if encrypted else None)


def _findings(report) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for violation in report.violations:
        out.setdefault(violation.rule_name, []).extend(r.construct_path for r in violation.violating_resources)
    return out


@pytest.fixture(scope="module")
def stacks():
    app = cdk.App()
    stack = cdk.Stack(app, "Checks")
    _cluster(stack, "Bad")  # EndpointPublicAccess unset: public to 0.0.0.0/0 (the EKS default)
    _cluster(stack, "Open", public=True, cidrs=["0.0.0.0/0"], logs=CONTROL_PLANE_LOG_TYPES, encrypted=True)
    _cluster(stack, "NoAudit", public=False, logs=("api",), encrypted=True)
    _cluster(stack, "Good", public=True, cidrs=["203.0.113.0/24"], logs=CONTROL_PLANE_LOG_TYPES, encrypted=True)
    _cluster(stack, "Private", public=False, logs=CONTROL_PLANE_LOG_TYPES, encrypted=True)
    acknowledged = _cluster(stack, "Acknowledged")
    cdk.Validations.of(acknowledged).acknowledge(
        cdk.Acknowledgment(id="EksDra-EKS1", reason="test"), cdk.Acknowledgment(id="EksDra-EKS2", reason="test"),
        cdk.Acknowledgment(id="EksDra-EKS3", reason="test"))
    return app, stack


def test_each_rule_fires_on_a_bad_v2_cluster(stacks):
    _, stack = stacks
    findings = _findings(EksDraChecks().validate_scope(stack))
    assert findings["EksDra-EKS1"] == ["Checks/Bad", "Checks/Open"]
    assert findings["EksDra-EKS2"] == ["Checks/Bad", "Checks/NoAudit"]
    assert findings["EksDra-EKS3"] == ["Checks/Bad"]
    assert not any("Good" in p or "Private" in p or "Acknowledged" in p for ps in findings.values() for p in ps)


def test_aws_solutions_does_not_see_the_v2_cluster(stacks):
    """Why the pack exists: AwsSolutions-EKS1/EKS2 test aws_eks.CfnCluster, so they pass the bad v2 cluster."""
    _, stack = stacks
    findings = _findings(AwsSolutionsChecks().validate_scope(stack))
    assert not any(rule.startswith(("AwsSolutions-EKS1", "AwsSolutions-EKS2")) for rule in findings), findings


def test_findings_fail_the_synth_as_the_app_wires_the_pack(tmp_path):
    app = cdk.App(outdir=str(tmp_path))
    _cluster(cdk.Stack(app, "Bad"), "Cluster")
    cdk.Validations.of(app).add_plugins(EksDraChecks(app))
    with pytest.raises(RuntimeError):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    rules = {v["ruleName"] for r in report["pluginReports"] for v in r["violations"]}
    assert rules == {"EksDra-EKS1", "EksDra-EKS2", "EksDra-EKS3"}


def test_shipped_clusters_pass_and_only_unprotected_dev_acknowledges_its_open_endpoint():
    """The clean nag report of every shipped environment includes these rules (app.py registers the pack);
    dev acknowledges EKS1 because its config chose an open endpoint, prod's endpoint is private."""
    from aws_cdk import Validations

    from eks_dra.config import load_environment
    from eks_dra.stacks.cluster_stack import ClusterStack

    for name in ("dev", "staging", "prod"):
        assert synth_environment(name).synth_error is None, name
    for name, acknowledged in (("dev", True), ("prod", False)):
        stack = ClusterStack(cdk.App(), f"Ack{name}", load_environment(name, CONFIG))
        entries = [m.data for m in stack.accelerator_cluster.node.metadata
                   if m.type == Validations.ACKNOWLEDGED_RULES_METADATA_KEY]
        assert any("EksDra-EKS1" in json.dumps(e) for e in entries) == acknowledged, name
