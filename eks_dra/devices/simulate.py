"""Simulated devices of a node, straight from the catalog: what our drivers will publish there.

The drivers' discovery builds the same facts from a host tree (`eks_dra.drivers.{gpu,efa,neuron}.discovery`); both paths
end in the builders of gpu.py / efa.py / neuron.py, so planner and drivers cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from eks_dra.catalog import InstanceType, get_instance_type

from . import efa, gpu, neuron
from .model import Device
from .names import Family


@dataclass(frozen=True)
class NodeFacts:
    """Every device fact of one node, per family; the input of both fixtures and simulation."""

    instance_type: InstanceType
    node_name: str
    gpus: tuple[gpu.GpuFacts, ...]
    migs: tuple[gpu.MigFacts, ...]
    efas: tuple[efa.EfaFacts, ...]
    neurons: tuple[neuron.NeuronFacts, ...]


def node_facts(
    instance_type: str | InstanceType,
    node_name: str,
    mig_profile: str | None = None,
    gpu_driver_version: str = gpu.DEFAULT_DRIVER_VERSION,
    neuron_driver_version: str = neuron.DEFAULT_NEURON_DRIVER_VERSION,
) -> NodeFacts:
    it = get_instance_type(instance_type) if isinstance(instance_type, str) else instance_type
    gpus: list[gpu.GpuFacts] = []
    migs: list[gpu.MigFacts] = []
    neurons: list[neuron.NeuronFacts] = []
    efa_bdfs = [e.pci.address for e in it.efa_interfaces]
    if it.gpu is not None:
        if mig_profile is not None:
            profile = it.gpu.mig_profile(mig_profile)  # raises naming the known profiles
        for acc in it.accelerators:
            facts = gpu.gpu_facts(it.gpu, acc.index, acc.pci, node_name, gpu_driver_version)
            gpus.append(facts)
            if mig_profile is not None:
                migs.extend(gpu.mig_facts(facts, profile))
    if it.neuron is not None:
        for acc in it.accelerators:
            neurons.append(neuron.NeuronFacts(
                index=acc.index,
                instance_type=it.name,
                core_count=it.neuron.cores_per_device,
                memory_mib=it.neuron.memory_mib,
                pci=acc.pci,
                driver_version=neuron_driver_version,
                device_groups=neuron.device_group_ids(acc.index, it.neuron_efa_map, efa_bdfs),
            ))
    efa_groups: dict[int, dict[int, str]] = {}
    for n in neurons:
        if it.neuron_efa_map:
            efa_groups.setdefault(it.neuron_efa_map[n.index], n.device_groups)
    efas = tuple(
        efa.EfaFacts(efa.rdma_device_name(e.pci), e.pci, e.pci_device_id, efa_groups.get(e.index, {}))
        for e in it.efa_interfaces
    )
    return NodeFacts(it, node_name, tuple(gpus), tuple(migs), efas, tuple(neurons))


def devices_from_facts(facts: NodeFacts) -> dict[Family, list[Device]]:
    """Per family, the devices a node publishes. A GPU in MIG mode publishes its MIG devices instead."""
    partitioned = {m.parent.minor for m in facts.migs}
    out: dict[Family, list[Device]] = {}
    if facts.gpus:
        out["gpu"] = [gpu.gpu_device(g) for g in facts.gpus if g.minor not in partitioned]
        out["gpu"] += [gpu.mig_device(m) for m in facts.migs]
    if facts.efas:
        out["efa"] = [efa.efa_device(e) for e in facts.efas]
    if facts.neurons:
        out["neuron"] = [neuron.neuron_device(n, len(facts.neurons)) for n in facts.neurons]
    return out


def simulate_node(instance_type: str | InstanceType, node_name: str, mig_profile: str | None = None) -> dict[Family, list[Device]]:
    """The devices our drivers publish on a node of this instance type."""
    return devices_from_facts(node_facts(instance_type, node_name, mig_profile=mig_profile))
