"""GPU health from NVML, cheap enough to poll every second.

NVML XID and double-bit ECC events (drained without blocking), plus level signals per GPU: volatile
uncorrected ECC count, row-remap pending/failure, and NVML losing the GPU. An XID marks the GPU unhealthy for
`xid_hold_s` (default 300 s) after the last one, then the level signals decide again, so a GPU comes back
without a plugin restart. XIDs that report application faults (13, 31, 43, 45, 68, 109, the NVIDIA device
plugin's default skip list) are ignored. An event tied to one MIG instance marks that MIG device; any other
marks the GPU and all its MIG devices (MIG devices follow their parent). Fixture host trees have no NVML:
`<root>/var/lib/eks-dra/fixture/xid/gpu<minor>` holding an XID number stands for a GPU with that XID pending
(written by `fixture.set_gpu_xid`; exists in fixtures only).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eks_dra.devices import gpu as gpu_model

from ..framework.hosttree import is_fixture, read_optional
from ..framework.inventory import HEALTHY, Fault, Health, Inventory
from .discovery import FIXTURE_XID_DIR, discover_gpus, number_migs, nvml_migs
from .host import GpuHost
from .nvml import NvmlBackend, NvmlHealth

IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
DEFAULT_XID_HOLD_S = 300.0


def fixture_gpu_xid(host_root: Path, minor: int) -> int | None:
    text = read_optional(host_root / FIXTURE_XID_DIR / f"gpu{minor}")
    return int(text) if text and text.isdigit() else None


def nvml_level_health(h: NvmlHealth) -> Health:
    if h.error:
        return False, Fault("gpu-lost", f"NVML cannot reach the GPU: {h.error}")
    if h.row_remap_failure:
        return False, Fault("row-remap-failed", "row remapping failed: replace or reset the GPU")
    if h.row_remap_pending:
        return False, Fault("row-remap-pending", "row remapping pending: the GPU needs a reset")
    if h.uncorrected_ecc_volatile:
        return False, Fault("ecc-uncorrected", f"{h.uncorrected_ecc_volatile} uncorrected ECC errors since the last reset")
    return HEALTHY


@dataclass(frozen=True)
class _GpuEntry:
    name: str
    minor: int
    uuid: str  # the physical GPU's
    own_uuid: str  # the device's own: equal to uuid for a GPU, the MIG device's for a MIG device
    parent: str | None


def gpu_entries(inventory: Inventory) -> list[_GpuEntry]:
    """Health keys of GPU devices: a MIG device is keyed by its parent GPU's UUID and its own."""
    out = []
    for d in inventory.devices:
        attrs = d.device.attributes
        own = str(attrs.get(gpu_model.UUID, ""))
        out.append(_GpuEntry(d.device.name, gpu_model.gpu_minor_of(d.device.name),
                             str(attrs.get(gpu_model.PARENT_UUID, own)), own, d.parent))
    return out


def _gpu_level(host_root: Path, nvml: NvmlBackend | None, e: _GpuEntry, cache: dict[str, Health]) -> Health:
    if e.uuid in cache:
        return cache[e.uuid]
    health = HEALTHY
    xid = fixture_gpu_xid(host_root, e.minor) if nvml is None else None
    if xid is not None and xid not in IGNORED_XIDS:
        health = (False, Fault("xid", f"XID {xid} on GPU {e.uuid}"))
    elif nvml is not None:
        try:
            health = nvml_level_health(nvml.health(e.uuid))
        except Exception as exc:  # a broken NVML must not stop the other devices' health
            health = (False, f"NVML health query failed: {exc}")
    cache[e.uuid] = health
    return health


def gpu_level_health(host_root: Path, inventory: Inventory, nvml: NvmlBackend | None) -> dict[str, Health]:
    """Each GPU and MIG device's health from the level signals (no events): discovery's snapshot."""
    cache: dict[str, Health] = {}
    return {e.name: _gpu_level(host_root, nvml, e, cache) for e in gpu_entries(inventory)}


