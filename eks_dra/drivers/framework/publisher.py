"""ResourceSlices of one driver on one node: publish, watch, put back.

- Pool name = node name (two nodes may have devices of the same name), at most 128 devices per slice,
  deterministic slice names `<node>-<driver>-<i>` (eks_dra.devices.resource_slices), ownerReference to the
  Node (garbage-collected with it), one generation for the whole pool, bumped when the device set changes,
  resourceSliceCount = number of slices.
- The driver's own slices (fieldSelector spec.nodeName + spec.driver) are listed, then watched from the
  list's resourceVersion (no gap in which a delete could be missed); a broken watch resumes from the last
  seen version, a 410 Gone relists; in addition a full resync runs every `resync_s`.
- Writes only when the API differs from the desired state: zero writes while nothing changes. Updates carry
  the observed resourceVersion (optimistic concurrency); a 409 relists. The API being unreachable is
  retried with exponential backoff (0.2 s doubling to 10 s).
- `set_devices(None)` (inventory not ready) publishes nothing and leaves existing slices alone: never an
  empty or partial pool. `blocked` (the family's device plugin is on the node) withdraws our slices.
  `stop()` leaves the slices in place: a rolling update must not withdraw them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from fractions import Fraction

from eks_dra.devices import resource_slices
from eks_dra.devices.model import parse_quantity

from .kube import ApiError

log = logging.getLogger(__name__)
BACKOFF_START_S, BACKOFF_MAX_S = 0.2, 10.0
def quantity_value(text: str) -> Fraction | str:
    """A Kubernetes quantity as a number: the API server canonicalizes ("81920Mi" comes back "80Gi")."""
    try:
        return parse_quantity(str(text))
    except ValueError:
        return str(text)


def _normal_devices(devices: list[dict]) -> list:
    out = []
    for d in devices or []:
        capacity = {k: quantity_value((v or {}).get("value", "")) for k, v in (d.get("capacity") or {}).items()}
        # A taint's timeAdded is the API server's; key, value and effect are ours.
        taints = [(t.get("key"), t.get("value"), t.get("effect")) for t in d.get("taints") or []]
        out.append((d.get("name"), {k: v for k, v in sorted((d.get("attributes") or {}).items())},
                    sorted(capacity.items()), taints))
    return sorted(out, key=lambda t: t[0])


def _spec_key(obj: dict, with_generation: bool = True) -> tuple:
    spec = obj.get("spec") or {}
    pool = spec.get("pool") or {}
    owners = tuple((o.get("kind"), o.get("name"), o.get("uid")) for o in (obj.get("metadata") or {})
                   .get("ownerReferences") or [])
    return (spec.get("driver"), spec.get("nodeName"), pool.get("name"), pool.get("resourceSliceCount"),
            pool.get("generation") if with_generation else None, repr(_normal_devices(spec.get("devices"))), owners)


def _rv(obj: dict) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


class SlicePublisher:
    def __init__(self, api, driver: str, node_name: str, metrics, *, resync_s: float = 30.0,
                 watch_timeout_s: int = 300, on_synced: Callable[[bool], None] | None = None) -> None:
        self.api, self.driver, self.node_name, self.metrics = api, driver, node_name, metrics
        self.resync_s, self.watch_timeout_s = resync_s, watch_timeout_s
        self.on_synced = on_synced  # called with True when the API matches the desired slices
        self.selector = f"spec.nodeName={node_name},spec.driver={driver}"
        self.node_uid = ""
        # Returns the Node's current UID. Called before writing after someone else deleted our slices: the
        # garbage collector does that when the Node was deleted and registered again, and slices owned by
        # the dead UID would be collected again at once (a write storm until the next Node poll).
        self.refresh_owner: Callable[[], str] | None = None
        self._owner_stale = False
        self.blocked = ""  # non-empty: publishing refused (safety), with the reason
        self._devices: list | None = None
        self._observed: dict[str, dict] = {}
        self._seen_rv: dict[str, int] = {}  # newest resourceVersion seen per slice name, deletions included
        self._list_rv = 0  # every name is known at least as of the last list
        self._listed = False
        self._generation = 0
        self._cond = threading.Condition()
        self._dirty = True
        self._stop = threading.Event()
        self.in_sync = threading.Event()
        self.writes = 0
        self._threads: list[threading.Thread] = []

    # ----- inputs
    def set_devices(self, devices: list | None) -> None:
        """The devices to publish (published Device objects), or None while the inventory is not ready."""
        with self._cond:
            self._devices = None if devices is None else list(devices)
            self._dirty = True
            self._cond.notify_all()

    def kick(self) -> None:
        with self._cond:
            self._dirty = True
            self._cond.notify_all()

    def start(self) -> None:
        for target, name in ((self._watch_loop, "slice-watch"), (self._sync_loop, "slice-sync")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self.kick()

    # ----- watch
    def _relist(self) -> str:
        items, rv = self.api.list_slices(self.selector)
        with self._cond:
            self._observed = {i["metadata"]["name"]: i for i in items}
            self._seen_rv = {n: _rv(i) for n, i in self._observed.items()}
            self._list_rv = _rv({"metadata": {"resourceVersion": rv}})
            self._listed = True
            self._dirty = True
            self._cond.notify_all()
        return rv

    def _watch_loop(self) -> None:
        backoff = BACKOFF_START_S
        rv = ""
        while not self._stop.is_set():
            opened = time.monotonic()
            received = 0
            try:
                if not rv:
                    rv = self._relist()
                    opened = time.monotonic()
                for event in self.api.watch_slices(self.selector, rv, self.watch_timeout_s):
                    if self._stop.is_set():
                        return
                    kind, obj = event.get("type"), event.get("object") or {}
                    received += kind != "ERROR"
                    if kind == "ERROR":
                        if obj.get("code") == 410:  # our version was compacted away: relist
                            rv = ""
                            break
                        raise ApiError(int(obj.get("code") or 0), obj.get("message", "watch error"))
                    new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if new_rv:
                        rv = new_rv
                    if kind != "BOOKMARK":
                        self._apply_event(kind, obj)
                failed = False
            except ApiError as exc:
                failed = True
                self.metrics.api_errors.labels(self.driver, "watch_slices").inc()
                log.warning("slice watch failed", extra={"error": str(exc)})
                if exc.status == 410:
                    rv = ""
            except Exception:  # noqa: BLE001 - keep watching whatever happens
                failed = True
                log.exception("slice watch crashed; relisting")
                rv = ""
            if received or time.monotonic() - opened >= 1.0:
                backoff = BACKOFF_START_S  # the watch worked, then ended or broke: resume at once from rv
                continue
            if failed or rv:  # failing, or a server that ends watches at once: back off, do not spin
                self._stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _apply_event(self, kind: str, obj: dict) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return
        with self._cond:
            if _rv(obj) and _rv(obj) < self._seen_rv.get(name, self._list_rv):
                return  # older than what our own write already told us
            self._seen_rv[name] = max(_rv(obj), self._seen_rv.get(name, self._list_rv))
            if kind == "DELETED":
                self._observed.pop(name, None)
                self._owner_stale = True
                log.info("slice deleted by someone else", extra={"slice": name})
            else:
                self._observed[name] = obj
            self._dirty = True
            self._cond.notify_all()

    # ----- sync
    def _sync_loop(self) -> None:
        backoff = BACKOFF_START_S
        last_resync = time.monotonic()
        while not self._stop.is_set():
            with self._cond:
                while not self._dirty and not self._stop.is_set():
                    remaining = self.resync_s - (time.monotonic() - last_resync)
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                self._dirty = False
            if self._stop.is_set():
                return
            try:
                if time.monotonic() - last_resync >= self.resync_s or not self._listed:
                    self._relist()
                    with self._cond:
                        self._dirty = False
                    last_resync = time.monotonic()
                self.sync_once()
                backoff = BACKOFF_START_S
            except ApiError as exc:
                self.metrics.api_errors.labels(self.driver, "sync_slices").inc()
                log.warning("slice sync failed; retrying", extra={"error": str(exc)})
                # Not a reason to re-taint the node: the published slices are still there, only the API is
                # unhappy (outage, conflict); the readiness taint follows the devices, not the API's weather.
                if exc.status == 409:
                    self._listed = False  # someone else wrote: take a fresh list
                self._stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
                self.kick()

    def desired(self) -> list[dict] | None:
        """The slices to publish, or None when nothing may be published (not ready, refused, no Node yet).

        The pool generation is the highest seen (ours or the API's) and goes up by one when the published
        content changes; slices that merely went missing are put back under the same generation.
        """
        with self._cond:
            devices = self._devices
            observed = dict(self._observed)
        if devices is None or self.blocked or not self.node_uid:
            return None
        seen = [int(o["spec"]["pool"].get("generation") or 0) for o in observed.values()]
        # the API's generation when it has our slices (a failed write must not bump it again on retry),
        # else the one we last published (all slices deleted: put them back under the same generation)
        generation = max(max(seen) if seen else self._generation, 1)
        want = resource_slices(self.driver, self.node_name, devices, generation, self.node_uid)
        by_name = {s["metadata"]["name"]: s for s in want}
        changed = any(name not in by_name or _spec_key(o, False) != _spec_key(by_name[name], False)
                      for name, o in observed.items())
        if changed:
            generation += 1
            want = resource_slices(self.driver, self.node_name, devices, generation, self.node_uid)
        self._generation = generation
        return want

    def sync_once(self) -> bool:
        """Make the API match the desired slices; True when they match (no writes when they already do)."""
        if self.blocked:
            self._withdraw()
        self._check_owner()
        want = self.desired()
        if want is None:
            self.in_sync.clear()
            if self.on_synced and self.node_uid:  # without the Node's UID we only wait; that is no loss
                self.on_synced(False)
            return False
        with self._cond:
            observed = dict(self._observed)
        wanted_names = {s["metadata"]["name"] for s in want}
        for s in want:
            name = s["metadata"]["name"]
            o = observed.get(name)
            if o is None:
                created = self.api.create_slice(s)
                self._record_write("create", name, created)
            elif _spec_key(o) != _spec_key(s):
                s["metadata"]["resourceVersion"] = o["metadata"]["resourceVersion"]
                updated = self.api.replace_slice(name, s)
                self._record_write("update", name, updated)
        for name, o in observed.items():
            if name not in wanted_names:
                self._delete(name, o)
        device_count = sum(len(s["spec"]["devices"]) for s in want)
        self.metrics.published_devices.labels(self.driver).set(device_count)
        self.in_sync.set()
        if self.on_synced:
            self.on_synced(True)
        return True

    def _check_owner(self) -> None:
        """Re-read the Node's UID after a foreign deletion; a missing Node raises (404) and is retried."""
        if not (self._owner_stale and self.refresh_owner):
            return
        uid = self.refresh_owner()
        self._owner_stale = False
        if uid and uid != self.node_uid:
            log.info("Node registered again: slices follow its new UID", extra={"node_uid": uid})
            self.node_uid = uid

    def _withdraw(self) -> None:
        """Publishing is refused (another manager owns these devices): take our slices back."""
        with self._cond:
            observed = dict(self._observed)
        for name, o in observed.items():
            self._delete(name, o)
        self.metrics.published_devices.labels(self.driver).set(0)

    def _delete(self, name: str, observed: dict) -> None:
        """Delete one of our slices at the version we saw; already gone is fine."""
        try:
            self.api.delete_slice(name, observed["metadata"].get("resourceVersion"))
        except ApiError as exc:
            if exc.status != 404:
                raise
        self._record_write("delete", name, None)

    def _record_write(self, op: str, name: str, obj: dict | None) -> None:
        self.writes += 1
        self.metrics.slice_writes.labels(self.driver, op).inc()
        log.info(f"slice {op}d", extra={"slice": name, "generation": self._generation})
        with self._cond:
            if obj is None:
                self._observed.pop(name, None)
            elif _rv(obj) >= self._seen_rv.get(name, self._list_rv):  # a watch event may already have superseded it
                self._seen_rv[name] = _rv(obj)
                self._observed[name] = obj
