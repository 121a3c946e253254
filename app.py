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

from eks_dra.config import EnvironmentConfig, load_environment, load_pipeline
from eks_dra.constructs.eks_checks import EksDraChecks
from eks_dra.errors import UserError
from eks_dra.stacks.manifests import needs_driver_image, write_manifests

# Relative when run from the repository root, so that error messages name `config/dev.yaml`.
CONFIG_DIR = Path(os.path.relpath(Path(__file__).resolve().parent / "config"))


def build_app(app: cdk.App, config_dir: Path = CONFIG_DIR, manifests_dir: Path | None = Path("dist")) -> list:
    """Add the stacks chosen by the app's context and the cdk-nag checks; return the stacks.
    Writes dist/<env>/*.k8s.yaml unless manifests_dir is None. Raises UserError on a bad config."""
    from eks_dra.stacks.cluster_stack import ClusterStack

    stacks: list = []
    if str(app.node.try_get_context("pipeline") or "").lower() == "true":
        from eks_dra.stacks.pipeline_stack import PipelineStack

        pipeline = load_pipeline(config_dir)
        _print_warnings(*pipeline.environments)
        stacks.append(PipelineStack(app, "EksDraPipeline", pipeline))
    else:
        env = load_environment(str(app.node.try_get_context("env") or "dev"), config_dir)
        _print_warnings(env)
        stack = ClusterStack(app, f"EksDra-{env.name}", env)
        stacks.append(stack)
        if manifests_dir is not None:
            _write_dist(env, stack.driver_image_reference, manifests_dir / env.name)
    # cdk-nag 3 is a policy-validation plugin: findings without an acknowledgement fail the synth. AwsSolutions
    # never sees the aws_eks_v2 cluster; EksDraChecks checks it.
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app), EksDraChecks(app))
    return stacks


def _write_dist(env: EnvironmentConfig, image: str | None, out_dir: Path) -> None:
    """Plain manifests name only an image a cluster can pull; without one the driver DaemonSets are left out."""
    drivers = image is not None or not needs_driver_image(env)
    if not drivers:
        print(f"eks-dra: warning: {out_dir}/ has no eks-dra driver DaemonSets: no driver image a cluster outside CDK "
              f"could pull (the CDK-built image's URI is known only at deploy without an account); set driverImage: "
              f"REPO:TAG in {env.source}", file=sys.stderr)
    write_manifests(env, out_dir, image, drivers=drivers)


def _print_warnings(*envs: EnvironmentConfig) -> None:
    for env in envs:
        for warning in (*env.warnings, env.access_warning):
            if warning:
                print(f"eks-dra: warning: {warning}", file=sys.stderr)


def main() -> None:
    app = cdk.App()
    try:
        # `-c dist=DIR` writes the manifests elsewhere (make synth writes to a scratch folder first).
        build_app(app, manifests_dir=Path(app.node.try_get_context("dist") or "dist"))
    except UserError as exc:
        print(f"eks-dra: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    app.synth()


if __name__ == "__main__":
    main()
