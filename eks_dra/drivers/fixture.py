"""Fixture host trees: the sysfs, procfs and /dev of an instance type, written from the catalog.

`eks-dra fixture --instance-type T --out DIR` writes what discovery reads on a node of type T, from
`eks_dra.devices.node_facts`, so that discover(fixture) == simulate_node (DESIGN.md, "One device model").

Layout (paths under DIR; BDF = PCI address such as 0000:45:00.0):
  sys/devices/pci0000:RR/[0000:RR:SS.0/]BDF/     one real directory per PCI function (vendor, device,
                                                 class, numa_node, driver link), under a bridge when its
                                                 bus is not the root bus; bridges are listed on the bus too
  sys/bus/pci/devices/BDF -> ../../../devices/...  relative links, as the kernel makes them
  sys/devices/pci0000:00/0000:00:0X.0/           ENA, EBS NVMe and (8-GPU A100/H100/H200 boards) NVSwitch
                                                 functions: same vendors as the devices, to be skipped
  sys/devices/virtual/dmi/id/product_name         the instance type (as on EC2 Nitro)
  proc/sys/kernel/random/boot_id                  the host's boot id (`set_boot_id` simulates a reboot)
  gpu:    proc/driver/nvidia/version, proc/driver/nvidia/gpus/BDF/information (the driver's formats),
          sys/module/nvidia/version, dev/nvidia{ctl,-uvm,-uvm-tools,N}; with a MIG profile also
          proc/driver/nvidia/capabilities/gpuN/mig/giG/{access,ciC/access}, proc/driver/nvidia-caps/mig-minors,
          dev/nvidia-caps/nvidia-capM and var/lib/eks-dra/fixture/mig.json (what NVML would report about the
          MIG devices; FIXTURE ONLY: real nodes are read through NVML)
  efa:    BDF/infiniband/IBDEV/{device,ports/1/state,ports/1/phys_state}, BDF/infiniband_verbs/uverbsK/ibdev,
          sys/class/infiniband/IBDEV and sys/class/infiniband_verbs/uverbsK links, dev/infiniband/uverbsK,
          sys/module/efa/version
  neuron: BDF/neuron_device/neuronN/{device,core_count,connected_devices,info/architecture/*,
          stats/hardware/{mem,sram}_ecc_uncorrected/total}, sys/class/neuron_device/neuronN link,
          dev/neuronN, sys/module/neuron/version
  gpu driver root (user space, also --without-driver): the NVIDIA driver's libraries, binaries, firmware,
          ld cache and nvidia-container-toolkit's hook as the AMI installs them (`--os al2023|bottlerocket`;
          files and sources in gpu/fixture_root.py); with a MIG profile also var/lib/eks-dra/mig-partitioned
          (the boot-time partitioning marker, gpu/mig.py; `set_boot_id` rewrites it as the unit would)
  var/lib/eks-dra/fixture/                        marks a fixture tree (host.json: type, node, MIG profile,
                                                  OS layout); discovery never loads the real NVML for such a tree
/dev entries are empty regular files: creating character devices needs root, and discovery and CDI only
need the paths. Fault and timing helpers (`set_efa_port_state`, `set_neuron_error`, `set_gpu_xid`,
`remove_devices`, `unload_driver`, `add_devices`, `set_boot_id`) change a written tree in place.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import uuid
from pathlib import Path

from eks_dra.catalog import PciLocation, UnknownInstanceType
from eks_dra.devices import FAMILIES, Family, NodeFacts, node_facts
from eks_dra.devices.gpu import GpuFacts
from eks_dra.devices.neuron import topology_xy
from eks_dra.errors import UserError

from .framework.hosttree import FIXTURE_DIR
from .gpu import mig as mig_marker
from .gpu.discovery import FIXTURE_MIG_FILE, FIXTURE_XID_DIR
from .gpu.fixture_root import LAYOUTS, write_driver_root

DEFAULT_NODE_NAME = "fixture-node"
_BRIDGE = (0x1D0F, 0x0200, 0x060400)  # vendor, device, class of the PCIe bridges placed above devices
_UVERBS_MAJOR, _UVERBS_BASE_MINOR = 231, 192
# Functions every node has besides its accelerators, which discovery must skip: the ENA and the EBS NVMe
# controller (Amazon vendor, like EFA and Neuron) on the host bridge, and the NVSwitches of HGX boards
# (NVIDIA vendor, class 0x0680 "bridge", not a GPU). Addresses are the fixture's own.
_PLATFORM = (("0000:00:04.0", 0x1D0F, 0x8061, 0x010802, "nvme"), ("0000:00:05.0", 0x1D0F, 0xEC20, 0x020000, "ena"))
_NVSWITCHES = {"A100": (0x1AF1, 6), "H100": (0x22A3, 4), "H200": (0x22A3, 4)}  # per 8-GPU HGX board


# --- small file helpers ------------------------------------------------------------------------

def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _link(link: Path, target: Path) -> None:
    """A relative symlink, as sysfs has them, so the tree works wherever it is mounted."""
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(os.path.relpath(target, link.parent), link)


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _dev_node(root: Path, node: str) -> None:
    _write(root / node.lstrip("/"), "")


# --- PCI ---------------------------------------------------------------------------------------

def pci_dir(root: Path, loc: PciLocation) -> Path:
    """The real sysfs directory of a PCI function: under a bridge unless it sits on the root bus."""
    domain, bus, _ = loc.address.split(":")
    root_bus = int(loc.root.split(":")[1], 16)
    base = root / "sys/devices" / loc.root
    if int(bus, 16) != root_bus:
        bridge = f"{domain}:{root_bus:02x}:{(int(bus, 16) - root_bus) % 32:02x}.0"
        base = base / bridge
        if not (base / "vendor").exists():
            _pci_files(root, base, bridge, *_BRIDGE, loc.numa_node, driver="pcieport")
    return base / loc.address


def _pci_files(root: Path, d: Path, address: str, vendor: int, device: int, class_code: int, numa: int,
               driver: str | None) -> None:
    _write(d / "vendor", f"{vendor:#06x}\n")
    _write(d / "device", f"{device:#06x}\n")
    _write(d / "class", f"{class_code:#08x}\n")
    _write(d / "numa_node", f"{numa}\n")
    _link(root / "sys/bus/pci/devices" / address, d)
    if driver:
        (root / "sys/bus/pci/drivers" / driver).mkdir(parents=True, exist_ok=True)
        _link(d / "driver", root / "sys/bus/pci/drivers" / driver)


def _pci_function(root: Path, loc: PciLocation, vendor: int, device: int, class_code: int,
                  driver: str | None) -> Path:
    d = pci_dir(root, loc)
    _pci_files(root, d, loc.address, vendor, device, class_code, loc.numa_node, driver)
    return d


# --- GPU ---------------------------------------------------------------------------------------

def _nvidia_information(g: GpuFacts) -> str:
    return (f"Model: \t\t {g.product_name}\nIRQ:   \t\t 0\nGPU UUID: \t {g.uuid}\nVideo BIOS: \t 96.00.00.00.00\n"
            f"Bus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n"
            f"Bus Location: \t {g.pci.address}\nDevice Minor: \t {g.minor}\nGPU Excluded:\t No\n")


def _write_gpu(root: Path, facts: NodeFacts, driver: bool) -> None:
    it = facts.instance_type
    assert it.gpu is not None
    for g in facts.gpus:
        _pci_function(root, g.pci, 0x10DE, it.gpu.pci_device_id, 0x030200, "nvidia" if driver else None)
    if not driver:
        return
    version = facts.gpus[0].driver_version
    machine = "aarch64" if it.architecture == "arm64" else "x86_64"
    _write(root / "proc/driver/nvidia/version",
           f"NVRM version: NVIDIA UNIX Open Kernel Module for {machine}  {version}  Release Build  "
           f"(dvs-builder@fixture)  Tue Sep 23 09:55:41 UTC 2025\nGCC version:  gcc version 11.5.0 (GCC)\n")
    _write(root / "sys/module/nvidia/version", f"{version}\n")
    for node in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
        _dev_node(root, node)
    for g in facts.gpus:
        _add_gpu(root, g)
    if facts.migs:
        _write_migs(root, facts)


def _add_gpu(root: Path, g: GpuFacts) -> None:
    _write(root / "proc/driver/nvidia/gpus" / g.pci.address / "information", _nvidia_information(g))
    _dev_node(root, f"/dev/nvidia{g.minor}")


def _write_migs(root: Path, facts: NodeFacts) -> None:
    """What NVML would report, as FIXTURE_MIG_FILE, plus the driver's MIG capability files and minors."""
    profiles = {p.name: p for p in facts.instance_type.gpu.mig_profiles}  # type: ignore[union-attr]
    minors = ["config 1", "monitor 2"]
    next_minor = 3
    gpus: dict[str, list[dict]] = {}
    for m in facts.migs:
        gi, ci = m.placement + 1, 0  # GPU-instance ids start at 1 in this fixture; one compute instance each
        gpus.setdefault(m.parent.pci.address, []).append({
            "profile": m.profile, "placementStart": m.placement * profiles[m.profile].slices, "uuid": m.uuid,
            "gpuInstanceId": gi, "computeInstanceId": ci, "memoryMiB": m.memory_mib,
            "multiprocessors": m.multiprocessors,
        })
        caps = root / "proc/driver/nvidia/capabilities" / f"gpu{m.parent.minor}/mig/gi{gi}"
        for cap, path in ((f"gpu{m.parent.minor}/gi{gi}/access", caps / "access"),
                          (f"gpu{m.parent.minor}/gi{gi}/ci{ci}/access", caps / f"ci{ci}/access")):
            _write(path, f"DeviceFileMinor: {next_minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
            minors.append(f"{cap} {next_minor}")
            _dev_node(root, f"/dev/nvidia-caps/nvidia-cap{next_minor}")
            next_minor += 1
    _write(root / "proc/driver/nvidia-caps/mig-minors", "\n".join(minors) + "\n")
    _write(root / FIXTURE_MIG_FILE, json.dumps({"gpus": gpus}, indent=1, sort_keys=True) + "\n")


# --- EFA ---------------------------------------------------------------------------------------

def _write_efa(root: Path, facts: NodeFacts, driver: bool) -> None:
    for e in facts.efas:
        _pci_function(root, e.pci, 0x1D0F, e.pci_device_id, 0x020000, "efa" if driver else None)
    if not driver:
        return
    _write(root / "sys/module/efa/version", "2.15.3g\n")
    (root / "sys/class/infiniband").mkdir(parents=True, exist_ok=True)
    _dev_node(root, "/dev/infiniband/rdma_cm")
    for k, _ in enumerate(facts.efas):
        _add_efa(root, facts, k)


def _add_efa(root: Path, facts: NodeFacts, k: int) -> None:
    e = facts.efas[k]
    pdir = pci_dir(root, e.pci)
    ib = pdir / "infiniband" / e.rdma_device
    _link(ib / "device", pdir)
    _write(ib / "ports/1/state", "4: ACTIVE\n")
    _write(ib / "ports/1/phys_state", "5: LinkUp\n")
    _link(root / "sys/class/infiniband" / e.rdma_device, ib)
    uv = pdir / "infiniband_verbs" / f"uverbs{k}"
    _write(uv / "ibdev", f"{e.rdma_device}\n")
    _write(uv / "dev", f"{_UVERBS_MAJOR}:{_UVERBS_BASE_MINOR + k}\n")
    _link(uv / "device", pdir)
    _link(root / "sys/class/infiniband_verbs" / f"uverbs{k}", uv)
    _dev_node(root, f"/dev/infiniband/uverbs{k}")


def _remove_efa(root: Path, facts: NodeFacts, k: int) -> None:
    e = facts.efas[k]
    pdir = pci_dir(root, e.pci)
    for path in (root / "sys/class/infiniband" / e.rdma_device, pdir / "infiniband",
                 root / "sys/class/infiniband_verbs" / f"uverbs{k}", pdir / "infiniband_verbs",
                 root / f"dev/infiniband/uverbs{k}"):
        _remove(path)


# --- Neuron ------------------------------------------------------------------------------------

def _connected(index: int, count: int) -> list[int]:
    """Torus neighbours (4x4 for 16 devices, a ring otherwise), as the driver's connected_devices lists."""
    if count < 2:
        return []
    if count == 16:
        x, y = topology_xy(index, count)
        return sorted({((x + dx) % 4) + 4 * ((y + dy) % 4) for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1))})
    return sorted({(index + 1) % count, (index - 1) % count} - {index})


