"""EFA family: attribute names and the EFA device builder."""

from __future__ import annotations

from dataclasses import dataclass, field

from eks_dra.catalog import PciLocation

from .model import DEVICE_GROUP, PCIE_ROOT, Device

RDMA_DEVICE = "rdmaDevice"
PCI_ADDRESS = "pciAddress"
NUMA_NODE = "numaNode"
EFA_VERSION = "efaVersion"  # PCI device id generation: efa0..efa3


@dataclass(frozen=True)
class EfaFacts:
    rdma_device: str  # /sys/class/infiniband/<name>
    pci: PciLocation
    pci_device_id: int
    device_groups: dict[int, str] = field(default_factory=dict)  # Trainium nodes only


def rdma_device_name(pci: PciLocation) -> str:
    """The kernel's predictable name for an EFA: rdmap<bus>s<slot> (decimal, as the efa driver does)."""
    _, bus, devfn = pci.address.split(":")
    slot = int(devfn.split(".")[0], 16)
    return f"rdmap{int(bus, 16)}s{slot}"


def efa_device_name(pci: PciLocation) -> str:
    """Named by PCI address: stable across reboots, unlike enumeration order."""
    return "efa-" + pci.address.replace(":", "-").replace(".", "-")


def efa_device(f: EfaFacts) -> Device:
    attrs: dict = {
        RDMA_DEVICE: f.rdma_device,
        PCI_ADDRESS: f.pci.address,
        NUMA_NODE: f.pci.numa_node,
        EFA_VERSION: f"efa{f.pci_device_id - 0xEFA0}",
        PCIE_ROOT: f.pci.root,
    }
    for size, gid in sorted(f.device_groups.items()):
        attrs[DEVICE_GROUP.format(size=size)] = gid
    return Device(efa_device_name(f.pci), attrs)
