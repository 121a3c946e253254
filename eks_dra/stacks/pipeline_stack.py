"""PipelineStack: a CDK Pipeline that deploys the environments of config/pipeline.yaml in their order.

Each environment marked `protected: true` waits for a manual approval. The synth step runs the same
`make synth` a platform engineer runs (offline synth plus the allocation plan of every environment),
then synthesizes the pipeline itself; `make synth` installs the pinned tools, and the generated self-mutation
and asset steps install the CLI versions of package.json.
"""

from __future__ import annotations

import json

from aws_cdk import Acknowledgment, DefaultStackSynthesizer, Environment, Stack, Stage, Token, Validations, pipelines
from aws_cdk import aws_codepipeline as codepipeline
from constructs import Construct

from eks_dra.config import EnvironmentConfig, PipelineConfig
from eks_dra.errors import UserError

from .cluster_stack import REPO_ROOT, ClusterStack


def pinned_tool_versions() -> dict[str, str]:
    """The CDK CLI and cdk-assets versions of package.json: the pipeline installs these, never `@latest`."""
    path = REPO_ROOT / "package.json"
    if not path.is_file():
        raise UserError(f"{path}: not found; the pipeline is synthesized from a clone of the eks-dra repository, whose "
                        "package.json pins the CDK CLI and cdk-assets versions the pipeline installs")
    tools = json.loads(path.read_text())["devDependencies"]
    return {"aws-cdk": tools["aws-cdk"], "cdk-assets": tools["cdk-assets"]}


class EnvironmentStage(Stage):
    """One environment's deployment unit inside the pipeline."""

    def __init__(self, scope: Construct, construct_id: str, env_config: EnvironmentConfig) -> None:
        super().__init__(scope, construct_id, env=Environment(account=env_config.account, region=env_config.region))
        # The CloudFormation execution role as a literal ARN: the default `arn:${AWS::Partition}:...` becomes an
        # Fn::Join inside the pipeline's action configuration, which cfn-lint rejects (E3703).
        exec_role = (f"arn:{_partition(env_config.region)}:iam::${{AWS::AccountId}}:role/"
                     f"cdk-{DefaultStackSynthesizer.DEFAULT_QUALIFIER}-cfn-exec-role-${{AWS::AccountId}}-${{AWS::Region}}")
        self.cluster_stack = ClusterStack(
            self, f"EksDra-{env_config.name}", env_config,
            synthesizer=DefaultStackSynthesizer(cloud_formation_execution_role=exec_role))


