"""The Kubernetes versions eks-dra deploys, and everything that follows from the version.

One table, plain data (no aws_cdk import): the EKS support window and its price, the kubectl Lambda layer
the CDK's kubectl provider needs, the EKS add-on versions known to run on it, the cdk8s-plus package whose
types match it, and which DRA feature gates are on by default. Sources: Kubernetes
`pkg/features/kube_features.go` per release, the EKS version calendar, the extended-support pricing post,
PyPI for the layers.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

DEFAULT_KUBERNETES_VERSION = "1.34"
KUBERNETES_133_ISSUE = "kubernetes/kubernetes#133920"

# EKS cluster-hour prices (USD), the same in every commercial region.
STANDARD_SUPPORT_PRICE = 0.10
EXTENDED_SUPPORT_PRICE = 0.60

# DRA feature gates (their Kubernetes names) that change what eks-dra generates or what its drivers do.
DRA_EXTENDED_RESOURCE = "DRAExtendedResource"
DRA_DEVICE_TAINTS = "DRADeviceTaints"
DRA_PRIORITIZED_LIST = "DRAPrioritizedList"
DRA_ADMIN_ACCESS = "DRAAdminAccess"
DRA_PARTITIONABLE_DEVICES = "DRAPartitionableDevices"
DRA_DEVICE_BINDING_CONDITIONS = "DRADeviceBindingConditions"
DRA_CONSUMABLE_CAPACITY = "DRAConsumableCapacity"
DRA_RESOURCE_CLAIM_DEVICE_STATUS = "DRAResourceClaimDeviceStatus"
RESOURCE_HEALTH_STATUS = "ResourceHealthStatus"

_GATES_134 = frozenset({DRA_PRIORITIZED_LIST, DRA_ADMIN_ACCESS, DRA_RESOURCE_CLAIM_DEVICE_STATUS})
_GATES_136 = _GATES_134 | {DRA_EXTENDED_RESOURCE, DRA_DEVICE_TAINTS, DRA_PARTITIONABLE_DEVICES,
                           DRA_DEVICE_BINDING_CONDITIONS, DRA_CONSUMABLE_CAPACITY, RESOURCE_HEALTH_STATUS}


@dataclass(frozen=True)
class Addons:
    """EKS managed add-on versions known to support the Kubernetes version (None: EKS's default for it).

    The VPC CNI is pinned (efa-only interfaces need >= 1.18.5; EKS publishes one latest VPC CNI build for every
    supported Kubernetes version); coredns and kube-proxy follow the Kubernetes minor, so EKS's default for the
    cluster's version is the one known to fit. `eks-dra preflight` asks EKS (DescribeAddonVersions) whether each
    pinned version is offered for the environment's Kubernetes version."""

    vpc_cni: str
    coredns: str | None = None
    kube_proxy: str | None = None
    pod_identity_agent: str | None = None


@dataclass(frozen=True)
class KubernetesVersion:
    version: str  # "1.34"
    on_eks_since: dt.date
    end_of_standard_support: dt.date
    end_of_extended_support: dt.date
    kubectl_layer_package: str  # the PyPI distribution
    kubectl_layer_module: str  # its Python module under aws_cdk
    kubectl_layer_class: str
    addons: Addons
    cdk8s_plus_package: str  # the cdk8s-plus distribution whose k8s types match this version
    dra_gates_on: frozenset[str]  # DRA feature gates on by default (beta on, or GA)
    warning: str | None = None  # said on every synth, e.g. a known bug

    @property
    def minor(self) -> int:
        return int(self.version.split(".")[1])

    def gate(self, name: str) -> bool:
        return name in self.dra_gates_on


def _layer(minor: int) -> dict[str, str]:
    return {"kubectl_layer_package": f"aws-cdk.lambda-layer-kubectl-v{minor}",
            "kubectl_layer_module": f"aws_cdk.lambda_layer_kubectl_v{minor}",
            "kubectl_layer_class": f"KubectlV{minor}Layer"}


# The cdk8s-plus-34 types already carry the 1.36 DRA fields (DeviceClassSpec.extendedResourceName,
# Device.taints); the API server drops a field whose gate is off, so one package serves all four.
VERSIONS: dict[str, KubernetesVersion] = {v.version: v for v in (
    KubernetesVersion(
        "1.33", dt.date(2025, 5, 29), dt.date(2026, 7, 29), dt.date(2027, 7, 29), **_layer(34),
        addons=Addons(vpc_cni="v1.20.1-eksbuild.3"), cdk8s_plus_package="cdk8s-plus-34",
        dra_gates_on=frozenset({DRA_PRIORITIZED_LIST, DRA_ADMIN_ACCESS}),
        warning=f"1.33 has a known DRA bug ({KUBERNETES_133_ISSUE}); EKS recommends 1.34"),
    KubernetesVersion(
        "1.34", dt.date(2025, 10, 2), dt.date(2026, 12, 2), dt.date(2027, 12, 2), **_layer(34),
        addons=Addons(vpc_cni="v1.20.1-eksbuild.3"), cdk8s_plus_package="cdk8s-plus-34", dra_gates_on=_GATES_134),
    KubernetesVersion(
        "1.35", dt.date(2026, 1, 27), dt.date(2027, 3, 27), dt.date(2028, 3, 27), **_layer(35),
        addons=Addons(vpc_cni="v1.20.1-eksbuild.3"), cdk8s_plus_package="cdk8s-plus-34", dra_gates_on=_GATES_134),
    KubernetesVersion(
        "1.36", dt.date(2026, 6, 2), dt.date(2027, 8, 2), dt.date(2028, 8, 2), **_layer(36),
        addons=Addons(vpc_cni="v1.20.1-eksbuild.3"), cdk8s_plus_package="cdk8s-plus-34", dra_gates_on=_GATES_136),
)}
OLDEST_MINOR = min(v.minor for v in VERSIONS.values())
NEWEST_MINOR = max(v.minor for v in VERSIONS.values())


def kubernetes_version(version: str) -> KubernetesVersion:
    """The table row of an accepted version (validate_kubernetes_version first); KeyError otherwise."""
    return VERSIONS[version]


def utc_today() -> dt.date:
    """The date the support windows are judged on (tests pin it: the EKS calendar moves under them)."""
    return dt.datetime.now(dt.UTC).date()


def validate_kubernetes_version(version: str, today: dt.date | None = None) -> list[str]:
    """Warnings for an accepted `kubernetesVersion`; ValueError with the one-line reason and fix otherwise.

    `today` (default: the UTC date now) decides whether the version is past its EKS end of standard support.
    """
    default = f'kubernetesVersion: "{DEFAULT_KUBERNETES_VERSION}"'
    match = re.fullmatch(r"1\.(\d+)", version)
    if not match:
        raise ValueError(f"{version!r} is not a Kubernetes minor version; use {default}")
    minor = int(match.group(1))
    if minor < OLDEST_MINOR:
        raise ValueError(f"{version} is too old: DRA on EKS needs 1.{OLDEST_MINOR} or later (GA in 1.34); "
                         f"set {default}")
    if minor > NEWEST_MINOR:
        raise ValueError(f"{version} is not supported yet: the pinned aws-cdk-lib has no KubernetesVersion for it "
                         f"and its EKS availability is unconfirmed; use 1.{NEWEST_MINOR} or older "
                         f"(eks_dra/versions.py lists the supported versions)")
    row = VERSIONS[version]
    warnings = [row.warning] if row.warning else []
    today = today or utc_today()
    if today >= row.end_of_extended_support:
        raise ValueError(f"{version} left EKS extended support on {row.end_of_extended_support.isoformat()}; "
                         f"EKS has upgraded such clusters: set kubernetesVersion: \"1.{minor + 1}\"")
    if today >= row.end_of_standard_support:
        warnings.append(
            f"{version} left EKS standard support on {row.end_of_standard_support.isoformat()}: the cluster "
            f"costs ${EXTENDED_SUPPORT_PRICE:.2f} per cluster-hour instead of ${STANDARD_SUPPORT_PRICE:.2f} until "
            f"{row.end_of_extended_support.isoformat()}; upgrade to \"1.{minor + 1}\" (one minor at a time)")
    return warnings


def check_upgrade(deployed: str, wanted: str) -> str | None:
    """The reason a change of the cluster from `deployed` to `wanted` is refused, or None when EKS can do it.

    EKS updates the control plane one minor version per update and never downgrades it.
    """
    old, new = (int(v.split(".")[1]) for v in (deployed, wanted))
    if new < old:
        return (f"the cluster runs {deployed} and EKS cannot downgrade a control plane to {wanted}; "
                f"keep kubernetesVersion: \"{deployed}\"")
    if new > old + 1:
        return (f"the cluster runs {deployed} and EKS upgrades one minor version at a time; "
                f"set kubernetesVersion: \"1.{old + 1}\", deploy, then \"{wanted}\"")
    return None
