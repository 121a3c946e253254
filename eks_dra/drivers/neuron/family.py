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
from ..framework.family import DeviceFamily, HealthMonitor, LevelHealthMonitor, ToolUnavailable, apply_health
from ..framework.inventory import Inventory
from .configs import NEURON_CONFIG_SCHEMAS


class NeuronFamily(DeviceFamily):
    name = "neuron"
    device_plugin_resources = ("aws.amazon.com/neuron",)  # neuron, neuroncore, neurondevice
    config_schemas = NEURON_CONFIG_SCHEMAS
    taint_effects: TaintEffects = {"ecc-uncorrected": NO_EXECUTE, "device-lost": NO_EXECUTE}

    def discover(self, host_root: Path, *, host: object | None = None, instance_type: str | None = None,
                 **options) -> Inventory:
        from .discovery import discover_neurons
        from .health import neuron_level_health

        inventory = discover_neurons(host_root, instance_type=instance_type)
        return apply_health(inventory, neuron_level_health(Path(host_root), inventory))

    def health_monitor(self, host_root: Path, *, host: object | None = None, **options) -> HealthMonitor:
        from .health import neuron_level_health

        root = Path(host_root)
        return LevelHealthMonitor(lambda inventory: neuron_level_health(root, inventory),
                                  lambda: self.discover(root, host=host))

    def device_setup(self, host_root: Path, host: object | None, on_tool_unavailable: ToolUnavailable) -> DeviceSetup:
        from .setup import NeuronSetup

        return NeuronSetup()


FAMILY = NeuronFamily()
