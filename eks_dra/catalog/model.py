"""Typed records of the instance catalog: what EC2 says plus the PCIe/NUMA topology of every device."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

AcceleratorKind = Literal["gpu", "neuron"]
Architecture = Literal["x86_64", "arm64"]


@dataclass(frozen=True)
class PciLocation:
    """Where a PCI function sits: its bus address, the PCIe root complex above it and its NUMA node."""

    address: str  # full BDF, e.g. "0000:53:00.0"
    root: str  # "pci0000:44", the value of resource.kubernetes.io/pcieRoot
    numa_node: int

    @property
    def bus(self) -> int:
        return int(self.address.split(":")[1], 16)


@dataclass(frozen=True)
class MigProfile:
    """One NVIDIA MIG profile of a GPU model (static MIG: partitions created before the driver starts)."""

    name: str  # "1g.10gb"
    max_instances: int  # how many fit on one GPU
    memory_mib: int
    multiprocessors: int
    slices: int  # compute slices used out of 7


@dataclass(frozen=True)
class GpuModel:
    ec2_name: str  # the name DescribeInstanceTypes gives ("H100")
    product_name: str  # what NVML reports ("NVIDIA H100 80GB HBM3")
    architecture: str  # "Hopper"
    cuda_compute_capability: str  # "9.0"
    pci_device_id: int
    memory_mib: int
    multiprocessors: int
    mig_profiles: tuple[MigProfile, ...] = ()

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    def mig_profile(self, name: str) -> MigProfile:
        for profile in self.mig_profiles:
            if profile.name == name:
                return profile
        known = ", ".join(p.name for p in self.mig_profiles) or "none (not MIG-capable)"
        raise KeyError(f"MIG profile {name!r} does not exist on {self.product_name}; known: {known}")


@dataclass(frozen=True)
class NeuronModel:
    ec2_name: str  # "Trainium2"
    pci_device_id: int
    cores_per_device: int
    core_version: int
    memory_mib: int  # per device


@dataclass(frozen=True)
class Accelerator:
    index: int
    pci: PciLocation


@dataclass(frozen=True)
class EfaInterface:
    index: int
    network_card: int
    pci: PciLocation
    pci_device_id: int  # 0xefa0..0xefa3, the EFA generation


@dataclass(frozen=True)
class InstanceType:
    """One EC2 instance type with everything eks-dra needs to know about it."""

    name: str
    architecture: Architecture
    vcpus: int
    memory_mib: int
    accelerator_kind: AcceleratorKind | None
    accelerator_count: int
    gpu: GpuModel | None
    neuron: NeuronModel | None
    efa_supported: bool
    max_efa_interfaces: int
    network_cards: int
    max_network_interfaces: int
    numa_nodes: int
    accelerators: tuple[Accelerator, ...] = ()
    efa_interfaces: tuple[EfaInterface, ...] = ()
    # Neuron device index -> index of the EFA interface it is wired to (Trainium only).
    neuron_efa_map: tuple[int, ...] = ()
    # Network card 0 carries an EFA (efa-only at device index 1) unless this is False (p6-b300 style).
    efa_on_card0: bool = True
    notes: tuple[str, ...] = field(default=())

    @property
    def family(self) -> str:
        return self.name.split(".")[0]

    @property
    def size(self) -> str:
        return self.name.split(".", 1)[1]

    @property
    def ec2_category(self) -> str:
        """The vCPU-quota category: P, G, Trn or Inf (On-Demand quota names)."""
        fam = self.family
        if fam.startswith("trn"):
            return "Trn"
        if fam.startswith("inf"):
            return "Inf"
        return fam[0].upper()

    @property
    def mig_capable(self) -> bool:
        return self.gpu is not None and self.gpu.mig_capable