def _write_neuron(root: Path, facts: NodeFacts, driver: bool) -> None:
    it = facts.instance_type
    assert it.neuron is not None
    for n in facts.neurons:
        _pci_function(root, n.pci, 0x1D0F, it.neuron.pci_device_id, 0x088000, "neuron" if driver else None)
    if not driver:
        return
    _write(root / "sys/module/neuron/version", f"{facts.neurons[0].driver_version}\n")
    (root / "sys/class/neuron_device").mkdir(parents=True, exist_ok=True)
    for k, _ in enumerate(facts.neurons):
        _add_neuron(root, facts, k)


def _add_neuron(root: Path, facts: NodeFacts, k: int) -> None:
    n = facts.neurons[k]
    it = facts.instance_type
    pdir = pci_dir(root, n.pci)
    d = pdir / "neuron_device" / f"neuron{n.index}"
    _link(d / "device", pdir)
    _write(d / "core_count", f"{n.core_count}\n")
    _write(d / "connected_devices", ", ".join(map(str, _connected(n.index, len(facts.neurons)))) + "\n")
    _write(d / "info/architecture/arch_type", f"NCv{it.neuron.core_version}\n")  # type: ignore[union-attr]
    _write(d / "info/architecture/device_name", f"{it.neuron.ec2_name}\n")  # type: ignore[union-attr]
    _write(d / "info/architecture/instance_type", f"{it.name}\n")
    for counter in ("mem_ecc_uncorrected", "sram_ecc_uncorrected"):
        _write(d / "stats/hardware" / counter / "total", "0\n")
    _link(root / "sys/class/neuron_device" / f"neuron{n.index}", d)
    _dev_node(root, f"/dev/neuron{n.index}")