class PipelineStack(Stack):
    def __init__(self, scope: Construct, construct_id: str, pipeline_config: PipelineConfig, **kwargs) -> None:
        for env in pipeline_config.environments:
            if env.account is None or env.region is None:
                raise UserError(f"{env.source}: account and region are required for an environment the pipeline "
                                f"deploys (listed in {pipeline_config.source_file}); add both")
        env = None
        if pipeline_config.account or pipeline_config.region:
            env = Environment(account=pipeline_config.account, region=pipeline_config.region)
        super().__init__(scope, construct_id, env=env, description="eks-dra release pipeline", **kwargs)
        src = pipeline_config.source
        source = pipelines.CodePipelineSource.connection(src.repository, src.branch, connection_arn=src.connection_arn)
        tools = pinned_tool_versions()
        self.pipeline = pipelines.CodePipeline(
            self, "Pipeline",
            pipeline_name="eks-dra",
            cli_version=tools["aws-cdk"],
            cdk_assets_cli_version=tools["cdk-assets"],
            pipeline_type=codepipeline.PipelineType.V2,
            # Environments live in other accounts: encrypted, cross-account artifact buckets.
            cross_account_keys=True,
            enable_key_rotation=True,
            synth=pipelines.ShellStep(
                "Synth", input=source,
                # One command per environment: CodeBuild stops at the first that fails (a shell loop would not).
                commands=[
                    *(f"make synth ENV={e.name}" for e in pipeline_config.environments),
                    "npx cdk synth -c pipeline=true --no-notices --quiet",
                ],
            ),
        )
        self.stages: list[EnvironmentStage] = []
        for env_config in pipeline_config.environments:
            stage = EnvironmentStage(self, _stage_id(env_config.name), env_config)
            pre = [pipelines.ManualApprovalStep(f"Approve-{env_config.name}",
                                                comment=f"Deploy eks-dra to protected environment {env_config.name}")
                   ] if env_config.protected else []
            self.pipeline.add_stage(stage, pre=pre)
            self.stages.append(stage)
        self.pipeline.build_pipeline()
        self._acknowledge_nag_findings()

    def _acknowledge_nag_findings(self) -> None:
        """cdk-nag findings on the roles and bucket that aws-cdk-lib's CDK Pipelines generates, with reasons."""
        logical = self.get_logical_id
        synth_id = logical(self.pipeline.synth_project.node.default_child)  # type: ignore[arg-type]
        mutate_id = logical(self.pipeline.self_mutation_project.node.default_child)  # type: ignore[arg-type]
        bucket_id = logical(self.pipeline.pipeline.artifact_bucket.node.default_child)  # type: ignore[arg-type]
        # cdk-nag writes a literal partition when the CDK knows it (@aws-cdk/core:enablePartitionLiterals).
        partition = "<AWS::Partition>" if Token.is_unresolved(self.partition) else self.partition
        prefix = f"arn:{partition}:{{}}:{self.region}:{self.account}:"
        logs, reports = prefix.format("logs") + "log-group:/aws/codebuild/", prefix.format("codebuild") + "report-group/"
        artifact_access = ("CDK Pipelines grants its stage roles read/write on the pipeline's own artifact bucket and "
                           "KMS key only; the wildcard covers object keys and KMS data-key variants.")
        build_logs = "CodeBuild projects write their own log streams and test reports; scoped to the project name."
        findings = {
            "AwsSolutions-S1": "The artifact bucket holds transient, KMS-encrypted pipeline artifacts; every access is "
                               "made by the pipeline's roles and recorded by CloudTrail.",
            **{f"AwsSolutions-IAM5[Action::{a}]": artifact_access for a in (
                "s3:GetObject*", "s3:GetBucket*", "s3:List*", "s3:DeleteObject*", "s3:Abort*",
                "kms:ReEncrypt*", "kms:GenerateDataKey*")},
            f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/*]": artifact_access,
            f"AwsSolutions-IAM5[Resource::{logs}<{synth_id}>:*]": build_logs,
            f"AwsSolutions-IAM5[Resource::{reports}<{synth_id}>-*]": build_logs,
            f"AwsSolutions-IAM5[Resource::{logs}<{mutate_id}>:*]": build_logs,
            f"AwsSolutions-IAM5[Resource::{reports}<{mutate_id}>-*]": build_logs,
            f"AwsSolutions-IAM5[Resource::{logs}*]": "The asset-publishing CodeBuild projects are created per asset by "
                                                     "CDK Pipelines; their logs and reports share this role.",
            f"AwsSolutions-IAM5[Resource::{reports}*]": "Same asset-publishing projects as above (test reports).",
            "AwsSolutions-IAM5[Resource::*]":
                "CDK Pipelines' self-mutation and asset roles call read-only APIs that take no resource ARN "
                "(cloudformation:DescribeStacks, s3:ListAllMyBuckets) and assume bootstrap roles by tag.",
            f"AwsSolutions-IAM5[Resource::arn:*:iam::{self.account}:role/*]":
                "The self-mutation step assumes the CDK bootstrap deploy roles (cdk-*), whose names it cannot know "
                "before bootstrap.",
        }
        Validations.of(self).acknowledge(*(Acknowledgment(id=k, reason=v) for k, v in findings.items()))

def _partition(region: str | None) -> str:
    if region and region.startswith("cn-"):
        return "aws-cn"
    if region and region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def _stage_id(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("-"))
