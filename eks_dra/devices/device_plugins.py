"""The extended resources that the device plugins of a `deviceMode: device-plugin` node group advertise.

The one place their names live: the planner simulates device-plugin nodes from them and the DeviceClasses name
them where DRAExtendedResource is on. Counts per instance type come from the catalog, as the plugins that
charts/device_plugins.py deploys count them:

- NVIDIA k8s-device-plugin: `nvidia.com/gpu`, one per GPU. The chart sets no MIG strategy, so the plugin runs
  with `none`, which advertises every GPU whole, MIG mode or not (NVIDIA k8s-device-plugin README, "MIG
  support"); `nvidia.com/mig-*` resources would need `mixed`.
- AWS Neuron device plugin: `aws.amazon.com/neuron`, one per Neuron device, and `aws.amazon.com/neuroncore`,
  one per logical NeuronCore: the physical cores divided by the instance's default logical-core size
  (awsdocs-neuron containers/tutorials/k8s-neuron-device-plugin).
- aws-efa-k8s-device-plugin: `vpc.amazonaws.com/efa`, one per EFA interface of the node.
"""

from __future__ import annotations

from collections.abc import Iterable

from eks_dra.catalog import InstanceType

from .names import Family
from .neuron import default_logical_core_size

GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
NEURON_RESOURCE = "aws.amazon.com/neuron"
NEURON_CORE_RESOURCE = "aws.amazon.com/neuroncore"

# Per family, the extended resources its device plugin advertises; the first is the whole device.
FAMILY_RESOURCES: dict[Family, tuple[str, ...]] = {
    "gpu": (GPU_RESOURCE,), "efa": (EFA_RESOURCE,), "neuron": (NEURON_RESOURCE, NEURON_CORE_RESOURCE)}
DEVICE_PLUGIN_RESOURCES: frozenset[str] = frozenset(name for names in FAMILY_RESOURCES.values() for name in names)


def advertised(instance: InstanceType, families: Iterable[str]) -> dict[str, int]:
    """What the device plugins of `families` advertise on one node of the instance type (allocatable)."""
    out: dict[str, int] = {}
    for family in families:
        if family == "gpu" and instance.gpu is not None:
            out[GPU_RESOURCE] = instance.accelerator_count
        elif family == "neuron" and instance.neuron is not None:
            out[NEURON_RESOURCE] = instance.accelerator_count
            out[NEURON_CORE_RESOURCE] = (instance.accelerator_count * instance.neuron.cores_per_device
                                         // default_logical_core_size(instance.name))
        elif family == "efa" and instance.efa_interfaces:
            out[EFA_RESOURCE] = len(instance.efa_interfaces)
    return out
