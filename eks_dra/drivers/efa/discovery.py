"""EFA discovery: a node's host tree -> the EFA interfaces the EFA driver publishes.

Sources: /sys/class/infiniband/<ibdev> whose `device` link is an Amazon (0x1d0f) PCI function with an EFA
device id (0xefa0-0xefa3); /dev/infiniband/uverbsN through /sys/class/infiniband_verbs/uverbsN/ibdev.
Device groups (Trainium): the catalog's Neuron-to-EFA wiring for the node's instance type (the lookup table
of aws-neuron/connected-device-maps-over-efa-for-neuron that the upstream drivers use), hashed by
`eks_dra.devices.neuron.device_group_ids`. ASSUMPTION: the instance's EFA BDFs are the catalog's.
"""

from __future__ import annotations

from pathlib import Path

from eks_dra.catalog import InstanceType
from eks_dra.devices import efa as efa_model
from eks_dra.devices import neuron as neuron_model

from ..framework.hosttree import (
    DiscoveryError,
    device_node_exists,
    instance_type_of,
    linked_pci_address,
    list_pci_functions,
    read_text,
    readiness,
)
from ..framework.inventory import DiscoveredDevice, Inventory

AMAZON_VENDOR = 0x1D0F
EFA_DEVICE_IDS = frozenset(range(0xEFA0, 0xEFA4))
RDMA_CM_DEVICE = "/dev/infiniband/rdma_cm"


def _uverbs_by_ibdev(host_root: Path) -> dict[str, str]:
    """/sys/class/infiniband_verbs/uverbsN/ibdev -> {ibdev: "/dev/infiniband/uverbsN"}."""
    out = {}
    for d in sorted((host_root / "sys/class/infiniband_verbs").glob("uverbs*")):
        try:
            out[read_text(d / "ibdev")] = f"/dev/infiniband/{d.name}"
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
        address = linked_pci_address(ibdev)
        if address is None or address not in pci_efas:
            continue  # not an EFA (e.g. a Mellanox HCA) or a dangling link
        bound.add(address)
        pci = pci_efas[address]
        facts = efa_model.EfaFacts(ibdev.name, pci.location, pci.device, groups.get(address, {}))
        node = uverbs.get(ibdev.name)
        if node is None or not device_node_exists(host_root, node):
            blockers.append(f"no uverbs device node for {ibdev.name}")
            continue
        # As DRANET does: the RDMA connection manager with every interface's verbs device.
        nodes = [RDMA_CM_DEVICE, node] if device_node_exists(host_root, RDMA_CM_DEVICE) else [node]
        devices.append(DiscoveredDevice(efa_model.efa_device(facts), device_nodes=nodes))
    for address in sorted(set(pci_efas) - bound):
        problems.append(f"EFA {address} has no RDMA device yet (efa driver not bound)")
    ready, reason = readiness("EFA", len(devices), expected, problems, blockers)
    return Inventory(sorted(devices, key=lambda d: d.device.name), ready, reason, [], problems)


def discover_efas(host_root: Path, *, instance_type: str | None = None) -> Inventory:
    """The EFA inventory of a host tree; never raises for bad host data (see discover_gpus)."""
    host_root = Path(host_root)
    return _discover_efa(host_root, instance_type_of(host_root, instance_type), [])
