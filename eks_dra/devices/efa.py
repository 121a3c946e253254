"""EFA family: DRANET's attribute vocabulary (driver `dra.net`) and the EFA device builder.

Names and types follow kubernetes-sigs/dranet (`pkg/apis/attributes.go`, `pkg/inventory/db.go`,
`pkg/cloudprovider/aws`): `pciDevice` and `pciVendor` are the pci.ids names of the function, `pciSubsystem`
its subsystem id (`efa1`, as DRANET publishes on EFA; aws/karpenter-provider-aws drametadata records the
same values), `rdma`, `rdmaDevice`, `pciAddress`, `numaNode`, the standard `resource.kubernetes.io/pcieRoot`
and, on Neuron instances, `resource.aws.com/devicegroup{1,4,8,16}_id`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eks_dra.catalog import PciLocation

from .model import DEVICE_GROUP, PCIE_ROOT, Device

PCI_DEVICE = "pciDevice"
PCI_VENDOR = "pciVendor"
PCI_SUBSYSTEM = "pciSubsystem"
RDMA = "rdma"
RDMA_DEVICE = "rdmaDevice"
PCI_ADDRESS = "pciAddress"
NUMA_NODE = "numaNode"

EFA_PCI_DEVICE_NAME = "Elastic Fabric Adapter (EFA)"  # pci.ids name of 1d0f:efa0..efa3
AMAZON_PCI_VENDOR_NAME = "Amazon.com, Inc."  # pci.ids name of vendor 1d0f


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
        PCI_DEVICE: EFA_PCI_DEVICE_NAME,
        PCI_VENDOR: AMAZON_PCI_VENDOR_NAME,
        PCI_SUBSYSTEM: f"{f.pci_device_id:04x}",  # EFA functions carry their device id as subsystem id
        RDMA: True,
        RDMA_DEVICE: f.rdma_device,
        PCI_ADDRESS: f.pci.address,
        NUMA_NODE: f.pci.numa_node,
        PCIE_ROOT: f.pci.root,
    }
    for size, gid in sorted(f.device_groups.items()):
        attrs[DEVICE_GROUP.format(size=size)] = gid
    return Device(efa_device_name(f.pci), attrs)