def _remove_neuron(root: Path, facts: NodeFacts, k: int) -> None:
    n = facts.neurons[k]
    for path in (root / "sys/class/neuron_device" / f"neuron{n.index}", pci_dir(root, n.pci) / "neuron_device",
                 root / f"dev/neuron{n.index}"):
        _remove(path)


# --- the tree ----------------------------------------------------------------------------------

def _facts(root: Path) -> NodeFacts:
    try:
        host = json.loads((root / FIXTURE_DIR / "host.json").read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{root}: not a fixture host tree written by `eks-dra fixture` ({exc})") from None
    return node_facts(host["instanceType"], host["nodeName"], mig_profile=host.get("migProfile"))


def _families(facts: NodeFacts) -> list[Family]:
    present = {"gpu": bool(facts.gpus), "efa": bool(facts.efas), "neuron": bool(facts.neurons)}
    return [f for f in FAMILIES if present[f]]


_WRITERS = {"gpu": _write_gpu, "efa": _write_efa, "neuron": _write_neuron}


def write_fixture(instance_type: str, out: Path | str, node_name: str = DEFAULT_NODE_NAME,
                  mig_profile: str | None = None, *, without_driver: bool = False, os_layout: str = "al2023") -> Path:
    """Write the host tree of a node of `instance_type` under `out` and return its path.

    without_driver: only the PCI functions (and DMI, boot id, the GPU driver's user-space files), as a node
    looks before its device drivers load; `add_devices` completes the tree later. os_layout: where the GPU
    driver's user-space files go (al2023 or bottlerocket). Raises UserError for an unknown type, MIG
    profile or layout.
    """
    if os_layout not in LAYOUTS:
        raise UserError(f"--os: unknown layout {os_layout!r}; expected one of {', '.join(LAYOUTS)}")
    try:
        facts = node_facts(instance_type, node_name, mig_profile=mig_profile)
    except UnknownInstanceType as exc:
        raise UserError(str(exc)) from None
    except KeyError as exc:  # the MIG profile: the message names the known ones
        raise UserError(f"--mig-profile: {exc.args[0]}") from None
    root = Path(out)
    marker = root / FIXTURE_DIR
    if root.is_dir() and any(root.iterdir()) and not marker.is_dir():
        raise UserError(f"{root} exists and is not a fixture host tree; choose an empty or new directory")
    _write(marker / "host.json", json.dumps({"instanceType": facts.instance_type.name, "nodeName": node_name,
                                             "migProfile": mig_profile, "os": os_layout}, indent=1) + "\n")
    _write(marker / "README", "Fake host tree written by `eks-dra fixture` (eks_dra/drivers/fixture.py).\n"
           "Files in this directory (mig.json, xid/) exist only in fixtures.\n")
    _write(root / "sys/devices/virtual/dmi/id/product_name", f"{facts.instance_type.name}\n")
    if not (root / "proc/sys/kernel/random/boot_id").exists():
        set_boot_id(root, str(uuid.uuid5(uuid.NAMESPACE_URL, f"eks-dra-fixture/{node_name}")))
    _write_platform(root, facts)
    for family in _families(facts):
        _WRITERS[family](root, facts, not without_driver)
    if facts.gpus:
        write_driver_root(root, facts.gpus[0].driver_version, os_layout, facts.instance_type.architecture == "arm64")
    if facts.migs:
        mig_marker.write_marker(root)
    return root


def _write_platform(root: Path, facts: NodeFacts) -> None:
    functions = list(_PLATFORM)
    gpu = facts.instance_type.gpu
    if gpu is not None and gpu.ec2_name in _NVSWITCHES and facts.instance_type.accelerator_count == 8:
        device, count = _NVSWITCHES[gpu.ec2_name]
        functions += [(f"0000:00:{0x10 + i:02x}.0", 0x10DE, device, 0x068000, "nvidia-nvswitch")
                      for i in range(count)]
    for address, vendor, device, class_code, driver in functions:
        _pci_function(root, PciLocation(address, "pci0000:00", 0), vendor, device, class_code, driver)


def add_devices(root: Path | str, family: Family | None = None) -> None:
    """Load the driver(s) of a tree written `without_driver` (or restore removed devices): the full tree."""
    root = Path(root)
    facts = _facts(root)
    for f in _families(facts):
        if family in (None, f):
            _WRITERS[f](root, facts, True)


def remove_devices(root: Path | str, family: Family, count: int | None = None) -> None:
    """Make the last `count` devices of a family (all when None) not yet initialised by their driver: the
    PCI functions stay, the driver's view of them (procfs entry, class device, /dev node) goes."""
    root = Path(root)
    facts = _facts(root)
    total = {"gpu": len(facts.gpus), "efa": len(facts.efas), "neuron": len(facts.neurons)}[family]
    for k in range(total - (total if count is None else min(count, total)), total):
        if family == "gpu":
            g = facts.gpus[k]
            _remove(root / "proc/driver/nvidia/gpus" / g.pci.address)
            _remove(root / f"dev/nvidia{g.minor}")
        elif family == "efa":
            _remove_efa(root, facts, k)
        else:
            _remove_neuron(root, facts, k)


def unload_driver(root: Path | str, family: Family) -> None:
    """Remove everything a family's kernel driver adds, leaving the bare PCI functions."""
    root = Path(root)
    remove_devices(root, family)
    paths = {
        "gpu": ["proc/driver/nvidia", "proc/driver/nvidia-caps", "sys/module/nvidia", "dev/nvidiactl",
                "dev/nvidia-uvm", "dev/nvidia-uvm-tools", "dev/nvidia-caps", str(FIXTURE_MIG_FILE)],
        "efa": ["sys/class/infiniband", "sys/class/infiniband_verbs", "sys/module/efa", "dev/infiniband"],
        "neuron": ["sys/class/neuron_device", "sys/module/neuron"],
    }[family]
    for p in paths:
        _remove(root / p)
    for link in (root / "sys/bus/pci/devices").iterdir():
        drv = link / "driver"
        if drv.is_symlink() and Path(os.readlink(drv)).name == {"gpu": "nvidia"}.get(family, family):
            drv.unlink()


# --- fault injection ---------------------------------------------------------------------------

def set_efa_port_state(root: Path | str, ibdev: str, active: bool) -> None:
    state = "4: ACTIVE" if active else "1: DOWN"
    phys = "5: LinkUp" if active else "3: Disabled"
    port = Path(root) / "sys/class/infiniband" / ibdev / "ports/1"
    if not port.is_dir():
        raise UserError(f"{port}: no such EFA port in the fixture")
    _write(port / "state", state + "\n")
    _write(port / "phys_state", phys + "\n")


def set_neuron_error(root: Path | str, index: int, count: int) -> None:
    """Set neuron<index>'s uncorrected memory ECC counter (0 clears it, as a device reset does)."""
    d = Path(root) / "sys/class/neuron_device" / f"neuron{index}"
    if not d.is_dir():
        raise UserError(f"{d}: no such Neuron device in the fixture")
    _write(d / "stats/hardware/mem_ecc_uncorrected/total", f"{count}\n")


def set_gpu_xid(root: Path | str, minor: int, xid: int | None) -> None:
    """Raise (or with None clear) an XID on GPU <minor>. Fixture trees only: a real node's XIDs come from
    NVML events; HealthMonitor reads this file when the tree is a fixture and has no NVML."""
    path = Path(root) / FIXTURE_XID_DIR / f"gpu{minor}"
    if xid is None:
        _remove(path)
    else:
        _write(path, f"{xid}\n")


def set_boot_id(root: Path | str, boot_id: str | None = None) -> str:
    """Write the host's boot id (a new random one by default: a simulated reboot) and return it."""
    boot_id = boot_id or str(uuid.uuid4())
    _write(Path(root) / "proc/sys/kernel/random/boot_id", boot_id + "\n")
    if (Path(root) / mig_marker.MARKER).exists():  # the boot-time MIG unit runs again in the new boot
        mig_marker.write_marker(Path(root))
    return boot_id


# --- the `eks-dra fixture` command -------------------------------------------------------------

def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--instance-type", required=True, help="catalogued accelerator instance type")
    parser.add_argument("--out", required=True, type=Path, help="directory to write the host tree into")
    parser.add_argument("--node-name", default=DEFAULT_NODE_NAME,
                        help=f"node name (seeds the simulated GPU UUIDs; default {DEFAULT_NODE_NAME})")
    parser.add_argument("--mig-profile", help="split every GPU into this MIG profile (static MIG)")
    parser.add_argument("--without-driver", action="store_true",
                        help="write only the PCI functions, as a node looks before its device drivers load")
    parser.add_argument("--os", dest="os_layout", choices=LAYOUTS, default="al2023",
                        help="GPU driver root layout: the AL2023 NVIDIA AMI's (default) or Bottlerocket's")


def run(args: argparse.Namespace) -> int:
    root = write_fixture(args.instance_type, args.out, args.node_name, args.mig_profile,
                         without_driver=args.without_driver, os_layout=args.os_layout)
    facts = _facts(root)
    counts = ", ".join(f"{len(v)} {k}" for k, v in
                       (("GPU", facts.gpus), ("MIG", facts.migs), ("EFA", facts.efas), ("Neuron", facts.neurons))
                       if v)
    state = " (device drivers not loaded)" if args.without_driver else ""
    print(f"wrote {facts.instance_type.name} host tree for node {args.node_name} to {root}: {counts}{state}")
    return 0
