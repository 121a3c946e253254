"""The AWS Neuron family (`eks-dra-driver neuron`, driver name neuron.aws.com by default).

Device taints (DRADeviceTaints) by fault:

| fault (health.py) | kind = value | effect |
|---|---|---|
| uncorrected ECC errors | ecc-uncorrected | NoExecute: memory contents are corrupt |
| device gone from sysfs | device-lost | NoExecute |
| unreadable ECC counters, anything else | unknown | NoSchedule |
"""

from __future__ import annotations

from pathlib import Path

from ..framework.device_setup import DeviceSetup
from ..framework.device_taints import NO_EXECUTE, TaintEffects
from ..framework.family import DeviceFamily, ToolUnavailable
from ..framework.inventory import Health, Inventory
from .configs import NEURON_CONFIG_SCHEMAS


class NeuronFamily(DeviceFamily):
    name = "neuron"
    device_plugin_resources = ("aws.amazon.com/neuron",)  # neuron, neuroncore, neurondevice
    config_schemas = NEURON_CONFIG_SCHEMAS
    taint_effects: TaintEffects = {"ecc-uncorrected": NO_EXECUTE, "device-lost": NO_EXECUTE}

    def read_devices(self, host_root: Path, *, host: object | None = None, instance_type: str | None = None,
                     **options) -> Inventory:
        from .discovery import discover_neurons

        return discover_neurons(host_root, instance_type=instance_type)

    def level_health(self, host_root: Path, inventory: Inventory) -> dict[str, Health]:
        from .health import neuron_level_health

        return neuron_level_health(host_root, inventory)

    def device_setup(self, host_root: Path, host: object | None, on_tool_unavailable: ToolUnavailable) -> DeviceSetup:
        from .setup import NeuronSetup

        return NeuronSetup()


FAMILY = NeuronFamily()
