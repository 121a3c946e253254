"""The node's current devices and their health, refreshed by polling the discovery (every <= 2 s).

Two sources: `discover()` (discovery.discover: the device topology, run at start, every
`rediscover_s` and on demand) and `poll_health()` (health_sources.HealthMonitor.poll: NVML XID/ECC events,
Neuron error counters, EFA port state; cheap, run every tick). A MIG device is withdrawn whenever its
parent GPU is unhealthy, whatever the MIG device itself reports. With `taint` (DRADeviceTaints, 1.36+)
an unhealthy device stays published, carrying the taint `taint(reason)` (eks_dra.drivers.device_taints).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

log = logging.getLogger(__name__)

InventorySource = Callable[[], Any]  # () -> discovery.Inventory
HealthSource = Callable[[Any], dict[str, tuple[bool, str]]]  # (fresh inventory or None) -> {device: health}


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
        self._inventory = None
        self._lock = threading.Lock()
        self.ready = False
        self.reason = "not discovered yet"
        self.common_device_nodes: list[str] = []
        self.common_edits: dict = {}  # spec-level CDI edits of the family (GPU: the driver root's files, hooks)
        self.devices: dict[str, Any] = {}  # name -> DiscoveredDevice
        self.health: dict[str, tuple[bool, str]] = {}  # name -> (effective healthy, reason)
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
        health: dict[str, tuple[bool, str]] = {}
        for name, d in devices.items():
            healthy, reason = reported.get(name, (True, ""))
            parent = reported.get(d.parent) if d.parent else None
            if healthy and parent is not None and not parent[0]:
                healthy, reason = False, f"parent {d.parent} unhealthy: {parent[1]}"
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
