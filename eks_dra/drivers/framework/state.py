"""Prepare and unprepare: the claim checks, the checkpoint, device settings and CDI specs.

Prepare of one claim:
  1. (no lock) a claim recorded PrepareCompleted returns its recorded devices, after making sure its CDI
     spec is still there and whole (rewritten if not: /var/run/cdi is a tmpfs);
  2. (no lock) fetch the claim (the call's claims in parallel, each read within the kubelet call's deadline:
     a claim not read in time gets its own error, the others their answers); refuse a UID mismatch, a claim
     that is not allocated, allocated to another node (pool = node name) or naming devices this node does not
     have or that are unhealthy; decode the opaque configs strictly;
  3. (node lock) refuse devices recorded for another claim (a forged or racing double allocation), record
     PrepareStarted when a hardware setting is about to change, apply device settings, write the CDI spec,
     record PrepareCompleted (fsynced) and only then answer the kubelet. Prepares that queue for the lock at
     the same time are committed together, with one fsynced checkpoint write (group commit).
Spec and checkpoint are written whole and read back, or the claim's answer is the error naming the file and the
cause ("cannot write <file>: No space left on device"); a spec that could not be written is removed.
A crash between any two steps leaves a state that the next prepare (or the reconciler) repairs: a
PrepareStarted record keeps its devices reserved and its settings revertible until its claim is prepared
again or goes away; a CDI spec without a record is rewritten by the retry or removed by the reconciler.
Unprepare: revert settings, remove the spec, drop the record; an unknown claim is not an error.

Device settings are owned by one claim. A setting that changes the device itself (the family's
`hardware_settings`: GPU time-slicing) is refused on an adminAccess request, and on a device that another
claim holds (any record, with or without adminAccess); it is reverted only when no other claim holds the device
(until then the revert is handed to a remaining holder, the record's settings["inherited"]). The NVIDIA driver
(github.com/NVIDIA/k8s-dra-driver-gpu, cmd/gpu-kubelet-plugin/device_state.go) sets the interval on the GPUs of
the claim being prepared and resets them to Default at its unprepare, and lets only adminAccess allocations
overlap a prepared device; it applies an adminAccess claim's config too, which would let a monitoring claim
change (and at its unprepare reset) the interval under another claim's workload: that is what this refuses.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

from . import cdi as cdi_mod
from . import crashpoints
from .checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    CheckpointCorrupt,
    CheckpointStore,
    ClaimRecord,
    PreparedDevice,
)
from .configs import ConfigError, DeviceSettings, settings_per_request
from .device_setup import DeviceSetup, SetupError, admin_access_refusal, describe, hardware_changes
from .family import DeviceFamily
from .fsutil import WriteError
from .kube import DEFAULT_TIMEOUT, ApiError
from .lock import LockTimeout, NodeLock

log = logging.getLogger(__name__)
UID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
PREPARE_WORKERS = 16  # claims of one kubelet call read at once (one pod's claims of one driver: a handful)
READ_TIMEOUT_S = sum(DEFAULT_TIMEOUT)  # a claim read's whole time within a deadline, at most


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


class ClaimError(Exception):
    """This claim cannot be prepared; the message goes into its response entry."""


@dataclass
class _Pending:
    """A prepare waiting for the group commit."""

    ref: ClaimRef
    planned: list
    result: list | None = None
    error: Exception | None = None
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class PlannedDevice:
    request: str
    device_name: str
    admin_access: bool
    settings: DeviceSettings


def validate_ref(ref: ClaimRef) -> None:
    if not UID_RE.match(ref.uid or ""):
        raise ClaimError(f"claim uid {ref.uid[:80]!r} is not a Kubernetes UID")
    if not DNS_LABEL_RE.match(ref.namespace or ""):
        raise ClaimError(f"claim namespace {ref.namespace[:80]!r} is not a valid namespace name")
    if len(ref.name or "") > 253 or not DNS_SUBDOMAIN_RE.match(ref.name or ""):
        raise ClaimError(f"claim name {ref.name[:80]!r} is not a valid object name")


def _node_selector_names(selector: dict) -> set[str] | None:
    """Node names a `metadata.name In [...]` node selector allows (None: it does not restrict by name)."""
    names: set[str] | None = None
    for term in selector.get("nodeSelectorTerms") or []:
        for req in term.get("matchFields") or []:
            if req.get("key") == "metadata.name" and req.get("operator") == "In":
                names = (names or set()) | set(req.get("values") or [])
    return names


def _admin_only(rec: ClaimRecord, device_name: str) -> bool:
    """Whether the record holds the device only through adminAccess results (it shares, never owns, it)."""
    return device_name in (rec.settings.get("adminAccess") or ())


def _admin_only_devices(results: list[tuple[str, bool]]) -> list[str]:
    """(device, adminAccess) results -> the devices held only with adminAccess, as the record stores them."""
    return sorted({d for d, admin in results if admin} - {d for d, admin in results if not admin})


class DeviceState:
    def __init__(self, *, driver: str, family: DeviceFamily, node_name: str, api, inventory, store: CheckpointStore,
                 cdi: cdi_mod.CdiDir, setup: DeviceSetup, lock: NodeLock, metrics, events,
                 host_root: Path | None = None) -> None:
        self.driver, self.family, self.node_name = driver, family, node_name
        # Where the node's /dev is visible to us: a CDI spec must never name a device node that is gone
        # (host driver unloaded between two inventory polls); the container would fail to start.
        self.host_root = host_root
        self.api, self.inventory, self.store, self.cdi = api, inventory, store, cdi
        self.setup, self.lock, self.metrics, self.events = setup, lock, metrics, events
        self.on_corrupt = lambda: None  # the driver moves a checkpoint that went bad at run time aside
        self._queue: list[_Pending] = []  # prepares waiting for the node lock (group commit)
        self._queue_lock = threading.Lock()

    # ----- prepare
    def prepare(self, refs: list[ClaimRef], deadline: float | None = None) -> dict[str, tuple[list[PreparedDevice], str]]:
        """Prepare a kubelet call's claims: {uid: (devices, error)}, one entry per claim.

        `deadline` (a time.monotonic() value; None: none): when the kubelet's call ends. The claims are read in
        parallel, each read bounded by it; a claim read too late is not prepared and gets its own error, and a
        claim still unanswered at the deadline (waiting for the node lock) is answered with an error then, so
        the others' answers reach the kubelet (a late one that still completes is what the kubelet's retry
        finds recorded).
        """
        by_uid: dict[str, ClaimRef] = {}
        for ref in refs:
            by_uid.setdefault(ref.uid, ref)
        unique = list(by_uid.values())
        if len(unique) <= 1:
            return {ref.uid: self._answer(ref, deadline) for ref in unique}
        pool = futures.ThreadPoolExecutor(max_workers=min(len(unique), PREPARE_WORKERS), thread_name_prefix="prepare")
        running = {ref.uid: pool.submit(self._answer, ref, deadline) for ref in unique}
        pool.shutdown(wait=False)
        futures.wait(running.values(), timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        out: dict[str, tuple[list[PreparedDevice], str]] = {}
        for ref in unique:
            if running[ref.uid].done():
                out[ref.uid] = running[ref.uid].result()
                continue
            out[ref.uid] = ([], f"{self.driver}: claim {ref}: still in progress at the kubelet call's "
                                "deadline (node lock, device settings); the kubelet retries")
            self.metrics.prepare.labels(self.driver, "error").inc()
            log.warning("prepare past the deadline", extra={"claim": ref.uid, "claimRef": str(ref)})
        return out

    def _answer(self, ref: ClaimRef, deadline: float | None) -> tuple[list[PreparedDevice], str]:
        """One claim's (devices, error): every failure is this claim's answer only."""
        start = time.perf_counter()
        try:
            devices = self._prepare_one(ref, deadline)
            answer = (devices, "")
            self.metrics.prepare.labels(self.driver, "ok").inc()
            log.info("prepared", extra={"claim": ref.uid, "claimRef": str(ref),
                                        "devices": [d.device_name for d in devices],
                                        "durationMs": round((time.perf_counter() - start) * 1000, 2)})
        except CheckpointCorrupt as exc:
            self.on_corrupt()
            answer = ([], f"{self.driver}: claim {ref}: {exc}; the checkpoint is being moved aside and rebuilt, the "
                          "kubelet's retry will succeed")
            self.metrics.prepare.labels(self.driver, "error").inc()
        except (ClaimError, ConfigError, SetupError, LockTimeout, WriteError) as exc:
            answer = ([], f"{self.driver}: claim {ref}: {exc}")
            self.metrics.prepare.labels(self.driver, "error").inc()
            log.warning("prepare refused", extra={"claim": ref.uid, "claimRef": str(ref), "error": str(exc)})
        except Exception as exc:  # noqa: BLE001 - one claim's failure must not fail the others
            answer = ([], f"{self.driver}: claim {ref}: internal error: {type(exc).__name__}: {exc}")
            self.metrics.prepare.labels(self.driver, "error").inc()
            log.exception("prepare failed", extra={"claim": ref.uid, "claimRef": str(ref)})
        self.metrics.prepare_seconds.labels(self.driver).observe(time.perf_counter() - start)
        return answer

    def _read_claim(self, ref: ClaimRef, deadline: float | None) -> dict:
        """The claim from the API, read within the deadline (ClaimError otherwise)."""
        timeout_s = None
        if deadline is not None:
            timeout_s = min(deadline - time.monotonic(), READ_TIMEOUT_S)
            if timeout_s <= 0:
                raise ClaimError("no time left before the kubelet call's deadline to read the ResourceClaim; "
                                 "the kubelet retries")
        try:
            claim = self.api.get_claim(ref.namespace, ref.name, timeout_s)
        except ApiError as exc:
            if exc.status == 404:
                raise ClaimError("ResourceClaim not found") from None
            raise ClaimError(f"cannot read the ResourceClaim: {exc}") from None
        if deadline is not None and time.monotonic() >= deadline:
            raise ClaimError("the ResourceClaim was read only after the kubelet call's deadline; not prepared, "
                             "the kubelet retries")
        return claim

    def _prepare_one(self, ref: ClaimRef, deadline: float | None = None) -> list[PreparedDevice]:
        validate_ref(ref)
        rec = self.store.load().claims.get(ref.uid)
        if rec is not None and rec.completed:
            with self.lock.held():
                rec = self.store.load().claims.get(ref.uid)
                if rec is not None and rec.completed and not rec.incomplete:
                    self.ensure_spec(rec)
                    return rec.devices
        claim = self._read_claim(ref, deadline)
        if rec is not None and rec.incomplete:
            with self.lock.held():
                cp = self.store.load()
                rec = cp.claims.get(ref.uid)
                if rec is not None and rec.incomplete:  # rebuilt from its CDI spec: answer as the first prepare did
                    self.complete(rec, claim)
                    self.store.save(cp)
                if rec is not None and rec.completed:
                    self.ensure_spec(rec)
                    return rec.devices
        planned = self.plan(ref, claim)
        self._release_gone_reservations(ref, planned)
        return self._commit_grouped(ref, planned)

    def _commit_grouped(self, ref: ClaimRef, planned: list[PlannedDevice]) -> list[PreparedDevice]:
        """Commit under the node lock, together with the prepares that wait for it (group commit).

        A burst of claims (a Job's pods, one kubelet call each) would otherwise pay one fsynced checkpoint write
        per claim in a row. Whoever holds the lock commits every queued claim and writes the checkpoint once;
        each answer still comes only after its PrepareCompleted record is on disk.
        """
        mine = _Pending(ref, planned)
        with self._queue_lock:
            self._queue.append(mine)
        try:
            with self.lock.held():
                if not mine.done.is_set():
                    with self._queue_lock:
                        batch, self._queue = self._queue, []
                    self._commit_batch(batch)
        except LockTimeout:
            with self._queue_lock:
                if mine in self._queue:  # not committed: the kubelet's retry starts afresh
                    self._queue.remove(mine)
                    raise
            mine.done.wait()  # taken by a batch meanwhile: its outcome is this call's answer
        if mine.error is not None:
            raise mine.error
        return mine.result

    def _release_gone_reservations(self, ref: ClaimRef, planned: list[PlannedDevice]) -> None:
        """A device held by a claim that never completed here (a reservation after a lost checkpoint, a crashed
        prepare) whose ResourceClaim is gone or deallocated: release that record now instead of refusing this
        claim until the next reconcile pass. Completed claims are never released here (the kubelet has not
        unprepared them: a real double allocation, refused by commit)."""
        cp = self.store.load()  # a hint only: commit re-checks every owner under the lock
        owners = {o.uid: o for p in planned for o in cp.device_holders(p.device_name, ref.uid)
                  if not o.completed and o.namespace and o.name}
        for owner in owners.values():
            try:
                other = self.api.get_claim(owner.namespace, owner.name)
            except ApiError as exc:
                if exc.status != 404:
                    continue  # in doubt: keep it, commit refuses, the kubelet retries
                other = None
            reason = self.orphan_reason(owner, other)
            if reason is None:
                continue
            with self.lock.held():
                current = self.store.load().claims.get(owner.uid)
                if current is not None and not current.completed:
                    self.release(owner.uid)
                    log.info("released a reservation", extra={"claim": owner.uid, "reason": reason})

    def orphan_reason(self, rec: ClaimRecord, claim: dict | None) -> str | None:
        """Why a record's claim no longer needs its devices on this node (None: it still does)."""
        if claim is None:
            return "the ResourceClaim no longer exists"
        if (claim.get("metadata") or {}).get("uid") != rec.uid:
            return "the ResourceClaim was re-created with another UID"
        if not (claim.get("status") or {}).get("allocation"):
            return "the ResourceClaim is no longer allocated"
        if not self._our_results(claim):
            return f"the ResourceClaim is no longer allocated to {self.driver} on this node"
        return None

    def _our_results(self, claim: dict) -> list[dict]:
        """The allocation's results of this driver on this node."""
        allocation = (claim.get("status") or {}).get("allocation") or {}
        return [r for r in (allocation.get("devices") or {}).get("results") or []
                if isinstance(r, dict) and r.get("driver") == self.driver and r.get("pool") == self.node_name]

    def complete(self, rec: ClaimRecord, claim: dict) -> None:
        """Fill in a record rebuilt from its CDI spec from the API's claim (caller holds the node lock).

        Namespace and name, each device's request name, the requested settings (the allocation's configs) and
        the applied ones (applied again: idempotent, the device still has them), exactly as the first prepare
        recorded them. Raises ClaimError when the claim no longer matches the spec (re-created or allocated
        elsewhere): the record stays incomplete, its devices reserved, and the reconciler releases it.
        """
        meta = claim.get("metadata") or {}
        if meta.get("uid") != rec.uid:
            raise ClaimError(f"the ResourceClaim now has UID {meta.get('uid')}: it was deleted and re-created")
        results = self._our_results(claim)
        request_of = {str(r.get("device")): str(r.get("request", "")) for r in results}
        devices = rec.devices or [PreparedDevice([], self.node_name, name,
                                                 [cdi_mod.qualified_name(self.driver, rec.uid, name)])
                                  for name in request_of]  # an unreadable spec: the allocation's devices
        missing = [d.device_name for d in devices if d.device_name not in request_of]
        if missing or not devices:
            raise ClaimError(f"the claim's allocation no longer names device(s) {', '.join(missing)} of its CDI "
                             "spec on this node")
        configs = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("config") or []
        settings = settings_per_request(self.family, self.driver, configs, sorted(set(request_of.values())))
        pairs = []
        for d in devices:
            discovered, _ = self.inventory.get(d.device_name)
            if discovered is None:
                raise ClaimError(f"device {d.device_name} is no longer present on node {self.node_name}")
            pairs.append((discovered.device, settings[request_of[d.device_name]]))
        _, applied = self.setup.apply(pairs)
        for d in devices:
            d.request_names = [request_of[d.device_name].split("/", 1)[0]]
        rec.namespace, rec.name, rec.devices = str(meta.get("namespace", "")), str(meta.get("name", "")), devices
        admin = _admin_only_devices([(str(r.get("device")), bool(r.get("adminAccess"))) for r in results])
        inherited = rec.settings.get("inherited")
        rec.settings = {"requested": {d.device_name: settings[request_of[d.device_name]].to_json() for d in devices},
                        "applied": applied, **({"adminAccess": admin} if admin else {}),
                        **({"inherited": inherited} if inherited else {})}
        rec.cdi_spec = self.cdi.path(rec.uid).name
        rec.incomplete = False

    def reserve(self, cp: Checkpoint, ref: ClaimRef, claim: dict) -> bool:
        """Record the devices of a claim allocated here that has no record (lost with a corrupt checkpoint) as
        PrepareStarted: reserved against a second allocation, nothing applied, no CDI spec (caller holds the
        lock). False when the claim has no device of this driver on this node."""
        devices = [PreparedDevice([str(r.get("request", "")).split("/", 1)[0]], self.node_name, str(r.get("device")),
                                  [cdi_mod.qualified_name(self.driver, ref.uid, str(r.get("device")))])
                   for r in self._our_results(claim)]
        if not devices:
            return False
        admin = _admin_only_devices([(str(r.get("device")), bool(r.get("adminAccess")))
                                     for r in self._our_results(claim)])
        cp.claims[ref.uid] = ClaimRecord(ref.uid, ref.namespace, ref.name, PREPARE_STARTED, devices, "",
                                         {"adminAccess": admin} if admin else {})
        return True

    def plan(self, ref: ClaimRef, claim: dict) -> list[PlannedDevice]:
        """Check the claim against this node and driver and decode its configs (no side effects)."""
        meta = claim.get("metadata") or {}
        if meta.get("uid") != ref.uid:
            raise ClaimError(f"the ResourceClaim now has UID {meta.get('uid')}: it was deleted and re-created")
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            raise ClaimError("the ResourceClaim is not allocated")
        names = _node_selector_names(allocation.get("nodeSelector") or {})
        if names is not None and self.node_name not in names:
            raise ClaimError(f"allocated to node {', '.join(sorted(names))[:200]}, not to this node {self.node_name}")
        devices = (allocation.get("devices") or {})
        results = [r for r in devices.get("results") or [] if isinstance(r, dict) and r.get("driver") == self.driver]
        if not results:
            raise ClaimError(f"the allocation has no device of driver {self.driver}")
        requests = sorted({str(r.get("request", "")) for r in results})
        settings = settings_per_request(self.family, self.driver, devices.get("config") or [], requests,
                                        self._device_types(results))
        planned = []
        for r in results:
            pool, name = r.get("pool"), r.get("device")
            if pool != self.node_name:
                raise ClaimError(f"device {str(name)[:64]} is from pool {str(pool)[:64]}: allocated to another node "
                                 f"(this node's pool is {self.node_name})")
            if not isinstance(name, str) or not DNS_LABEL_RE.match(name):
                raise ClaimError(f"device name {str(name)[:80]!r} is not a valid device name")
            discovered, (healthy, reason) = self.inventory.get(name)
            if discovered is None:
                raise ClaimError(f"device {name} does not exist on node {self.node_name}")
            if not healthy:
                raise ClaimError(f"device {name} is unhealthy ({reason}); it was withdrawn from the ResourceSlice")
            planned.append(PlannedDevice(str(r.get("request", "")), name, bool(r.get("adminAccess")),
                                         settings[str(r.get("request", ""))]))
        seen = [p.device_name for p in planned if not p.admin_access]
        if len(seen) != len(set(seen)):
            raise ClaimError("the allocation names the same device twice")
        self._check_device_nodes(planned)
        return planned

    def _device_types(self, results: list[dict]) -> dict[str, set[str]]:
        """Request -> `type` attributes of its devices here (a GpuConfig must not configure a MIG device)."""
        types: dict[str, set[str]] = {}
        for r in results:
            discovered, _ = self.inventory.get(str(r.get("device", "")))
            if discovered is not None and "type" in discovered.device.attributes:
                types.setdefault(str(r.get("request", "")), set()).add(str(discovered.device.attributes["type"]))
        return types

    def _commit_batch(self, batch: list[_Pending]) -> None:
        """Commit queued prepares (caller holds the node lock): one durable checkpoint write for all of them.
        Every entry ends done, with a result or an error (also when the checkpoint cannot be read or written)."""
        try:
            cp = self.store.load()
            written, changed = [], False
            for entry in batch:
                try:
                    entry.result, wrote = self._commit_one(cp, entry.ref, entry.planned)
                    written.append(entry)
                    changed = changed or wrote
                except Exception as exc:  # noqa: BLE001 - one claim's failure is that claim's answer only
                    entry.error = exc
            if changed:
                self.store.save(cp)  # Completed is fsynced before any of these kubelet calls hears of it
            self.metrics.prepared_claims.labels(self.driver).set(len(cp.claims))
        except Exception as exc:  # noqa: BLE001 - the checkpoint: every claim of the batch gets the error
            for entry in batch:
                if entry.error is None:
                    entry.error, entry.result = exc, None
        finally:
            for entry in batch:
                entry.done.set()

    def _commit_one(self, cp: Checkpoint, ref: ClaimRef,
                    planned: list[PlannedDevice]) -> tuple[list[PreparedDevice], bool]:
        """(devices, whether the checkpoint must be written)."""
        rec = cp.claims.get(ref.uid)
        if rec is not None and rec.completed and not rec.incomplete:  # prepared meanwhile (thread or process)
            self.ensure_spec(rec)
            return rec.devices, False
        for p in planned:
            # Only adminAccess allocations may overlap (as in the NVIDIA driver and the scheduler, which does not
            # count them as using a device).
            owner = next((h for h in cp.device_holders(p.device_name, ref.uid) if not _admin_only(h, p.device_name)), None)
            if owner is not None and not p.admin_access:
                raise ClaimError(f"device {p.device_name} is already prepared for claim {owner.ref()}; refusing a "
                                 "double allocation")
        self._check_settings_owner(cp, ref, planned)
        prepared = [PreparedDevice([p.request.split("/", 1)[0]], self.node_name, p.device_name,
                                   [cdi_mod.qualified_name(self.driver, ref.uid, p.device_name)]) for p in planned]
        requested = {p.device_name: p.settings.to_json() for p in planned}
        settings: dict = {"requested": requested}
        if admin := _admin_only_devices([(p.device_name, p.admin_access) for p in planned]):
            settings["adminAccess"] = admin
        previous = cp.claims.get(ref.uid)  # a prepare that failed before: it may hold a revert handed to it
        if previous is not None and previous.settings.get("inherited"):
            settings["inherited"] = previous.settings["inherited"]
        rec = ClaimRecord(ref.uid, ref.namespace, ref.name, PREPARE_STARTED, prepared, "", settings)
        cp.claims[ref.uid] = rec
        crashpoints.reached("prepare.started")
        if self.setup.changes_hardware(p.settings for p in planned):
            # A crash after touching the device must leave a record that reverts it. It need not survive power
            # loss (a reboot resets the device, and the kubelet was never told "prepared"): no fsync.
            self.store.save(cp, durable=False)
        # Without hardware changes a crash before the Completed write leaves at most a CDI spec without a
        # record: nothing was promised to the kubelet, its retry rewrites the spec, the reconciler removes it
        # if no retry comes. Completed is fsynced (by the caller, once per batch) before the kubelet hears of it.
        self._apply(rec)
        crashpoints.reached("prepare.spec_written")
        rec.state = PREPARE_COMPLETED
        return prepared, True

    def _check_settings_owner(self, cp: Checkpoint, ref: ClaimRef, planned: list[PlannedDevice]) -> None:
        """A device-changing setting only from a request without adminAccess, on a device no other claim holds
        (the module's rule): otherwise it would change the device under another claim's workload."""
        for p in planned:
            changes = hardware_changes(p.settings, self.family.hardware_settings)
            if not changes:
                continue
            holders = cp.device_holders(p.device_name, ref.uid)
            if p.admin_access:
                in_use = f" (device {p.device_name} is in use by claim {holders[0].ref()})" if holders else ""
                raise ClaimError(admin_access_refusal(p.request, p.device_name, changes) + in_use)
            if holders:
                other = holders[0]
                how = " with adminAccess" if _admin_only(other, p.device_name) else ""
                raise ClaimError(f"request {p.request} sets {describe(changes)} on device {p.device_name}, which "
                                 f"claim {other.ref()} also holds{how}: a device's settings belong to the one claim "
                                 "holding it, and this would change them under that claim's workload; retry once "
                                 "that claim is unprepared (its pods gone), or remove the setting from this claim's "
                                 "config")

    def _apply(self, rec: ClaimRecord) -> None:
        """Apply the record's device settings and write its CDI spec (also used after a reboot)."""
        pairs, edits = [], []
        visible: dict[str, list[str]] = {}  # *_VISIBLE_DEVICES: one value per device, joined for the claim
        for d in rec.devices:
            discovered, _ = self.inventory.get(d.device_name)
            if discovered is None:
                raise ClaimError(f"device {d.device_name} is no longer present on node {self.node_name}")
            settings = self._requested(rec, d.device_name)
            pairs.append((discovered.device, settings))
            device_env = {}
            for key, value in discovered.env.items():
                if key.endswith("_VISIBLE_DEVICES"):
                    visible.setdefault(key, []).append(value)
                else:
                    device_env[key] = value
            edits.append(cdi_mod.DeviceEdits(d.device_name, list(discovered.device_nodes), device_env,
                                             hooks=list(discovered.hooks)))
        env, applied = self.setup.apply(pairs)
        env = {**{k: ",".join(v) for k, v in visible.items()}, **env}
        rec.settings["applied"] = applied
        spec = cdi_mod.build_spec(self.driver, rec.uid, edits, list(self.inventory.common_device_nodes), env,
                                  self.inventory.common_edits, rec.namespace, rec.name)
        self.cdi.write(rec.uid, spec)
        rec.cdi_spec = self.cdi.path(rec.uid).name

    def _check_device_nodes(self, planned: list[PlannedDevice]) -> None:
        """One stat per device node of this claim (and the claim-wide ones): nothing else of the host tree."""
        if self.host_root is None:
            return
        root = str(self.host_root).rstrip("/")
        owners = [(p.device_name, self.inventory.get(p.device_name)[0].device_nodes) for p in planned]
        for owner, paths in [*owners, ("the claim", self.inventory.common_device_nodes)]:
            for path in paths:
                if not os.path.exists(root + "/" + path.lstrip("/")):
                    raise ClaimError(f"device node {path} of {owner} is missing on node {self.node_name} "
                                     "(device driver not loaded?); the kubelet retries once it is back")

    def ensure_spec(self, rec: ClaimRecord) -> bool:
        """Rewrite a prepared claim's CDI spec unless it is there and names the claim's devices (a tmpfs after a
        reboot, a wiped directory, a torn or overwritten file); True when it was rewritten."""
        problem = self.cdi.problem(rec.uid, [d.device_name for d in rec.devices])
        if problem is None:
            return False
        self._apply(rec)
        self.store.save(self.store.load())
        self.metrics.cdi_rewritten.labels(self.driver).inc()
        self.events.normal("CDISpecRewritten", f"{self.driver}: CDI spec of prepared claim {rec.ref()} was {problem} "
                                               "and has been rewritten")
        return True

    # ----- unprepare
    def unprepare(self, refs: list[ClaimRef]) -> dict[str, str]:
        out: dict[str, str] = {}
        for ref in refs:
            if ref.uid in out:
                continue
            start = time.perf_counter()
            try:
                if not UID_RE.match(ref.uid or ""):
                    raise ClaimError(f"claim uid {ref.uid[:80]!r} is not a Kubernetes UID")
                with self.lock.held():
                    self.release(ref.uid)
                out[ref.uid] = ""
                self.metrics.unprepare.labels(self.driver, "ok").inc()
                log.info("unprepared", extra={"claim": ref.uid, "claimRef": str(ref)})
            except Exception as exc:  # noqa: BLE001
                if isinstance(exc, CheckpointCorrupt):
                    self.on_corrupt()
                out[ref.uid] = f"{self.driver}: claim {ref}: {exc}"
                self.metrics.unprepare.labels(self.driver, "error").inc()
                log.warning("unprepare failed", extra={"claim": ref.uid, "error": str(exc)})
            self.metrics.unprepare_seconds.labels(self.driver).observe(time.perf_counter() - start)
        return out

    def release(self, uid: str) -> ClaimRecord | None:
        """Undo a claim (caller holds the node lock): settings, spec, then the record; idempotent."""
        cp = self.store.load()
        rec = cp.claims.get(uid)
        if rec is not None:
            self._revert_settings(cp, rec)
        self.cdi.remove(uid)  # also when unrecorded: a crash may have left the spec behind
        crashpoints.reached("unprepare.spec_removed")
        if rec is not None:
            del cp.claims[uid]
            self.store.save(cp)
        self.metrics.prepared_claims.labels(self.driver).set(len(cp.claims))
        return rec

    def _revert_settings(self, cp: Checkpoint, rec: ClaimRecord) -> None:
        """Revert what the claim applied (and the reverts handed to it) on the devices no other claim holds.

        On a device still held, nothing changes under the remaining holder: its revert goes to that holder (the
        one that asked for device settings there, if any), to be done when the last holder leaves. A holder that
        asked for device settings gets them again: they can differ from the leaving claim's only in a checkpoint
        written before this rule (an adminAccess claim that changed them).
        """
        heirs: dict[str, ClaimRecord] = {}
        for d in rec.devices:
            holders = cp.device_holders(d.device_name, rec.uid)
            if holders:
                heirs[d.device_name] = next((h for h in holders if self._device_changes(h, d.device_name)), holders[0])
        handed: dict[str, list[dict]] = {}
        for applied in [rec.settings.get("applied") or {}, *(rec.settings.get("inherited") or [])]:
            for device_name, piece in self.setup.revert(applied, keep=heirs.keys()).items():
                handed.setdefault(device_name, []).append(piece)
        for device_name, pieces in handed.items():
            heir = heirs[device_name]
            heir.settings.setdefault("inherited", []).extend(pieces)
            discovered, _ = self.inventory.get(device_name)
            if heir.completed and discovered is not None and self._device_changes(heir, device_name):
                self.setup.apply([(discovered.device, self._requested(heir, device_name))])

    @staticmethod
    def _requested(rec: ClaimRecord, device_name: str) -> DeviceSettings:
        return DeviceSettings.from_json(rec.settings.get("requested", {}).get(device_name, {}))

    def _device_changes(self, rec: ClaimRecord, device_name: str) -> dict[str, object]:
        return hardware_changes(self._requested(rec, device_name), self.family.hardware_settings)

    # ----- after a reboot or a lost checkpoint
    def reapply_all(self, cp: Checkpoint, boot_id: str) -> int:
        """Rewrite every completed claim's CDI spec and re-apply its settings (caller holds the lock)."""
        count = 0
        for rec in cp.claims.values():
            if rec.completed:
                try:
                    self._apply(rec)
                    count += 1
                except (ClaimError, SetupError, WriteError) as exc:  # the reconciler writes a missing spec again
                    log.error("could not re-apply claim after reboot", extra={"claim": rec.uid, "error": str(exc)})
        cp.boot_id = boot_id
        self.store.save(cp)
        return count

