"""The app's stacks. Imported lazily: `eks_dra.stacks.manifests` (cdk8s only) must not pay for aws_cdk."""

from __future__ import annotations

from typing import Any

__all__ = ["ClusterStack", "PipelineStack"]


def __getattr__(name: str) -> Any:
    if name == "ClusterStack":
        from .cluster_stack import ClusterStack

        return ClusterStack
    if name == "PipelineStack":
        from .pipeline_stack import PipelineStack

        return PipelineStack
    raise AttributeError(name)
