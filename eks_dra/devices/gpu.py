"""GPU family: the upstream NVIDIA driver's attribute vocabulary and the builders of published devices.

Names and types follow dra-driver-nvidia-gpu v0.4.1 (`cmd/gpu-kubelet-plugin/deviceinfo.go`, `mig.go`):
full GPUs publish `type`, `uuid`, `productName`, `brand`, `architecture`, `cudaComputeCapability`,
`driverVersion`, `cudaDriverVersion` (versions), the standard `resource.kubernetes.io/pciBusID` and
`pcieRoot`, `addressingMode` where NVML reports one, and the capacity `memory` in bytes. MIG devices publish
the parent's attributes plus `profile` and `parentUUID`, and the capacities `multiprocessors`,
`copyEngines`, `decoders`, `encoders`, `jpegEngines`, `ofaEngines`, `memory` and one `memorySlice<i>` per
memory slice they occupy. Upstream removed `index`; we add `numaNode` (the EFA family has it too).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from eks_dra.catalog import GpuModel, MigProfile, PciLocation

from .model import PCIE_ROOT, Device, Version

TYPE = "type"
UUID = "uuid"
PRODUCT_NAME = "productName"
BRAND = "brand"
ARCHITECTURE = "architecture"
CUDA_COMPUTE_CAPABILITY = "cudaComputeCapability"
DRIVER_VERSION = "driverVersion"
CUDA_DRIVER_VERSION = "cudaDriverVersion"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
ADDRESSING_MODE = "addressingMode"
NUMA_NODE = "numaNode"  # not upstream: kept for NUMA-aligned claims
PROFILE = "profile"
PARENT_UUID = "parentUUID"
CAP_MEMORY = "memory"
CAP_MULTIPROCESSORS = "multiprocessors"
CAP_COPY_ENGINES = "copyEngines"
CAP_DECODERS = "decoders"
CAP_ENCODERS = "encoders"
CAP_JPEG_ENGINES = "jpegEngines"
CAP_OFA_ENGINES = "ofaEngines"
CAP_MEMORY_SLICE = "memorySlice{index}"

DEFAULT_DRIVER_VERSION = "580.95.05"  # AL2023 NVIDIA AMI ships the 580 branch
DEFAULT_CUDA_DRIVER_VERSION = "13.0"  # the CUDA version of the 580 branch
DEFAULT_BRAND = "Nvidia"  # NVML_BRAND_NVIDIA as go-nvlib names it; data-center GPUs of current drivers
MEMORY_SLICES = 8  # A100/H100/H200/B200: a GPU's memory is 8 MIG memory slices
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
    brand: str = DEFAULT_BRAND
    cuda_driver_version: str = DEFAULT_CUDA_DRIVER_VERSION
    addressing_mode: str | None = None  # NVML's (HMM, ATS, None) on coherent-memory systems only
    memory_bytes: int | None = None  # NVML's total; None: memory_mib MiB (catalog, fixtures)

    @property
    def total_memory_bytes(self) -> int:
        return self.memory_bytes if self.memory_bytes is not None else self.memory_mib << 20


@dataclass(frozen=True)
class MigEngines:
    """Engine counts of a MIG profile (NVML's GpuInstanceProfileInfo)."""

    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int


@dataclass(frozen=True)
class MigFacts:
    parent: GpuFacts
    profile: str
    placement: int  # index of this instance among the parent's instances of the layout
    uuid: str
    memory_mib: int
    multiprocessors: int
    memory_slices: tuple[int, ...] = ()  # the memory slices (0..7) the instance occupies
    engines: MigEngines | None = None  # None: not known (published without engine capacities)


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


def memory_slices_of(mig_memory_mib: int, gpu_memory_mib: int, placement: int) -> tuple[int, ...]:
    """The memory slices of instance `placement` of a static one-profile layout: an instance takes its share
    of the GPU's 8 slices (1g.5gb of 40 GB: 1, 3g.20gb: 4), and instances tile them in order."""
    size = max(1, round(mig_memory_mib * MEMORY_SLICES / gpu_memory_mib))
    return tuple(range(placement * size, placement * size + size))


def mig_facts(parent: GpuFacts, profile: MigProfile) -> list[MigFacts]:
    """A GPU partitioned into as many instances of one profile as fit (static MIG layout)."""
    return [
        MigFacts(parent, profile.name, j, simulated_mig_uuid(parent.uuid, profile.name, j),
                 profile.memory_mib, profile.multiprocessors, memory_slices_of(profile.memory_mib, parent.memory_mib, j))
        for j in range(profile.max_instances)
    ]


def gpu_device_name(minor: int) -> str:
    return f"gpu-{minor}"


def mig_device_name(parent_minor: int, profile: str, placement: int) -> str:
    return f"gpu-{parent_minor}-mig-{profile.replace('.', '-')}-{placement}"


def gpu_minor_of(device_name: str) -> int:
    """The (parent) GPU's minor number from a name of gpu_device_name or mig_device_name."""
    return int(device_name.split("-")[1])


def _common(f: GpuFacts) -> dict:
    attrs = {
        PRODUCT_NAME: f.product_name,
        BRAND: f.brand,
        ARCHITECTURE: f.architecture,
        CUDA_COMPUTE_CAPABILITY: Version.from_loose(f.cuda_compute_capability),
        DRIVER_VERSION: Version.from_loose(f.driver_version),
        CUDA_DRIVER_VERSION: Version.from_loose(f.cuda_driver_version),
        PCI_BUS_ID: f.pci.address,
        PCIE_ROOT: f.pci.root,
        NUMA_NODE: f.pci.numa_node,
    }
    if f.addressing_mode:
        attrs[ADDRESSING_MODE] = f.addressing_mode
    return attrs


def gpu_device(f: GpuFacts) -> Device:
    attrs = {TYPE: "gpu", UUID: f.uuid, **_common(f)}
    return Device(gpu_device_name(f.minor), attrs, {CAP_MEMORY: str(f.total_memory_bytes)})


def mig_device(m: MigFacts) -> Device:
    attrs = {TYPE: "mig", UUID: m.uuid, PARENT_UUID: m.parent.uuid, PROFILE: m.profile, **_common(m.parent)}
    capacity = {CAP_MEMORY: str(m.memory_mib << 20), CAP_MULTIPROCESSORS: str(m.multiprocessors)}
    if m.engines is not None:
        capacity.update({CAP_COPY_ENGINES: str(m.engines.copy_engines), CAP_DECODERS: str(m.engines.decoders),
                         CAP_ENCODERS: str(m.engines.encoders), CAP_JPEG_ENGINES: str(m.engines.jpeg_engines),
                         CAP_OFA_ENGINES: str(m.engines.ofa_engines)})
    for i in m.memory_slices:
        capacity[CAP_MEMORY_SLICE.format(index=i)] = "1"
    return Device(mig_device_name(m.parent.minor, m.profile, m.placement), attrs, capacity)
