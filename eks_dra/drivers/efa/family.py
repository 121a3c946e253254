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
from ..framework.family import DeviceFamily, HealthMonitor, LevelHealthMonitor, apply_health
from ..framework.inventory import Inventory


class EfaFamily(DeviceFamily):
    name = "efa"
    device_plugin_resources = ("vpc.amazonaws.com/efa",)
    taint_effects: TaintEffects = {"link-down": NO_EXECUTE}

    def discover(self, host_root: Path, *, host: object | None = None, instance_type: str | None = None,
                 **options) -> Inventory:
        from .discovery import discover_efas
        from .health import efa_level_health

        inventory = discover_efas(host_root, instance_type=instance_type)
        return apply_health(inventory, efa_level_health(Path(host_root), inventory))

    def health_monitor(self, host_root: Path, *, host: object | None = None, **options) -> HealthMonitor:
        from .health import efa_level_health

        root = Path(host_root)
        return LevelHealthMonitor(lambda inventory: efa_level_health(root, inventory),
                                  lambda: self.discover(root, host=host))


FAMILY = EfaFamily()
