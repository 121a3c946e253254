"""Discovery: a node's host tree (sysfs, procfs, /dev) -> the devices a driver publishes.

`host_root` is `/` on a node (or the host's root mounted into the plugin's container) and a fixture
written by `eks-dra fixture` in tests. Discovery builds the facts records of `eks_dra.devices`
(GpuFacts, MigFacts, EfaFacts, NeuronFacts) and turns them into devices with the same builders the
planner uses, so what the planner simulates is what the drivers publish (DESIGN.md).

Sources per family:
- gpu: PCI functions of vendor 0x10de (class 0x0302 / 0x0300) under /sys/bus/pci/devices; NVML when
  libnvidia-ml loads (uuid, name, architecture, compute capability, memory, MIG devices). Without NVML,
  /proc/driver/nvidia/gpus/<BDF>/information and /proc/driver/nvidia/version plus the catalog's GpuModel
  matched by PCI device id. MIG without NVML is read from FIXTURE_MIG_FILE, which exists only in fixture
  host trees; on a real node without NVML a GPU with MIG instances makes the inventory not ready.
- efa: /sys/class/infiniband/<ibdev> whose `device` link is an Amazon (0x1d0f) PCI function with an EFA
  device id (0xefa0-0xefa3); /dev/infiniband/uverbsN through /sys/class/infiniband_verbs/uverbsN/ibdev.
- neuron: PCI functions 0x1d0f:0x7164/0x7264/0x7364 and /sys/class/neuron_device/neuronN, /dev/neuronN.
  A class device with a `device` link names its PCI function; the documented layout is a virtual class
  device (/sys/devices/virtual/neuron_device) without one, and then device N is taken to be the N-th Neuron
  PCI function in bus order (ASSUMPTION: holds where the driver numbers devices in probe order).
- device groups (Trainium): the catalog's Neuron-to-EFA wiring for the node's instance type (the lookup
  table of aws-neuron/connected-device-maps-over-efa-for-neuron that the upstream drivers use), hashed by
  `eks_dra.devices.neuron.device_group_ids`. ASSUMPTION: the instance's EFA BDFs are the catalog's.

The instance type is the node's DMI product name (/sys/devices/virtual/dmi/id/product_name, which EC2
Nitro instances set to the instance type) unless passed in. It gives the catalog's device counts: an
inventory with fewer devices than expected is not ready, so a plugin that starts before the device driver
waits instead of publishing a partial pool.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from eks_dra.catalog import GPU_MODELS, INSTANCE_TYPES, NEURON_MODELS, InstanceType, PciLocation
from eks_dra.devices import Device, Family
from eks_dra.devices import efa as efa_model
from eks_dra.devices import gpu as gpu_model
from eks_dra.devices import neuron as neuron_model

from .gpu import mig as mig_marker
from .gpu.cdi_edits import CONTROL_DEVICE_NODES
from .gpu.driver_root import DriverRootError
from .gpu.host import GpuHost
from .nvml import NvmlBackend, NvmlGpu

NVIDIA_VENDOR = 0x10DE
AMAZON_VENDOR = 0x1D0F
GPU_PCI_CLASSES = (0x0302, 0x0300)  # 3D controller (datacenter GPUs), VGA controller
EFA_DEVICE_IDS = frozenset(range(0xEFA0, 0xEFA4))
GPU_MODELS_BY_PCI_ID = {m.pci_device_id: m for m in GPU_MODELS.values()}
NEURON_MODELS_BY_PCI_ID = {m.pci_device_id: m for m in NEURON_MODELS.values()}

# Present only in host trees written by `eks-dra fixture`; never on a node (see fixture.py).
FIXTURE_DIR = Path("var/lib/eks-dra/fixture")
FIXTURE_MIG_FILE = FIXTURE_DIR / "mig.json"
FIXTURE_XID_DIR = FIXTURE_DIR / "xid"

DMI_PRODUCT_NAME = Path("sys/devices/virtual/dmi/id/product_name")
NVIDIA_VERSION_FILE = Path("proc/driver/nvidia/version")
NVIDIA_GPUS_DIR = Path("proc/driver/nvidia/gpus")
NVIDIA_CAPS_DIR = Path("proc/driver/nvidia/capabilities")
NVIDIA_MIG_MINORS = Path("proc/driver/nvidia-caps/mig-minors")
NEURON_VERSION_FILE = Path("sys/module/neuron/version")

_PCIE_ROOT_RE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
_BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


class DiscoveryError(Exception):
    """Malformed host data for one device: the message names the file and what is wrong."""


@dataclass
class DiscoveredDevice:
    device: Device
    healthy: bool = True
    health_reason: str = ""
    device_nodes: list[str] = field(default_factory=list)  # absolute paths as seen on the node
    # Keys ending in _VISIBLE_DEVICES hold one value per device: join them with "," for a claim.
    env: dict[str, str] = field(default_factory=dict)
    parent: str | None = None  # a MIG device's GPU (its health follows the parent's)
    hooks: list[dict] = field(default_factory=list)  # per-device CDI hooks (GPU: nvcdi's memory-limits hook)


@dataclass
class Inventory:
    devices: list[DiscoveredDevice]
    ready: bool
    reason: str  # why not ready; a summary when ready
    common_device_nodes: list[str] = field(default_factory=list)  # needed by every device of the family
    problems: list[str] = field(default_factory=list)  # devices skipped and why (also in `reason`)
    common_edits: dict = field(default_factory=dict)  # spec-level CDI edits of every claim (GPU: driver root)

    def by_name(self) -> dict[str, DiscoveredDevice]:
        return {d.device.name: d for d in self.devices}


# --- host-tree reading -------------------------------------------------------------------------

@dataclass(frozen=True)
class PciFunction:
    address: str  # "0000:53:00.0"
    vendor: int
    device: int
    class_code: int  # 24 bits: 0x030200
    numa_node: int
    root: str  # "pci0000:44"

    @property
    def location(self) -> PciLocation:
        return PciLocation(self.address, self.root, self.numa_node)


def is_fixture(host_root: Path) -> bool:
    return (host_root / FIXTURE_DIR).is_dir()


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise DiscoveryError(f"{path}: cannot read ({exc.__class__.__name__}: {exc})") from None


def read_optional(path: Path, default: str | None = None) -> str | None:
    """A host file's stripped text, or `default` when it is missing, unreadable or not text."""
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return default


