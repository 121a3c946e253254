"""GPU discovery: a node's host tree -> the NVIDIA GPUs and MIG devices the GPU driver publishes.

Sources: PCI functions of vendor 0x10de (class 0x0302 / 0x0300) under /sys/bus/pci/devices; NVML when
libnvidia-ml loads from the driver root (uuid, name, architecture, compute capability, memory, MIG devices).
Without NVML, /proc/driver/nvidia/gpus/<BDF>/information and /proc/driver/nvidia/version plus the catalog's
GpuModel matched by PCI device id. MIG without NVML is read from FIXTURE_MIG_FILE, which exists only in
fixture host trees; on a real node without NVML a GPU with MIG instances makes the inventory not ready.
The facts records (GpuFacts, MigFacts) become devices with the builders the planner uses (DESIGN.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from eks_dra.catalog import GPU_MODELS, InstanceType
from eks_dra.devices import gpu as gpu_model

from ..framework.hosttree import (
    FIXTURE_DIR,
    DiscoveryError,
    PciFunction,
    device_node_exists,
    instance_type_of,
    is_fixture,
    list_pci_functions,
    read_optional,
    read_text,
    readiness,
)
from ..framework.inventory import DiscoveredDevice, Inventory
from . import mig as mig_marker
from .cdi_edits import CONTROL_DEVICE_NODES
from .driver_root import DriverRootError
from .host import GpuHost
from .nvml import NvmlBackend, NvmlGpu

NVIDIA_VENDOR = 0x10DE
GPU_PCI_CLASSES = (0x0302, 0x0300)  # 3D controller (datacenter GPUs), VGA controller
GPU_MODELS_BY_PCI_ID = {m.pci_device_id: m for m in GPU_MODELS.values()}

# Present only in host trees written by `eks-dra fixture` (see fixture.py).
FIXTURE_MIG_FILE = FIXTURE_DIR / "mig.json"
FIXTURE_XID_DIR = FIXTURE_DIR / "xid"

NVIDIA_VERSION_FILE = Path("proc/driver/nvidia/version")
NVIDIA_GPUS_DIR = Path("proc/driver/nvidia/gpus")
NVIDIA_CAPS_DIR = Path("proc/driver/nvidia/capabilities")
NVIDIA_MIG_MINORS = Path("proc/driver/nvidia-caps/mig-minors")


def parse_nvidia_information(text: str) -> dict[str, str]:
    """/proc/driver/nvidia/gpus/<BDF>/information: "Key:<tabs> value" lines."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def parse_nvidia_version(text: str) -> str:
    """/proc/driver/nvidia/version's first line: "NVRM version: NVIDIA UNIX ... Kernel Module  580.95.05  ..."."""
    first = text.splitlines()[0] if text else ""
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", first) or re.search(
        r"\s(\d+\.\d+(?:\.\d+)?)\s", first)
    if not m:
        raise DiscoveryError(f"/proc/driver/nvidia/version: no driver version in {first[:80]!r}")
    return m.group(1)


