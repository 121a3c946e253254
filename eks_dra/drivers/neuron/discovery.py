"""Neuron discovery: a node's host tree -> the Trainium/Inferentia devices the Neuron driver publishes.

Sources: PCI functions 0x1d0f:0x7164/0x7264/0x7364 and /sys/class/neuron_device/neuronN, /dev/neuronN.
A class device with a `device` link names its PCI function; the documented layout is a virtual class device
(/sys/devices/virtual/neuron_device) without one, and then device N is taken to be the N-th Neuron PCI
function in bus order (ASSUMPTION: holds where the driver numbers devices in probe order). Device groups:
the catalog's Neuron-to-EFA wiring for the instance type, hashed by `eks_dra.devices.neuron.device_group_ids`.
"""

from __future__ import annotations

from pathlib import Path

from eks_dra.catalog import NEURON_MODELS, InstanceType
from eks_dra.devices import neuron as neuron_model

from ..framework.hosttree import (
    DMI_PRODUCT_NAME,
    DiscoveryError,
    device_node_exists,
    instance_type_of,
    linked_pci_address,
    list_pci_functions,
    read_int,
    read_optional,
    readiness,
)
from ..framework.inventory import DiscoveredDevice, Inventory

AMAZON_VENDOR = 0x1D0F
NEURON_MODELS_BY_PCI_ID = {m.pci_device_id: m for m in NEURON_MODELS.values()}
NEURON_VERSION_FILE = Path("sys/module/neuron/version")


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
        address = linked_pci_address(d)
        if address is None and index < len(pci_neurons):
            address = pci_neurons[index].address  # virtual class device: bus order (see module docstring)
        pci = by_address.get(address or "")
        if pci is None:
            problems.append(f"{d}: no Neuron PCI function for this device")
            continue
        model = NEURON_MODELS_BY_PCI_ID[pci.device]
        try:
            cores = read_int(d / "core_count") if (d / "core_count").exists() else model.cores_per_device
        except DiscoveryError as exc:
            problems.append(str(exc))
            continue
        if not device_node_exists(host_root, f"/dev/neuron{index}"):
            blockers.append(f"/dev/neuron{index} missing")
        groups = neuron_model.device_group_ids(index, efa_map, efa_bdfs) if index < len(efa_map) else {}
        facts.append(neuron_model.NeuronFacts(index, instance_name, cores, model.memory_mib, pci.location,
                                              driver_version, groups))
    devices = [DiscoveredDevice(neuron_model.neuron_device(f, len(facts)), device_nodes=[f"/dev/neuron{f.index}"],
                                env={"AWS_NEURON_VISIBLE_DEVICES": str(f.index)}) for f in facts]
    ready, reason = readiness("Neuron", len(devices), expected, problems, blockers)
    return Inventory(devices, ready, reason, [], problems)


def discover_neurons(host_root: Path, *, instance_type: str | None = None) -> Inventory:
    """The Neuron inventory of a host tree; never raises for bad host data (see discover_gpus)."""
    host_root = Path(host_root)
    return _discover_neuron(host_root, instance_type_of(host_root, instance_type), [])