def _read_hex(path: Path) -> int:
    text = _read(path)
    try:
        return int(text, 16)
    except ValueError:
        raise DiscoveryError(f"{path}: expected a hex number like 0x10de, found {text[:40]!r}") from None


def _read_int(path: Path) -> int:
    text = _read(path)
    try:
        return int(text)
    except ValueError:
        raise DiscoveryError(f"{path}: expected an integer, found {text[:40]!r}") from None


def pcie_root(host_root: Path, address: str) -> str:
    """resource.kubernetes.io/pcieRoot of a PCI function, derived as the deviceattribute library does.

    /sys/bus/pci/devices/<BDF> is a symlink into /sys/devices/pciDDDD:BB/...; the first element under
    /sys/devices is the root complex. Relative links (the kernel's) resolve inside host_root; an absolute
    link is read textually so that a host tree mounted elsewhere still works.
    """
    link = host_root / "sys/bus/pci/devices" / address
    devices_dir = os.path.realpath(host_root / "sys/devices")
    real = os.path.realpath(link)
    first = ""
    if real.startswith(devices_dir + os.sep):
        first = Path(os.path.relpath(real, devices_dir)).parts[0]
    elif link.is_symlink():
        parts = Path(os.readlink(link)).parts
        if "devices" in parts and parts.index("devices") + 1 < len(parts):
            first = parts[parts.index("devices") + 1]
    if not _PCIE_ROOT_RE.match(first):
        raise DiscoveryError(f"{link}: resolves to {real}, not below /sys/devices/pciDDDD:BB; "
                             "cannot derive resource.kubernetes.io/pcieRoot")
    return first


def read_pci_function(host_root: Path, address: str) -> PciFunction:
    base = host_root / "sys/bus/pci/devices" / address
    numa = _read_int(base / "numa_node") if (base / "numa_node").exists() else -1
    return PciFunction(
        address=address,
        vendor=_read_hex(base / "vendor"),
        device=_read_hex(base / "device"),
        class_code=_read_hex(base / "class"),
        # -1 means "no NUMA affinity reported" (single-node VMs): the catalog calls that node 0.
        numa_node=max(numa, 0),
        root=pcie_root(host_root, address),
    )


def list_pci_functions(host_root: Path, vendor: int, problems: list[str]) -> list[PciFunction]:
    """PCI functions of one vendor, sorted by address. Unreadable ones are skipped into `problems`."""
    bus = host_root / "sys/bus/pci/devices"
    if not bus.is_dir():
        return []
    out = []
    for entry in sorted(bus.iterdir()):
        if not _BDF_RE.match(entry.name):
            continue
        try:
            if _read_hex(entry / "vendor") != vendor:
                continue
            out.append(read_pci_function(host_root, entry.name))
        except DiscoveryError as exc:
            problems.append(f"PCI {entry.name} skipped: {exc}")
    return out


