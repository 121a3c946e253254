"""CDK entry point: `cdk synth -c env=NAME` (default dev), `cdk synth -c pipeline=true` for the pipeline.

Also writes the environment's plain Kubernetes manifests to dist/<env>/ for `kubectl apply -f`.
A bad config prints one line to stderr and exits 2 (the CDK CLI runs this file as a subprocess).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from eks_dra.config import load_environment, load_pipeline
from eks_dra.errors import UserError

# Relative when run from the repository root, so that error messages name `config/dev.yaml`.
CONFIG_DIR = Path(os.path.relpath(Path(__file__).resolve().parent / "config"))


def build_app(app: cdk.App) -> None:
    from eks_dra.stacks.cluster_stack import ClusterStack

    if str(app.node.try_get_context("pipeline") or "").lower() == "true":
        from eks_dra.stacks.pipeline_stack import PipelineStack

        pipeline = load_pipeline(CONFIG_DIR)
        _print_warnings(*pipeline.environments)
        PipelineStack(app, "EksDraPipeline", pipeline)
        return
    env = load_environment(str(app.node.try_get_context("env") or "dev"), CONFIG_DIR)
    _print_warnings(env)
    ClusterStack(app, f"EksDra-{env.name}", env)
    _write_manifests(env)


def _write_manifests(env) -> None:
    try:
        from eks_dra.stacks.manifests import write_manifests
    except ModuleNotFoundError as exc:
        if exc.name != "eks_dra.stacks.manifests":
            raise
        return
    write_manifests(env, Path("dist") / env.name)


def _print_warnings(*envs) -> None:
    for env in envs:
        for warning in env.warnings:
            print(f"eks-dra: warning: {warning}", file=sys.stderr)


def main() -> None:
    app = cdk.App()
    try:
        build_app(app)
    except UserError as exc:
        print(f"eks-dra: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    app.synth()


if __name__ == "__main__":
    main()
