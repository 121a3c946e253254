"""What discovery found (Inventory, DiscoveredDevice) and the node's current devices and their health,
refreshed by polling (InventoryView, every <= 2 s).

Two sources, both given by the device family: the inventory source (the family's discovery: the device
topology, run at start, every `rediscover_s` and on demand) and the health source (the family's health
monitor's poll; cheap, run every tick). A device with a `parent` is withdrawn whenever its parent is
unhealthy, whatever the device itself reports. With `taint` (DRADeviceTaints, 1.36+) an unhealthy device
stays published, carrying the taint `taint(reason)` (device_taints.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the model is imported after the sockets serve, by discovery
    from eks_dra.devices import Device

log = logging.getLogger(__name__)

Health = tuple[bool, str]  # (healthy, reason)
HEALTHY: Health = (True, "")


class Fault(str):
    """An unhealthy device's reason that names its fault kind (e.g. "xid", "link-down"), set by the family's
    health source where it tells the fault; the kind is the device taint's value (device_taints.py), so a reworded
    message cannot change a taint. A plain str reason has no kind (taint value "unknown")."""

    kind: str

    def __new__(cls, kind: str, message: str) -> Fault:
        reason = super().__new__(cls, message)
        reason.kind = kind
        return reason


def fault_kind(reason: str) -> str | None:
    return getattr(reason, "kind", None)


def derived_reason(source: str, message: str) -> str:
    """`message` (about a device whose health follows `source`'s device) with `source`'s fault kind, if any."""
    kind = fault_kind(source)
    return Fault(kind, message) if kind else message


@dataclass
class DiscoveredDevice:
    device: Device
    healthy: bool = True
    health_reason: str = ""
    device_nodes: list[str] = field(default_factory=list)  # absolute paths as seen on the node
    # Keys ending in _VISIBLE_DEVICES hold one value per device: join them with "," for a claim.
    env: dict[str, str] = field(default_factory=dict)
    parent: str | None = None  # a device whose health follows another's (GPU: a MIG device's GPU)
    hooks: list[dict] = field(default_factory=list)  # per-device CDI hooks


@dataclass
class Inventory:
    devices: list[DiscoveredDevice]
    ready: bool
    reason: str  # why not ready; a summary when ready
    common_device_nodes: list[str] = field(default_factory=list)  # needed by every device of the family
    problems: list[str] = field(default_factory=list)  # devices skipped and why (also in `reason`)
    common_edits: dict = field(default_factory=dict)  # spec-level CDI edits of every claim

    def by_name(self) -> dict[str, DiscoveredDevice]:
        return {d.device.name: d for d in self.devices}


InventorySource = Callable[[], Inventory]  # the family's discovery
HealthSource = Callable[[Inventory | None], dict[str, Health]]  # (fresh inventory or None) -> {device: health}


@dataclass(frozen=True)
class HealthChange:
    device: str
    healthy: bool
    reason: str


class InventoryView:
    """Thread-safe snapshot of the latest inventory with effective (parent-aware) health."""

    def __init__(self, source: InventorySource, health: HealthSource | None = None,
                 taint: Callable[[str], dict] | None = None) -> None:
        self.source = source
        self.health_source = health
        self.taint = taint
        self._inventory: Inventory | None = None
        self._lock = threading.Lock()
        self.ready = False
        self.reason = "not discovered yet"
        self.common_device_nodes: list[str] = []
        self.common_edits: dict = {}  # spec-level CDI edits of the family
        self.devices: dict[str, DiscoveredDevice] = {}
        self.health: dict[str, Health] = {}  # name -> (effective healthy, reason)
        self.polls = 0

    def refresh(self, rediscover: bool = True) -> tuple[bool, list[HealthChange]]:
        """Poll health (and re-discover); returns (published device set changed?, health transitions)."""
        fresh = rediscover or self._inventory is None
        inv = self.source() if fresh else self._inventory
        reported = {d.device.name: (bool(d.healthy), d.health_reason or "") for d in inv.devices}
        if self.health_source is not None:
            reported.update(self.health_source(inv if fresh else None))
        self._inventory = inv
        devices = {d.device.name: d for d in inv.devices}
        health: dict[str, Health] = {}
        for name, d in devices.items():
            healthy, reason = reported.get(name, (True, ""))
            parent = reported.get(d.parent) if d.parent else None
            if healthy and parent is not None and not parent[0]:
                healthy, reason = False, derived_reason(parent[1], f"parent {d.parent} unhealthy: {parent[1]}")
            health[name] = (healthy, reason)
        with self._lock:
            before = (self.ready, self._published_api())
            old_health = self.health
            self.ready, self.reason = bool(inv.ready), inv.reason or ""
            self.common_device_nodes = list(inv.common_device_nodes or [])
            self.common_edits = dict(inv.common_edits or {})
            self.devices, self.health = devices, health
            self.polls += 1
            changed = before != (self.ready, self._published_api())
        transitions = []
        for name, (healthy, reason) in health.items():
            was = old_health.get(name)
            if was is not None and was[0] != healthy:
                transitions.append(HealthChange(name, healthy, reason))
            elif was is None and not healthy and old_health:
                transitions.append(HealthChange(name, False, reason))
        return changed, transitions

    def _published_api(self) -> list[dict]:
        return [d.to_api() for d in self._published()]

    def _published(self) -> list:
        """Devices that belong in the slices: discovered and effectively healthy; with `taint`, every discovered
        device, an unhealthy one carrying its taint."""
        out = []
        for name, d in sorted(self.devices.items()):
            healthy, reason = self.health.get(name, (False, ""))
            if healthy:
                out.append(d.device)
            elif self.taint is not None:
                out.append(replace(d.device, taints=[self.taint(reason)]))
        return out

    def published_devices(self) -> list | None:
        """The devices to publish, or None while the inventory is not ready (never publish a partial one)."""
        with self._lock:
            return self._published() if self.ready else None

    def get(self, name: str):
        with self._lock:
            return self.devices.get(name), self.health.get(name, (False, "unknown device"))

    def unhealthy(self) -> dict[str, str]:
        with self._lock:
            return {n: r for n, (ok, r) in self.health.items() if not ok}

    def snapshot(self) -> dict[str, bool]:
        with self._lock:
            return {n: ok for n, (ok, _) in self.health.items()}