class GpuHealthMonitor:
    """Per-device health of the GPUs: `poll()` -> {device name: (healthy, reason)}.

    The device topology (names, parents, UUIDs) comes from one discovery run, cached; call `refresh()`
    after the driver re-discovers. Each poll re-reads only the health signals.
    """

    def __init__(self, host_root: Path, nvml: NvmlBackend | None = None, *, gpu_host: GpuHost | None = None,
                 xid_hold_s: float = DEFAULT_XID_HOLD_S, ignored_xids: frozenset[int] = IGNORED_XIDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.host_root = Path(host_root)
        # NVML from the driver root, as discovery loads it: the container's own library path does not hold the
        # host driver's libnvidia-ml.so.1
        self.gpu_host = gpu_host or GpuHost.for_node(self.host_root)
        self._nvml = nvml
        self._auto_nvml = nvml is None and not is_fixture(self.host_root)
        self.xid_hold_s = xid_hold_s
        self.ignored_xids = ignored_xids
        self._clock = clock
        self._inventory: Inventory | None = None
        self._gi_ids: dict[str, int] = {}  # MIG device name -> GPU instance id
        self._gi_ids_for: list[str] | None = None  # the MIG device names _gi_ids was computed for
        # (GPU uuid, GPU instance id or None) -> (xid, time of the last event)
        self._events: dict[tuple[str, int | None], tuple[int, float]] = {}

    def refresh(self, inventory: Inventory | None = None) -> None:
        """Take the topology from `inventory` (the driver's latest discovery) or discover it again."""
        if self._auto_nvml and self._nvml is None:
            self._nvml = self.gpu_host.nvml()
        if inventory is None:
            inventory, _ = discover_gpus(self.host_root, nvml=self._nvml, gpu_host=self.gpu_host)
        self._inventory = inventory
        migs = sorted(d.device.name for d in inventory.devices if d.parent)
        if self._nvml is not None and migs != self._gi_ids_for:
            # GPU-instance ids are not device attributes: ask NVML again only when the MIG layout changed.
            self._gi_ids, self._gi_ids_for = {}, migs
            try:
                gpus = self._nvml.gpus()
            except Exception:  # NVML trouble shows in the level signals; events then match whole GPUs only
                gpus, self._gi_ids_for = [], None
            for g in gpus:
                for m, number in number_migs(nvml_migs(g)):
                    self._gi_ids[gpu_model.mig_device_name(g.minor, m.profile, number)] = m.gpu_instance_id

    def poll(self) -> dict[str, Health]:
        if self._inventory is None:
            self.refresh()
        assert self._inventory is not None
        now = self._clock()
        if self._nvml is not None:
            try:
                events = self._nvml.poll_events()
            except Exception:  # e.g. a GPU lost while waiting: the level signals report it
                events = []
            for ev in events:
                if ev.kind == "xid" and ev.xid in self.ignored_xids:
                    continue
                self._events[(ev.uuid, ev.gpu_instance_id)] = (ev.xid, now)
        out: dict[str, Health] = {}
        cache: dict[str, Health] = {}
        for e in gpu_entries(self._inventory):
            gi = self._gi_ids.get(e.name)
            # An event names the GPU (whole GPU, or one of its GPU instances) or the MIG device itself.
            keys = [(e.uuid, None), (e.uuid, gi)] if gi is not None else [(e.uuid, None)]
            if e.own_uuid != e.uuid:
                keys += [(e.own_uuid, None), (e.own_uuid, gi)]
            event = next((r for r in (self._recent_event(u, g, now) for u, g in keys) if r), None)
            # An XID and a double-bit ECC event both lose the GPU context: one kind.
            out[e.name] = (False, Fault("xid", event)) if event else _gpu_level(self.host_root, self._nvml, e, cache)
        return out

    def _recent_event(self, uuid: str, gi: int | None, now: float) -> str | None:
        hit = self._events.get((uuid, gi))
        if hit is None:
            return None
        xid, at = hit
        if now - at >= self.xid_hold_s:
            del self._events[(uuid, gi)]
            return None
        what = f"XID {xid}" if xid else "double-bit ECC error"
        where = f" on GPU instance {gi}" if gi is not None else ""
        return f"{what}{where} of GPU {uuid} {int(now - at)}s ago"

