"""Neuron family: the Neuron DRA driver's attribute vocabulary, device-group ids and the device builder.

The Neuron driver's source is not public; names follow its documentation (aws-neuron-sdk
`deploy/eks/dra.rst` @ 3afa0fdf): `deviceId`, `instanceType`, `neuronDriverVersion`, `draDriverVersion`,
`resourceType`, `topology_x`/`topology_y`, `topology4_id`/`topology8_id`, the
`resource.aws.com/devicegroup*_id` ids, and device names `neurondevice<N>` (its allocation example).
`networkNodeLayer1..3` (EC2 network topology) are not published: nothing on the node tells them.
We add `coreCount`, `numaNode` and `resource.kubernetes.io/pcieRoot`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from importlib import metadata

from eks_dra.catalog import PciLocation

from .model import DEVICE_GROUP, DEVICE_GROUP_SIZES, PCIE_ROOT, Device

DEVICE_ID = "deviceId"
INSTANCE_TYPE = "instanceType"
CORE_COUNT = "coreCount"
TOPOLOGY_X = "topology_x"
TOPOLOGY_Y = "topology_y"
NUMA_NODE = "numaNode"
RESOURCE_TYPE = "resourceType"
DRIVER_VERSION = "neuronDriverVersion"
DRA_DRIVER_VERSION = "draDriverVersion"
TOPOLOGY4_ID = "topology4_id"  # UNVERIFIED meaning: the 4-device group of the torus, deviceId // 4
TOPOLOGY8_ID = "topology8_id"  # UNVERIFIED meaning: deviceId // 8
CAP_MEMORY = "memory"
CAP_CORES = "neuronCores"

DEFAULT_NEURON_DRIVER_VERSION = "2.25.4.0"
# Trainium2 runs two physical NeuronCores as one logical core by default; earlier chips have no LNC=2.
LNC2_INSTANCE_PREFIXES = ("trn2", "trn3")


def default_logical_core_size(instance_type: str) -> int:
    """Physical NeuronCores per logical core (LNC) when nothing sets it: 2 on Trainium2 and later, else 1."""
    return 2 if instance_type.startswith(LNC2_INSTANCE_PREFIXES) else 1


def _dra_driver_version() -> str:
    """Which DRA driver publishes the device: ours, with the package's version."""
    try:
        return f"eks-dra-{metadata.version('eks-dra')}"
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "eks-dra"


DRA_DRIVER_VERSION_VALUE = _dra_driver_version()


@dataclass(frozen=True)
class NeuronFacts:
    index: int  # /dev/neuron<index>
    instance_type: str
    core_count: int
    memory_mib: int
    pci: PciLocation
    driver_version: str = DEFAULT_NEURON_DRIVER_VERSION
    device_groups: dict[int, str] = field(default_factory=dict)


def topology_xy(index: int, count: int) -> tuple[int, int]:
    """Position in the NeuronLink torus: 16 devices form a 4x4 torus; smaller sets sit on one row."""
    if count == 16:
        return index % 4, index // 4
    return index, 0


def device_group_ids(neuron_index: int, neuron_efa_map: tuple[int, ...], efa_bdfs: list[str]) -> dict[int, str]:
    """resource.aws.com/devicegroupN_id for one Neuron device (or its EFA).

    N=1 is the BDF of the device's EFA; larger N hash the sorted, de-duplicated EFA BDFs of Neuron
    devices floor(id/N)*N .. floor(id/N)*N+N-1 with sha256 and keep 16 hex characters.
    """
    if not neuron_efa_map:
        return {}
    groups = {1: efa_bdfs[neuron_efa_map[neuron_index]]}
    total = len(neuron_efa_map)
    for size in DEVICE_GROUP_SIZES[1:]:
        if size > total:
            break
        start = (neuron_index // size) * size
        bdfs = sorted({efa_bdfs[neuron_efa_map[i]] for i in range(start, start + size)})
        groups[size] = hashlib.sha256(",".join(bdfs).encode()).hexdigest()[:16]
    return groups


def neuron_device_name(index: int) -> str:
    return f"neurondevice{index}"


def neuron_device_index(name: str) -> int:
    """The device id (/dev/neuron<N>) in a name of neuron_device_name."""
    return int(name.removeprefix("neurondevice"))


def neuron_device(f: NeuronFacts, device_count: int) -> Device:
    x, y = topology_xy(f.index, device_count)
    attrs: dict = {
        DEVICE_ID: f.index,
        INSTANCE_TYPE: f.instance_type,
        CORE_COUNT: f.core_count,
        TOPOLOGY_X: x,
        TOPOLOGY_Y: y,
        NUMA_NODE: f.pci.numa_node,
        RESOURCE_TYPE: "neuron_device",
        DRIVER_VERSION: f.driver_version,
        DRA_DRIVER_VERSION: DRA_DRIVER_VERSION_VALUE,
        TOPOLOGY4_ID: f.index // 4,
        TOPOLOGY8_ID: f.index // 8,
        PCIE_ROOT: f.pci.root,
    }
    for size, gid in sorted(f.device_groups.items()):
        attrs[DEVICE_GROUP.format(size=size)] = gid
    return Device(neuron_device_name(f.index), attrs,
                  {CAP_MEMORY: f"{f.memory_mib}Mi", CAP_CORES: str(f.core_count)})