def _mig_minors(host_root: Path) -> dict[str, int]:
    """/proc/driver/nvidia-caps/mig-minors: "gpu0/gi1/access 12" -> {"gpu0/gi1/access": 12}."""
    out = {}
    for line in (read_optional(host_root / NVIDIA_MIG_MINORS) or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


@dataclass(frozen=True)
class MigInstance:
    """One MIG device as NVML (or the fixture MIG file) describes it."""

    profile: str
    placement_start: int
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    memory_mib: int
    multiprocessors: int


def number_migs(migs: list[MigInstance]) -> list[tuple[MigInstance, int]]:
    """Each MIG device with its number among its GPU's instances of the same profile, in placement order.

    The number is the `placement` of MigFacts and the last part of the device name, so names stay stable
    while the layout does; HealthMonitor uses the same numbering to map GPU-instance events to names.
    """
    seen: dict[str, int] = {}
    out = []
    for m in sorted(migs, key=lambda m: (m.placement_start, m.gpu_instance_id)):
        out.append((m, seen.get(m.profile, 0)))
        seen[m.profile] = seen.get(m.profile, 0) + 1
    return out


def nvml_migs(g: NvmlGpu) -> list[MigInstance]:
    return [MigInstance(m.profile, m.placement_start, m.uuid, m.gpu_instance_id, m.compute_instance_id,
                        m.memory_mib, m.multiprocessors) for m in g.migs]


def _fixture_migs(host_root: Path) -> dict[str, list[MigInstance]]:
    """FIXTURE_MIG_FILE: {"gpus": {"<BDF>": [{profile, placementStart, uuid, gpuInstanceId,
    computeInstanceId, memoryMiB, multiprocessors}]}} (written by fixture.py; fixture host trees only)."""
    import json

    path = host_root / FIXTURE_MIG_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(read_text(path))
        return {bdf: [MigInstance(m["profile"], m["placementStart"], m["uuid"], m["gpuInstanceId"],
                                  m["computeInstanceId"], m["memoryMiB"], m["multiprocessors"]) for m in migs]
                for bdf, migs in data["gpus"].items()}
    except (ValueError, KeyError, TypeError, AttributeError, DiscoveryError) as exc:
        raise DiscoveryError(f"{path}: malformed fixture MIG file ({exc!r})") from None


def _gpu_from_nvml(g: NvmlGpu, pci: PciFunction, driver_version: str) -> gpu_model.GpuFacts:
    model = GPU_MODELS_BY_PCI_ID.get(g.pci_device_id)
    sms = g.multiprocessors if g.multiprocessors else (model.multiprocessors if model else 0)
    return gpu_model.GpuFacts(
        minor=g.minor, uuid=g.uuid, product_name=g.name, architecture=g.architecture,
        cuda_compute_capability=g.cuda_compute_capability, driver_version=driver_version,
        pci=pci.location, memory_mib=g.memory_mib, multiprocessors=sms,
    )


def _gpu_from_procfs(host_root: Path, pci: PciFunction, driver_version: str) -> gpu_model.GpuFacts:
    info_path = host_root / NVIDIA_GPUS_DIR / pci.address / "information"
    if not info_path.is_file():
        raise DiscoveryError(f"{info_path} missing: the NVIDIA driver has not initialised this GPU yet")
    info = parse_nvidia_information(read_text(info_path))
    model = GPU_MODELS_BY_PCI_ID.get(pci.device)
    if model is None:
        raise DiscoveryError(f"GPU {pci.address}: PCI device id {pci.device:#06x} is not in the catalog and NVML "
                             "is unavailable; install the NVIDIA driver's libnvidia-ml or add the model")
    try:
        minor, uuid = int(info["Device Minor"]), info["GPU UUID"]
    except (KeyError, ValueError):
        raise DiscoveryError(f"{info_path}: needs 'Device Minor' and 'GPU UUID' lines") from None
    return gpu_model.GpuFacts(
        minor=minor, uuid=uuid, product_name=info.get("Model", model.product_name),
        architecture=model.architecture, cuda_compute_capability=model.cuda_compute_capability,
        driver_version=driver_version, pci=pci.location, memory_mib=model.memory_mib,
        multiprocessors=model.multiprocessors,
    )


def _gpus_from_nvml(nvml: NvmlBackend, by_address: dict[str, PciFunction], problems: list[str],
                    blockers: list[str]) -> tuple[list[gpu_model.GpuFacts], dict[int, list[MigInstance]]]:
    driver_version = nvml.driver_version()
    gpus, migs = [], {}
    for g in nvml.gpus():
        pci = by_address.get(g.pci_address)
        if pci is None:
            problems.append(f"GPU {g.pci_address} ({g.uuid}) reported by NVML is not in /sys/bus/pci/devices")
            continue
        facts = _gpu_from_nvml(g, pci, driver_version)
        gpus.append(facts)
        if g.mig_enabled:
            if not g.migs:
                blockers.append(f"MIG mode is on for GPU {g.pci_address} but it has no MIG devices yet")
            migs[facts.minor] = nvml_migs(g)
    return gpus, migs


def _gpus_from_procfs(host_root: Path, pci_gpus: list[PciFunction], problems: list[str], blockers: list[str],
                      gpu_host: GpuHost) -> tuple[list[gpu_model.GpuFacts], dict[int, list[MigInstance]]]:
    driver_version = parse_nvidia_version(read_text(host_root / NVIDIA_VERSION_FILE))
    fixture_migs = _fixture_migs(host_root) if is_fixture(host_root) else {}
    gpus, migs = [], {}
    for pci in pci_gpus:
        try:
            facts = _gpu_from_procfs(host_root, pci, driver_version)
        except DiscoveryError as exc:
            problems.append(str(exc))
            continue
        gpus.append(facts)
        if pci.address in fixture_migs:
            migs[facts.minor] = fixture_migs[pci.address]
        elif any((host_root / NVIDIA_CAPS_DIR / f"gpu{facts.minor}" / "mig").glob("gi*")):
            blockers.append(f"GPU {pci.address} has MIG instances but NVML is unavailable to describe them "
                            f"({gpu_host.nvml_error or 'NVML not loaded'})")
    return gpus, migs


def _discover_gpu(host_root: Path, it: InstanceType | None, nvml: NvmlBackend | None,
                  problems: list[str], gpu_host: GpuHost) -> tuple[Inventory, NvmlBackend | None]:
    """The GPU inventory and the NVML it was read with (None when absent or failed: health skips it too)."""
    pci_gpus = [f for f in list_pci_functions(host_root, NVIDIA_VENDOR, problems)
                if f.class_code >> 8 in GPU_PCI_CLASSES]
    expected = max(it.accelerator_count if it is not None and it.gpu is not None else 0, len(pci_gpus))
    driver_loaded = nvml is not None or (host_root / NVIDIA_VERSION_FILE).is_file()
    if not pci_gpus and not driver_loaded:
        return Inventory([], False, "; ".join(["no GPU device found (no NVIDIA GPU on the PCI bus)", *problems]),
                         problems=problems), None
    if not driver_loaded:
        why = f"NVIDIA kernel driver not loaded (/{NVIDIA_VERSION_FILE} missing, NVML unavailable)"
        return Inventory([], False, "; ".join([f"{len(pci_gpus)} GPUs on the PCI bus", why, *problems]),
                         problems=problems), None
    by_address = {f.address: f for f in pci_gpus}
    gpus: list[gpu_model.GpuFacts] = []
    migs: dict[int, list[MigInstance]] = {}
    blockers: list[str] = []
    if nvml is not None:
        try:
            gpus, migs = _gpus_from_nvml(nvml, by_address, problems, blockers)
        except Exception as exc:  # any NVML failure: fall back to the driver's procfs
            problems.append(f"NVML failed ({exc.__class__.__name__}: {exc}); read /{NVIDIA_GPUS_DIR} instead")
            nvml, gpus, migs, blockers = None, [], {}, []
    if nvml is None:
        try:
            gpus, migs = _gpus_from_procfs(host_root, pci_gpus, problems, blockers, gpu_host)
        except DiscoveryError as exc:
            return Inventory([], False, "; ".join([str(exc), *problems]), problems=problems), None
    if not (host_root / "dev/nvidiactl").exists():
        blockers.append("/dev/nvidiactl missing")
    minors = _mig_minors(host_root)
    if migs:
        done, why = mig_marker.partitioned(host_root)
        if not done:
            blockers.append(why)
    common = [p for p in CONTROL_DEVICE_NODES if device_node_exists(host_root, p)]
    try:  # the driver root's libraries, binaries, firmware and hooks: without them a container gets no CUDA
        common_edits = gpu_host.common_edits(common)
    except DriverRootError as exc:
        blockers.append(str(exc))
        common_edits = {}

    def hooks(uuid: str) -> list[dict]:
        return gpu_host.device_hooks(uuid) if common_edits else []

    devices: list[DiscoveredDevice] = []
    for g in sorted(gpus, key=lambda f: f.minor):
        node = f"/dev/nvidia{g.minor}"
        if not device_node_exists(host_root, node):
            blockers.append(f"{node} missing")
        if g.minor not in migs:
            devices.append(DiscoveredDevice(gpu_model.gpu_device(g), device_nodes=[node], hooks=hooks(g.uuid)))
            continue
        for m, number in number_migs(migs[g.minor]):
            mig = gpu_model.MigFacts(g, m.profile, number, m.uuid, m.memory_mib, m.multiprocessors,
                                     gpu_model.memory_slices_of(m.memory_mib, g.memory_mib, number))
            nodes = [node]
            for cap in (f"gpu{g.minor}/gi{m.gpu_instance_id}/access",
                        f"gpu{g.minor}/gi{m.gpu_instance_id}/ci{m.compute_instance_id}/access"):
                if cap in minors:
                    nodes.append(f"/dev/nvidia-caps/nvidia-cap{minors[cap]}")
                else:
                    problems.append(f"{cap} not in /{NVIDIA_MIG_MINORS}")
            devices.append(DiscoveredDevice(gpu_model.mig_device(mig), device_nodes=nodes, hooks=hooks(g.uuid),
                                            parent=gpu_model.gpu_device_name(g.minor)))
    ready, reason = readiness("GPU", len(gpus), expected, problems, blockers)
    return Inventory(devices, ready, reason, common, problems, common_edits), nvml


def discover_gpus(host_root: Path, *, nvml: NvmlBackend | None = None, instance_type: str | None = None,
                  gpu_host: GpuHost | None = None) -> tuple[Inventory, NvmlBackend | None]:
    """The GPU inventory of a host tree and the NVML it was read with (None when absent or failed).

    nvml: an NVML backend (tests inject a fake); None loads the real one (libnvidia-ml.so.1 from the driver
    root) unless the host tree is a fixture. gpu_host: the NVIDIA driver root and CDI hook (default: driver
    root `/` under host_root). Never raises for bad host data: a malformed device is skipped, named in
    `problems`, and the inventory is not ready.
    """
    host_root = Path(host_root)
    gpu_host = gpu_host or GpuHost.for_node(host_root)
    if nvml is None and not is_fixture(host_root):
        nvml = gpu_host.nvml()
    return _discover_gpu(host_root, instance_type_of(host_root, instance_type), nvml, [], gpu_host)
