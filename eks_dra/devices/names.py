"""The names users write: driver names per device family, DeviceClass names and opaque-config kinds.

By default eks-dra's drivers present themselves exactly as the upstream drivers do (reference
upstream-compat.md): driver names `gpu.nvidia.com`, `dra.net` (EFA, DRANET's name) and `neuron.aws.com`,
the upstream DeviceClasses and the upstream opaque-config kinds. YAML from the EKS user guide therefore
works unchanged, and a family can switch between our driver and the vendor's without editing a workload.
`drivers.names` of an environment chooses other driver names; classes then follow the chosen names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Family = Literal["gpu", "efa", "neuron"]
FAMILIES: tuple[Family, ...] = ("gpu", "efa", "neuron")
DeviceKind = Literal["gpu", "mig", "efa", "neuron"]  # what a DeviceClass selects
DEVICE_KINDS: tuple[DeviceKind, ...] = ("gpu", "mig", "efa", "neuron")

# DeviceClasses of the upstream charts (dra-driver-nvidia-gpu deviceclass-{gpu,mig}.yaml, aws-dranet
# deviceclass.yaml, neuron-helm-chart dra-driver-deviceclass.yaml).
UPSTREAM_CLASSES: dict[DeviceKind, str] = {"gpu": "gpu.nvidia.com", "mig": "mig.nvidia.com",
                                           "efa": "efa.networking.k8s.aws", "neuron": "neuron.aws.com"}

# Opaque configuration kinds, as the upstream drivers define them (dra-driver-nvidia-gpu
# api/nvidia.com/resource/v1beta1; aws-neuron-sdk deploy/eks/dra.rst).
GPU_CONFIG_API_VERSION = "resource.nvidia.com/v1beta1"
GPU_CONFIG_KIND = "GpuConfig"
MIG_CONFIG_KIND = "MigDeviceConfig"
NEURON_CONFIG_API_VERSION = "neuron.aws.com/v1"
# NVIDIA ComputeDomains (IMEX over Multi-Node NVLink): the vendor driver's controller serves them; eks-dra has none.
COMPUTE_DOMAIN_API_VERSION = "resource.nvidia.com/v1beta1"
COMPUTE_DOMAIN_KIND = "ComputeDomain"
COMPUTE_DOMAIN_DRIVER = "compute-domain.nvidia.com"
COMPUTE_DOMAIN_CLASSES = ("compute-domain-daemon.nvidia.com", "compute-domain-default-channel.nvidia.com")
NEURON_CONFIG_KIND = "NeuronConfig"


@dataclass(frozen=True)
class DriverNames:
    """The DRA driver name of each family; the name is also the domain of the driver's attributes."""

    gpu: str = "gpu.nvidia.com"
    efa: str = "dra.net"
    neuron: str = "neuron.aws.com"

    def for_family(self, family: Family) -> str:
        return getattr(self, family)

    def family_of(self, driver: str) -> Family:
        """The family a driver name of these names serves; ValueError for another driver."""
        for family in FAMILIES:
            if self.for_family(family) == driver:
                return family
        raise ValueError(f"{driver} is none of the drivers {', '.join(self.for_family(f) for f in FAMILIES)}")

    def class_name(self, kind: DeviceKind) -> str:
        """The DeviceClass of `gpu`, `mig`, `efa` or `neuron` devices: the upstream class while the family
        keeps the upstream driver name, otherwise named after the driver (`mig.<gpu driver>` for MIG)."""
        family: Family = "gpu" if kind == "mig" else kind
        name = self.for_family(family)
        if name == UPSTREAM_DRIVER_NAMES.for_family(family):
            return UPSTREAM_CLASSES[kind]
        return f"mig.{name}" if kind == "mig" else name


UPSTREAM_DRIVER_NAMES = DriverNames()  # what the vendor drivers call themselves
DEFAULT_DRIVER_NAMES = UPSTREAM_DRIVER_NAMES