def _linked_pci_address(path: Path) -> str | None:
    """The PCI address a class device's `device` link points at, or None."""
    link = path / "device"
    if not link.exists():
        return None
    name = Path(os.path.realpath(link)).name
    return name if _BDF_RE.match(name) else None


def instance_type_of(host_root: Path, instance_type: str | None = None) -> InstanceType | None:
    """The catalog entry of the node (DMI product name unless given); None for types the catalog lacks."""
    name = instance_type if instance_type is not None else read_optional(host_root / DMI_PRODUCT_NAME)
    return INSTANCE_TYPES.get(name or "")


def _readiness(family: str, found: int, expected: int, problems: list[str], extra: list[str]) -> tuple[bool, str]:
    blockers = list(extra)
    if found == 0:
        blockers.insert(0, f"no {family} device found")
    elif found < expected:
        blockers.insert(0, f"found {found} of {expected} expected {family} devices")
    if blockers:
        return False, "; ".join(blockers + problems)
    summary = f"{found} {family} devices"
    return True, summary + (f" ({'; '.join(problems)})" if problems else "")


def _dev(host_root: Path, node: str) -> bool:
    return (host_root / node.lstrip("/")).exists()


# --- GPU -----------------------------------------------------------------------------------------

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
        data = json.loads(_read(path))
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
    info = parse_nvidia_information(_read(info_path))
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
    driver_version = parse_nvidia_version(_read(host_root / NVIDIA_VERSION_FILE))
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
    common = [p for p in CONTROL_DEVICE_NODES if _dev(host_root, p)]
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
        if not _dev(host_root, node):
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
    ready, reason = _readiness("GPU", len(gpus), expected, problems, blockers)
    return Inventory(devices, ready, reason, common, problems, common_edits), nvml


# --- EFA -----------------------------------------------------------------------------------------

RDMA_CM_DEVICE = "/dev/infiniband/rdma_cm"


def _uverbs_by_ibdev(host_root: Path) -> dict[str, str]:
    """/sys/class/infiniband_verbs/uverbsN/ibdev -> {ibdev: "/dev/infiniband/uverbsN"}."""
    out = {}
    for d in sorted((host_root / "sys/class/infiniband_verbs").glob("uverbs*")):
        try:
            out[_read(d / "ibdev")] = f"/dev/infiniband/{d.name}"
        except DiscoveryError:
            continue
    return out


def _efa_device_groups(it: InstanceType | None) -> dict[str, dict[int, str]]:
    """EFA BDF -> device-group ids from the catalog's Neuron-to-EFA wiring (Trainium nodes only)."""
    if it is None or not it.neuron_efa_map:
        return {}
    bdfs = [e.pci.address for e in it.efa_interfaces]
    out: dict[str, dict[int, str]] = {}
    for index, efa_index in enumerate(it.neuron_efa_map):
        out.setdefault(bdfs[efa_index], neuron_model.device_group_ids(index, it.neuron_efa_map, bdfs))
    return out


def _discover_efa(host_root: Path, it: InstanceType | None, problems: list[str]) -> Inventory:
    pci_efas = {f.address: f for f in list_pci_functions(host_root, AMAZON_VENDOR, problems)
                if f.device in EFA_DEVICE_IDS}
    expected = max(it.max_efa_interfaces if it is not None else 0, len(pci_efas))
    ib_dir = host_root / "sys/class/infiniband"
    if pci_efas and not ib_dir.is_dir():
        return Inventory([], False, f"{len(pci_efas)} EFA PCI functions but the efa kernel driver has not "
                         f"registered any RDMA device (/sys/class/infiniband missing)", problems=problems)
    uverbs = _uverbs_by_ibdev(host_root)
    groups = _efa_device_groups(it)
    blockers: list[str] = []
    bound: set[str] = set()
    devices: list[DiscoveredDevice] = []
    for ibdev in sorted(ib_dir.iterdir()) if ib_dir.is_dir() else []:
        address = _linked_pci_address(ibdev)
        if address is None or address not in pci_efas:
            continue  # not an EFA (e.g. a Mellanox HCA) or a dangling link
        bound.add(address)
        pci = pci_efas[address]
        facts = efa_model.EfaFacts(ibdev.name, pci.location, pci.device, groups.get(address, {}))
        node = uverbs.get(ibdev.name)
        if node is None or not _dev(host_root, node):
            blockers.append(f"no uverbs device node for {ibdev.name}")
            continue
        # As DRANET does: the RDMA connection manager with every interface's verbs device.
        nodes = [RDMA_CM_DEVICE, node] if _dev(host_root, RDMA_CM_DEVICE) else [node]
        devices.append(DiscoveredDevice(efa_model.efa_device(facts), device_nodes=nodes))
    for address in sorted(set(pci_efas) - bound):
        problems.append(f"EFA {address} has no RDMA device yet (efa driver not bound)")
    ready, reason = _readiness("EFA", len(devices), expected, problems, blockers)
    return Inventory(sorted(devices, key=lambda d: d.device.name), ready, reason, [], problems)


