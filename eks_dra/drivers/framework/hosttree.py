"""Reading a node's host tree (sysfs, procfs, /dev), for every device family's discovery.

`host_root` is `/` on a node (or the host's root mounted into the plugin's container) and a fixture written
by `eks-dra fixture` in tests. A malformed file raises DiscoveryError naming the file and what is wrong; the
families skip that device into their inventory's `problems`.

The instance type is the node's DMI product name (/sys/devices/virtual/dmi/id/product_name, which EC2
Nitro instances set to the instance type) unless passed in. It gives the catalog's device counts: an
inventory with fewer devices than expected is not ready, so a plugin that starts before the device driver
waits instead of publishing a partial pool.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from eks_dra.catalog import INSTANCE_TYPES, InstanceType, PciLocation

# Present only in host trees written by `eks-dra fixture`; never on a node (see fixture.py).
FIXTURE_DIR = Path("var/lib/eks-dra/fixture")
DMI_PRODUCT_NAME = Path("sys/devices/virtual/dmi/id/product_name")
BOOT_ID = Path("proc/sys/kernel/random/boot_id")

_PCIE_ROOT_RE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
_BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


class DiscoveryError(Exception):
    """Malformed host data for one device: the message names the file and what is wrong."""


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


def read_text(path: Path) -> str:
    """A host file's stripped text; DiscoveryError naming the file when it cannot be read."""
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


def read_boot_id(host_root: Path) -> str:
    """The host's boot id (kernel-wide, so the container's own /proc has it too)."""
    for path in (host_root / BOOT_ID, Path("/") / BOOT_ID):
        try:
            return path.read_text().strip()
        except OSError:
            continue
    return "unknown"


def read_hex(path: Path) -> int:
    text = read_text(path)
    try:
        return int(text, 16)
    except ValueError:
        raise DiscoveryError(f"{path}: expected a hex number like 0x10de, found {text[:40]!r}") from None


def read_int(path: Path) -> int:
    text = read_text(path)
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
    numa = read_int(base / "numa_node") if (base / "numa_node").exists() else -1
    return PciFunction(
        address=address,
        vendor=read_hex(base / "vendor"),
        device=read_hex(base / "device"),
        class_code=read_hex(base / "class"),
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
            if read_hex(entry / "vendor") != vendor:
                continue
            out.append(read_pci_function(host_root, entry.name))
        except DiscoveryError as exc:
            problems.append(f"PCI {entry.name} skipped: {exc}")
    return out


def linked_pci_address(path: Path) -> str | None:
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


def readiness(label: str, found: int, expected: int, problems: list[str], extra: list[str]) -> tuple[bool, str]:
    """(ready, reason) of an inventory of `found` devices where the catalog expects `expected`."""
    blockers = list(extra)
    if found == 0:
        blockers.insert(0, f"no {label} device found")
    elif found < expected:
        blockers.insert(0, f"found {found} of {expected} expected {label} devices")
    if blockers:
        return False, "; ".join(blockers + problems)
    summary = f"{found} {label} devices"
    return True, summary + (f" ({'; '.join(problems)})" if problems else "")


def device_node_exists(host_root: Path, node: str) -> bool:
    """Whether the device node `node` (an absolute path on the node) exists in the host tree."""
    return (host_root / node.lstrip("/")).exists()
