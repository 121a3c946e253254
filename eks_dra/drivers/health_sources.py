"""Device health from the sources a node has, cheap enough to poll every second.

- gpu: NVML XID and double-bit ECC events (drained without blocking), plus level signals per GPU:
  volatile uncorrected ECC count, row-remap pending/failure, and NVML losing the GPU. An XID marks the GPU
  unhealthy for `xid_hold_s` (default 300 s) after the last one, then the level signals decide again, so a
  GPU comes back without a plugin restart. XIDs that report application faults (13, 31, 43, 45, 68, 109,
  the NVIDIA device plugin's default skip list) are ignored. An event tied to one MIG instance marks that
  MIG device; any other marks the GPU and all its MIG devices (MIG devices follow their parent).
  Fixture host trees have no NVML: `<root>/var/lib/eks-dra/fixture/xid/gpu<minor>` holding an XID number
  stands for a GPU with that XID pending (written by `fixture.set_gpu_xid`; exists in fixtures only).
- efa: /sys/class/infiniband/<ibdev>/ports/*/state must be "4: ACTIVE".
- neuron: the driver's uncorrected ECC counters, /sys/class/neuron_device/neuronN/stats/hardware/
  {mem_ecc_uncorrected,sram_ecc_uncorrected} (a `total` file inside, or the counter file itself):
  any uncorrected error makes the device unhealthy until the counters are reset (device reset/driver reload).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eks_dra.devices import Family
from eks_dra.devices import efa as efa_model
from eks_dra.devices import gpu as gpu_model
from eks_dra.devices import neuron as neuron_model

from . import discovery
from .nvml import NvmlBackend, NvmlHealth

IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
DEFAULT_XID_HOLD_S = 300.0
NEURON_ECC_COUNTERS = ("mem_ecc_uncorrected", "sram_ecc_uncorrected")

Health = tuple[bool, str]
OK: Health = (True, "")


# --- level signals (no state) ---------------------------------------------------------------------

def efa_port_health(host_root: Path, ibdev: str) -> Health:
    ports = sorted((host_root / "sys/class/infiniband" / ibdev / "ports").glob("*/state"))
    if not ports:
        return False, f"{ibdev}: no port state in sysfs"
    for state_file in ports:
        state = discovery.read_optional(state_file)
        if state is None:
            return False, f"{ibdev} port {state_file.parent.name}: unreadable state file {state_file}"
        if state.rpartition(":")[2].strip() != "ACTIVE":  # "4: ACTIVE"; not DOWN, INIT, ARMED, ACTIVE_DEFER
            return False, f"{ibdev} port {state_file.parent.name} is {state!r}, not ACTIVE"
    return OK


def _counter(path: Path) -> int:
    target = path / "total" if path.is_dir() else path
    text = discovery.read_optional(target)
    if text is None:
        raise ValueError(f"cannot read {target}")
    return int(text or 0)


def neuron_health(host_root: Path, index: int) -> Health:
    base = host_root / "sys/class/neuron_device" / f"neuron{index}"
    if not base.exists():
        return False, f"neuron{index} disappeared from /sys/class/neuron_device"
    errors = []
    for name in NEURON_ECC_COUNTERS:
        path = base / "stats/hardware" / name
        if not path.exists():
            continue  # older drivers lack the counters: no signal is not a fault
        try:
            count = _counter(path)
        except (OSError, ValueError) as exc:
            return False, f"neuron{index}: unreadable {name} ({exc})"
        if count:
            errors.append(f"{name}={count}")
    if errors:
        return False, f"neuron{index}: uncorrected ECC errors ({', '.join(errors)}); reset the device"
    return OK


def fixture_gpu_xid(host_root: Path, minor: int) -> int | None:
    text = discovery.read_optional(host_root / discovery.FIXTURE_XID_DIR / f"gpu{minor}")
    return int(text) if text and text.isdigit() else None


def nvml_level_health(h: NvmlHealth) -> Health:
    if h.error:
        return False, f"NVML cannot reach the GPU: {h.error}"
    if h.row_remap_failure:
        return False, "row remapping failed: replace or reset the GPU"
    if h.row_remap_pending:
        return False, "row remapping pending: the GPU needs a reset"
    if h.uncorrected_ecc_volatile:
        return False, f"{h.uncorrected_ecc_volatile} uncorrected ECC errors since the last reset"
    return OK


@dataclass(frozen=True)
class _GpuEntry:
    name: str
    minor: int
    uuid: str  # the physical GPU's
    own_uuid: str  # the device's own: equal to uuid for a GPU, the MIG device's for a MIG device
    parent: str | None


def _gpu_entries(inventory: discovery.Inventory) -> list[_GpuEntry]:
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
    health = OK
    xid = fixture_gpu_xid(host_root, e.minor) if nvml is None else None
    if xid is not None and xid not in IGNORED_XIDS:
        health = (False, f"XID {xid} on GPU {e.uuid}")
    elif nvml is not None:
        try:
            health = nvml_level_health(nvml.health(e.uuid))
        except Exception as exc:  # a broken NVML must not stop the other devices' health
            health = (False, f"NVML health query failed: {exc}")
    cache[e.uuid] = health
    return health


def apply_health(family: Family, host_root: Path, inventory: discovery.Inventory,
                 nvml: NvmlBackend | None) -> None:
    """Set healthy/health_reason on a fresh inventory from the level signals (discovery's snapshot)."""
    health = _level_health(family, host_root, inventory, nvml)
    for d in inventory.devices:
        d.healthy, d.health_reason = health.get(d.device.name, OK)


def _level_health(family: Family, host_root: Path, inventory: discovery.Inventory,
                  nvml: NvmlBackend | None) -> dict[str, Health]:
    out: dict[str, Health] = {}
    if family == "gpu":
        cache: dict[str, Health] = {}
        for e in _gpu_entries(inventory):
            out[e.name] = _gpu_level(host_root, nvml, e, cache)
    elif family == "efa":
        for d in inventory.devices:
            out[d.device.name] = efa_port_health(host_root, str(d.device.attributes[efa_model.RDMA_DEVICE]))
    else:
        for d in inventory.devices:
            out[d.device.name] = neuron_health(host_root, int(d.device.attributes[neuron_model.DEVICE_ID]))
    return out


# --- the monitor ------------------------------------------------------------------------------------

class HealthMonitor:
    """Per-device health of one family: `poll()` -> {device name: (healthy, reason)}.

    The device topology (names, parents, UUIDs) comes from one discovery run, cached; call `refresh()`
    after the driver re-discovers. Each poll re-reads only the health signals.
    """

    def __init__(self, family: Family, host_root: Path, nvml: NvmlBackend | None = None, *,
                 xid_hold_s: float = DEFAULT_XID_HOLD_S, ignored_xids: frozenset[int] = IGNORED_XIDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.family = family
        self.host_root = Path(host_root)
        self._nvml = nvml
        self._auto_nvml = nvml is None and family == "gpu" and not discovery.is_fixture(self.host_root)
        self.xid_hold_s = xid_hold_s
        self.ignored_xids = ignored_xids
        self._clock = clock
        self._inventory: discovery.Inventory | None = None
        self._gi_ids: dict[str, int] = {}  # MIG device name -> GPU instance id
        self._gi_ids_for: list[str] | None = None  # the MIG device names _gi_ids was computed for
        # (GPU uuid, GPU instance id or None) -> (xid, time of the last event)
        self._events: dict[tuple[str, int | None], tuple[int, float]] = {}

    def refresh(self, inventory: discovery.Inventory | None = None) -> None:
        """Take the topology from `inventory` (the driver's latest discovery) or discover it again."""
        if self._auto_nvml and self._nvml is None:
            from .nvml import shared_nvml

            self._nvml, _ = shared_nvml()
        if inventory is None:
            inventory = discovery.discover(self.family, self.host_root, "", nvml=self._nvml)
        self._inventory = inventory
        migs = sorted(d.device.name for d in inventory.devices if d.parent)
        if self.family == "gpu" and self._nvml is not None and migs != self._gi_ids_for:
            # GPU-instance ids are not device attributes: ask NVML again only when the MIG layout changed.
            self._gi_ids, self._gi_ids_for = {}, migs
            try:
                gpus = self._nvml.gpus()
            except Exception:  # NVML trouble shows in the level signals; events then match whole GPUs only
                gpus, self._gi_ids_for = [], None
            for g in gpus:
                for m, number in discovery.number_migs(discovery.nvml_migs(g)):
                    self._gi_ids[gpu_model.mig_device_name(g.minor, m.profile, number)] = m.gpu_instance_id

    def poll(self) -> dict[str, Health]:
        if self._inventory is None:
            self.refresh()
        assert self._inventory is not None
        if self.family != "gpu":
            return _level_health(self.family, self.host_root, self._inventory, self._nvml)
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
        for e in _gpu_entries(self._inventory):
            gi = self._gi_ids.get(e.name)
            # An event names the GPU (whole GPU, or one of its GPU instances) or the MIG device itself.
            keys = [(e.uuid, None), (e.uuid, gi)] if gi is not None else [(e.uuid, None)]
            if e.own_uuid != e.uuid:
                keys += [(e.own_uuid, None), (e.own_uuid, gi)]
            event = next((r for r in (self._recent_event(u, g, now) for u, g in keys) if r), None)
            out[e.name] = (False, event) if event else _gpu_level(self.host_root, self._nvml, e, cache)
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