# --- Neuron --------------------------------------------------------------------------------------

def _discover_neuron(host_root: Path, it: InstanceType | None, problems: list[str]) -> Inventory:
    pci_neurons = [f for f in list_pci_functions(host_root, AMAZON_VENDOR, problems)
                   if f.device in NEURON_MODELS_BY_PCI_ID]
    expected = max(it.accelerator_count if it is not None and it.neuron is not None else 0, len(pci_neurons))
    class_dir = host_root / "sys/class/neuron_device"
    if pci_neurons and not class_dir.is_dir():
        return Inventory([], False, f"{len(pci_neurons)} Neuron PCI functions but the neuron kernel driver is "
                         "not loaded (/sys/class/neuron_device missing)", problems=problems)
    by_address = {f.address: f for f in pci_neurons}
    driver_version = read_optional(host_root / NEURON_VERSION_FILE) or "unknown"
    instance_name = it.name if it is not None else read_optional(host_root / DMI_PRODUCT_NAME, "unknown")
    efa_bdfs = [e.pci.address for e in it.efa_interfaces] if it is not None else []
    efa_map = it.neuron_efa_map if it is not None else ()
    facts: list[neuron_model.NeuronFacts] = []
    blockers: list[str] = []
    entries = sorted((d for d in class_dir.glob("neuron*") if d.name[6:].isdigit()),
                     key=lambda d: int(d.name[6:])) if class_dir.is_dir() else []
    for d in entries:
        index = int(d.name[6:])
        address = _linked_pci_address(d)
        if address is None and index < len(pci_neurons):
            address = pci_neurons[index].address  # virtual class device: bus order (see module docstring)
        pci = by_address.get(address or "")
        if pci is None:
            problems.append(f"{d}: no Neuron PCI function for this device")
            continue
        model = NEURON_MODELS_BY_PCI_ID[pci.device]
        try:
            cores = _read_int(d / "core_count") if (d / "core_count").exists() else model.cores_per_device
        except DiscoveryError as exc:
            problems.append(str(exc))
            continue
        if not _dev(host_root, f"/dev/neuron{index}"):
            blockers.append(f"/dev/neuron{index} missing")
        groups = neuron_model.device_group_ids(index, efa_map, efa_bdfs) if index < len(efa_map) else {}
        facts.append(neuron_model.NeuronFacts(index, instance_name, cores, model.memory_mib, pci.location,
                                              driver_version, groups))
    devices = [DiscoveredDevice(neuron_model.neuron_device(f, len(facts)), device_nodes=[f"/dev/neuron{f.index}"],
                                env={"AWS_NEURON_VISIBLE_DEVICES": str(f.index)}) for f in facts]
    ready, reason = _readiness("Neuron", len(devices), expected, problems, blockers)
    return Inventory(devices, ready, reason, [], problems)


# --- entry point ---------------------------------------------------------------------------------

def discover(family: Family, host_root: Path, node_name: str, *, nvml: NvmlBackend | None = None,
             instance_type: str | None = None, gpu_host: GpuHost | None = None) -> Inventory:
    """Read one device family from a host tree.

    nvml: an NVML backend (tests inject a fake); None loads the real one (libnvidia-ml.so.1 from the driver
    root) for the gpu family unless the host tree is a fixture. gpu_host: the NVIDIA driver root and CDI
    hook (default: driver root `/` under host_root). instance_type: overrides the DMI product name. Never raises for bad host
    data: a malformed device is skipped, named in `problems`, and the inventory is not ready.
    node_name is accepted for symmetry with the planner; discovered UUIDs come from the host.
    """
    del node_name  # devices carry what the host reports; the pool name is the publisher's business
    host_root = Path(host_root)
    it = instance_type_of(host_root, instance_type)
    problems: list[str] = []
    if family == "gpu":
        gpu_host = gpu_host or GpuHost.for_node(host_root)
        if nvml is None and not is_fixture(host_root):
            nvml = gpu_host.nvml()
        inventory, nvml = _discover_gpu(host_root, it, nvml, problems, gpu_host)
    elif family == "efa":
        inventory = _discover_efa(host_root, it, problems)
    elif family == "neuron":
        inventory = _discover_neuron(host_root, it, problems)
    else:
        raise ValueError(f"unknown device family {family!r}; expected gpu, efa or neuron")
    from .health_sources import apply_health

    apply_health(family, host_root, inventory, nvml)
    return inventory
