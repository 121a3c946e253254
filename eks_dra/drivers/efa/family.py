"""The EFA family (`eks-dra-driver efa`, driver name dra.net by default).

Device taints (DRADeviceTaints) by fault:

| fault (health.py) | kind = value | effect |
|---|---|---|
| a port not ACTIVE | link-down | NoExecute: traffic over the interface fails |
| no or unreadable port state, anything else | unknown | NoSchedule: health cannot be told |
"""

from __future__ import annotations

from pathlib import Path

from ..framework.device_taints import NO_EXECUTE, TaintEffects
from ..framework.family import DeviceFamily
from ..framework.inventory import Health, Inventory


class EfaFamily(DeviceFamily):
    name = "efa"
    device_plugin_resources = ("vpc.amazonaws.com/efa",)
    taint_effects: TaintEffects = {"link-down": NO_EXECUTE}

    def read_devices(self, host_root: Path, *, host: object | None = None, instance_type: str | None = None,
                     **options) -> Inventory:
        from .discovery import discover_efas

        return discover_efas(host_root, instance_type=instance_type)

    def level_health(self, host_root: Path, inventory: Inventory) -> dict[str, Health]:
        from .health import efa_level_health

        return efa_level_health(host_root, inventory)


FAMILY = EfaFamily()
