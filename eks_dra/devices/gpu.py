"""GPU family: attribute names and the one function that turns GPU facts into a published device."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from eks_dra.catalog import GpuModel, MigProfile, PciLocation

from .model import PCIE_ROOT, Device, Version

TYPE = "type"
UUID = "uuid"
INDEX = "index"
PRODUCT_NAME = "productName"
ARCHITECTURE = "architecture"
CUDA_COMPUTE_CAPABILITY = "cudaComputeCapability"
DRIVER_VERSION = "driverVersion"
PCIE_BUS_ID = "pcieBusID"
NUMA_NODE = "numaNode"
PROFILE = "profile"
PARENT_UUID = "parentUUID"
CAP_MEMORY = "memory"
CAP_MULTIPROCESSORS = "multiprocessors"

DEFAULT_DRIVER_VERSION = "580.95.05"  # AL2023 NVIDIA AMI ships the 580 branch
_UUID_NS = uuid.UUID("8f6a3c1e-5d2b-4f0a-9c7e-2b1d4e6f8a90")


@dataclass(frozen=True)
class GpuFacts:
    """What discovery learns about one physical GPU (from NVML or the host tree)."""

    minor: int
    uuid: str
    product_name: str
    architecture: str
    cuda_compute_capability: str
    driver_version: str
    pci: PciLocation
    memory_mib: int
    multiprocessors: int


@dataclass(frozen=True)
class MigFacts:
    parent: GpuFacts
    profile: str
    placement: int  # index of this instance among the parent's instances of the layout
    uuid: str
    memory_mib: int
    multiprocessors: int


def simulated_gpu_uuid(node_name: str, pci_address: str) -> str:
    """Stable fake UUID for simulated GPUs and fixtures (real nodes report NVML's)."""
    return f"GPU-{uuid.uuid5(_UUID_NS, f'{node_name}/{pci_address}')}"


def simulated_mig_uuid(parent_uuid: str, profile: str, placement: int) -> str:
    return f"MIG-{uuid.uuid5(_UUID_NS, f'{parent_uuid}/{profile}/{placement}')}"


def gpu_facts(model: GpuModel, minor: int, pci: PciLocation, node_name: str,
              driver_version: str = DEFAULT_DRIVER_VERSION) -> GpuFacts:
    return GpuFacts(
        minor=minor,
        uuid=simulated_gpu_uuid(node_name, pci.address),
        product_name=model.product_name,
        architecture=model.architecture,
        cuda_compute_capability=model.cuda_compute_capability,
        driver_version=driver_version,
        pci=pci,
        memory_mib=model.memory_mib,
        multiprocessors=model.multiprocessors,
    )


def mig_facts(parent: GpuFacts, profile: MigProfile) -> list[MigFacts]:
    """A GPU partitioned into as many instances of one profile as fit (static MIG layout)."""
    return [
        MigFacts(parent, profile.name, j, simulated_mig_uuid(parent.uuid, profile.name, j),
                 profile.memory_mib, profile.multiprocessors)
        for j in range(profile.max_instances)
    ]


def gpu_device_name(minor: int) -> str:
    return f"gpu-{minor}"


def mig_device_name(parent_minor: int, profile: str, placement: int) -> str:
    return f"gpu-{parent_minor}-mig-{profile.replace('.', '-')}-{placement}"


def _common(f: GpuFacts) -> dict:
    return {
        PRODUCT_NAME: f.product_name,
        ARCHITECTURE: f.architecture,
        CUDA_COMPUTE_CAPABILITY: Version.from_loose(f.cuda_compute_capability),
        DRIVER_VERSION: Version.from_loose(f.driver_version),
        PCIE_BUS_ID: f.pci.address,
        NUMA_NODE: f.pci.numa_node,
        PCIE_ROOT: f.pci.root,
    }


def gpu_device(f: GpuFacts) -> Device:
    attrs = {TYPE: "gpu", UUID: f.uuid, INDEX: f.minor, **_common(f)}
    return Device(gpu_device_name(f.minor), attrs, {CAP_MEMORY: f"{f.memory_mib}Mi",
                                                    CAP_MULTIPROCESSORS: str(f.multiprocessors)})


def mig_device(m: MigFacts) -> Device:
    attrs = {TYPE: "mig", UUID: m.uuid, PARENT_UUID: m.parent.uuid, PROFILE: m.profile,
             INDEX: m.parent.minor, **_common(m.parent)}
    return Device(mig_device_name(m.parent.minor, m.profile, m.placement), attrs,
                  {CAP_MEMORY: f"{m.memory_mib}Mi", CAP_MULTIPROCESSORS: str(m.multiprocessors)})
