"""The Kubernetes versions eks-dra deploys: one function the config calls, plain data.

1.34: DRA GA, the default. 1.33: DRA on but kubernetes/kubernetes#133920 open (warns). Older versions lack DRA
on EKS; newer ones wait for their kubectl layer (the cluster construct picks the layer per version).
"""

from __future__ import annotations

import re

DEFAULT_KUBERNETES_VERSION = "1.34"
SUPPORTED_KUBERNETES_VERSIONS = ("1.33", "1.34")
KUBERNETES_133_ISSUE = "kubernetes/kubernetes#133920"


def validate_kubernetes_version(version: str) -> list[str]:
    """Warnings for a supported version; ValueError with the one-line reason and fix for any other."""
    match = re.fullmatch(r"1\.(\d+)", version)
    if not match:
        raise ValueError(f"{version!r} is not a Kubernetes minor version; use \"{DEFAULT_KUBERNETES_VERSION}\"")
    if int(match.group(1)) < 33:
        raise ValueError(f"{version} is too old: DRA on EKS needs 1.33 or later (GA in 1.34); set "
                         f"kubernetesVersion: \"{DEFAULT_KUBERNETES_VERSION}\"")
    if version not in SUPPORTED_KUBERNETES_VERSIONS:
        raise ValueError(f"{version} is not supported yet (eks-dra ships the kubectl v34 layer); use "
                         f"\"{DEFAULT_KUBERNETES_VERSION}\"")
    if version == "1.33":
        return [f"1.33 has a known DRA bug ({KUBERNETES_133_ISSUE}); EKS recommends 1.34"]
    return []
