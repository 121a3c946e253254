"""The vendor DRA drivers (`drivers: <family>: upstream`) as plain Helm-chart data for the CDK stack.

Charts and values are the ones the EKS device-management guide installs (reference eks-accelerators.md
§3.2-§3.6). The stack passes each spec to `Cluster.add_helm_chart`; nothing here imports the CDK. The vendor
charts create their own DeviceClasses (`gpu.nvidia.com`, `mig.nvidia.com`, `efa.networking.k8s.aws`,
`neuron.aws.com`), which the samples then use.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from . import labels


@dataclass(frozen=True)
class HelmChartSpec:
    id: str  # construct id and Helm release name
    chart: str
    repository: str  # https:// or oci://
    version: str  # pinned: an unpinned chart installs whatever the registry calls latest on the next deploy
    namespace: str
    values: dict[str, Any] = field(default_factory=dict)
    create_namespace: bool = True


def _dra_node_affinity(family: str) -> dict:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": labels.family_label(family), "operator": "In", "values": [labels.MANAGER_DRA]}]}
    ]}}}


Taints = tuple[tuple[str, str, str], ...]  # (key, value, effect) of the DRA node groups' own taints


def _tolerations(user_taints: Taints) -> list[dict]:
    """The accelerator taints, and the node groups' own taints exactly (as the eks-dra drivers tolerate them)."""
    return [*({"key": key, "operator": "Exists", "effect": "NoSchedule"} for key in labels.ACCELERATOR_TAINTS),
            *({"key": k, "operator": "Equal", "value": v, "effect": e} for k, v, e in user_taints)]


def nvidia_dra_driver(user_taints: Taints = ()) -> HelmChartSpec:
    return HelmChartSpec(
        id="dra-driver-nvidia-gpu",
        chart="dra-driver-nvidia-gpu",
        repository="oci://registry.k8s.io/dra-driver-nvidia/charts/dra-driver-nvidia-gpu",
        version="0.4.1",
        namespace="nvidia",
        values={
            "resources": {"computeDomains": {"enabled": False}},
            # Required while KEP-5004 is not GA: the chart refuses GPU resources without the override.
            "gpuResourcesEnabledOverride": True,
            # The opaque TimeSlicing config of the time-slicing sample needs this alpha gate.
            "featureGates": {"TimeSlicingSettings": True},
            # The chart's default affinity (nvidia.com/gpu.present) also matches device-plugin GPU groups.
            "kubeletPlugin": {"affinity": _dra_node_affinity("gpu"), "tolerations": _tolerations(user_taints)},
        },
    )


def aws_dranet(user_taints: Taints = ()) -> HelmChartSpec:
    return HelmChartSpec(
        id="aws-dranet",
        chart="aws-dranet",
        repository="https://aws.github.io/eks-charts",
        version="1.0.0",
        namespace="kube-system",
        create_namespace=False,
        # The chart tolerates nothing by default; accelerator nodes are tainted.
        values={"tolerations": _tolerations(user_taints)},
    )


def neuron_dra_driver(user_taints: Taints = ()) -> HelmChartSpec:
    return HelmChartSpec(
        id="neuron-helm-chart",
        chart="neuron-helm-chart",
        repository="oci://public.ecr.aws/neuron/neuron-helm-chart",
        # The guide pins none. 1.10.0 (https://gallery.ecr.aws/neuron/neuron-helm-chart, chart digest
        # sha256:ed5d8f73b7a05d3a1edf17b2bfaf277ea995ad1c65b115fa8ba2c7b4dc649346) ships draDriver with the
        # neuron-dra-driver image 1.2.0 and the draDriver.tolerations value (aws-neuron/neuron-helm-charts
        # charts/neuron-helm-chart/README.md, "DRA Driver Configuration").
        version="1.10.0",
        namespace="neuron-dra-driver",
        values={"devicePlugin": {"enabled": False}, "npd": {"enabled": False},
                # Replaces the chart's default list, which tolerates aws.amazon.com/neuron and CriticalAddonsOnly.
                "draDriver": {"enabled": True, "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"},
                                                               *_tolerations(user_taints)]}},
    )


def with_compute_domains(spec: HelmChartSpec) -> HelmChartSpec:
    """The NVIDIA chart with its ComputeDomain controller and kubelet plugin (IMEX on p6e-gb200 UltraServers,
    reference eks-accelerators.md §3.8): `resources.computeDomains.enabled`, which the guide's GPU install sets
    to false."""
    values = {**spec.values, "resources": {**spec.values.get("resources", {}), "computeDomains": {"enabled": True}}}
    return replace(spec, values=values)


UPSTREAM_CHARTS = {"gpu": nvidia_dra_driver, "efa": aws_dranet, "neuron": neuron_dra_driver}
# Families whose vendor chart cannot be pinned to DRA node groups by a documented value: their DaemonSet
# would also run on device-plugin node groups (dranet selects by instance type, the Neuron chart by its own).
UNPINNABLE = ("efa", "neuron")
