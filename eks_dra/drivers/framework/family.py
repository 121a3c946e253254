"""The plug-in point between this framework, which knows no device family, and one family package.

A family package (eks_dra.drivers.gpu, .efa, .neuron) gives one DeviceFamily: how to read its devices from a
host tree, how to poll their health, which opaque configs it decodes, how it applies their settings, how its
faults become device taints, and which device plugin it must not share a node with. The framework (kubelet
plugin servers, prepare/unprepare, checkpoint, CDI specs, slices, reconciler) calls only these.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from .configs import ConfigSchema
from .device_setup import DeviceSetup
from .device_taints import TaintEffects
from .inventory import Health, Inventory

ToolUnavailable = Callable[[str, str], None]  # (tool, message): a node tool the family needs is unusable


class HealthMonitor(Protocol):
    def refresh(self, inventory: Inventory | None = None) -> None:
        """Take the device topology from `inventory` (the latest discovery), or discover it again."""

    def poll(self) -> dict[str, Health]:
        """{device name: (healthy, reason)} now; cheap enough to run every second."""


class LevelHealthMonitor:
    """The monitor of a family whose health signals are levels, read afresh on every poll (no events)."""

    def __init__(self, level: Callable[[Inventory], dict[str, Health]], discover: Callable[[], Inventory]) -> None:
        self._level = level
        self._discover = discover
        self._inventory: Inventory | None = None

    def refresh(self, inventory: Inventory | None = None) -> None:
        self._inventory = inventory if inventory is not None else self._discover()

    def poll(self) -> dict[str, Health]:
        if self._inventory is None:
            self.refresh()
        assert self._inventory is not None
        return self._level(self._inventory)


def apply_health(inventory: Inventory, health: dict[str, Health]) -> Inventory:
    """Set healthy/health_reason on a fresh inventory's devices from `health` (missing: healthy)."""
    for d in inventory.devices:
        d.healthy, d.health_reason = health.get(d.device.name, (True, ""))
    return inventory


class DeviceFamily:
    """One device family as the framework sees it. Subclasses set the class attributes and `read_devices`, and
    `level_health` where their health signals are levels; a family with health events overrides `discover` and
    `health_monitor` instead (GPU: NVML)."""

    name: str = ""  # the `eks-dra-driver <name>` argument
    device_plugin_resources: tuple[str, ...] = ()  # extended-resource prefixes of the family's device plugin
    config_schemas: dict[str, ConfigSchema] = {}  # opaque config kind -> schema; empty: takes no configuration
    # DeviceSettings keys whose apply changes the device itself (seen by every claim holding it), not only the
    # claim's container environment: state.py lets only the device's one holder set them.
    hardware_settings: frozenset[str] = frozenset()
    taint_effects: TaintEffects = {}  # fault kind (inventory.Fault) -> device taint effect
    tool_unavailable_reason = "ToolUnavailable"  # the Event reason when a node tool of the family is unusable

    def node_host(self, host_root: Path, options: dict) -> object | None:
        """The family's view of the node's own software (from main.py's flags), passed back to the methods
        below as `host`; None when the family needs none."""
        return None

    def read_devices(self, host_root: Path, *, host: object | None = None, **options) -> Inventory:
        """The family's devices in a host tree, before health. Never raises for bad host data: a malformed
        device is skipped, named in `problems`, and the inventory is not ready."""
        raise NotImplementedError

    def level_health(self, host_root: Path, inventory: Inventory) -> dict[str, Health]:
        """Each device's health from signals read afresh (no events); missing devices are healthy."""
        return {}

    def discover(self, host_root: Path, *, host: object | None = None, **options) -> Inventory:
        """The family's devices in a host tree, with the health of discovery's snapshot."""
        root = Path(host_root)
        inventory = self.read_devices(root, host=host, **options)
        return apply_health(inventory, self.level_health(root, inventory))

    def health_monitor(self, host_root: Path, *, host: object | None = None, **options) -> HealthMonitor:
        root = Path(host_root)
        return LevelHealthMonitor(lambda inventory: self.level_health(root, inventory),
                                  lambda: self.discover(root, host=host))

    def device_setup(self, host_root: Path, host: object | None, on_tool_unavailable: ToolUnavailable) -> DeviceSetup:
        """How the node applies this family's settings at prepare time."""
        return DeviceSetup()
