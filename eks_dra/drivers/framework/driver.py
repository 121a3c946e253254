"""One DRA driver process: the parts of this framework and one DeviceFamily put together, started and stopped
in order.

Start: the gRPC servers (main.py starts them before importing anything heavy: registration answers at once,
DRA calls wait), checkpoint (corrupt or lost -> kept aside + Warning Event + rebuilt; newer format -> refuse,
exit 3), first discovery, then DRA calls are served; liveness and metrics endpoints, then the background
loops: inventory/health poll (every `health_interval_s` <= 2 s), slice publisher, reconciler (first pass 1 s
after start). Stop (SIGTERM): stop the loops, drain the gRPC servers, remove our own sockets. Slices, the
readiness taint and the checkpoint are left as they are, so a rolling update or restart disrupts nothing.
"""

from __future__ import annotations

import logging
import threading
import time

from . import crashpoints
from .cdi import CdiDir
from .cdi import claim_of as cdi_claim_of
from .checkpoint import (
    PREPARE_COMPLETED,
    Checkpoint,
    CheckpointCorrupt,
    CheckpointStore,
    CheckpointTooNew,
    ClaimRecord,
    PreparedDevice,
)
from .device_taints import taint_for
from .driver_config import DriverConfig
from .events import EventRecorder
from .family import DeviceFamily
from .hosttree import read_boot_id
from .inventory import HealthSource, InventorySource, InventoryView
from .kube import ApiError
from .lock import NodeLock
from .metrics import DriverMetrics
from .plugin import PluginServers
from .publisher import SlicePublisher
from .readiness import ReadinessTaint
from .reconciler import Reconciler
from .safety import device_plugin_conflict
from .state import ClaimError, ClaimRef, DeviceState, validate_ref

log = logging.getLogger(__name__)


class FatalError(Exception):
    """The driver must not run (exit code 3); the message says why and what to do."""


class Driver:
    def __init__(self, cfg: DriverConfig, family: DeviceFamily, api, inventory_source: InventorySource,
                 health_source: HealthSource | None = None, servers: PluginServers | None = None) -> None:
        """`family`: the device family cfg.family names; `servers`: already serving (main.py starts them before
        the heavy imports); None: made here."""
        if family.name != cfg.family:
            raise ValueError(f"DriverConfig.family is {cfg.family!r} but the device family given is {family.name!r}")
        self.cfg = cfg
        self.family = family
        self.api = api
        self.started_at = time.monotonic()
        self.metrics = DriverMetrics(cfg.driver_name)
        self.events = EventRecorder(api, cfg.driver_name, cfg.node_name)
        taint = ((lambda reason: taint_for(cfg.driver_name, family.taint_effects, reason).to_api())
                 if cfg.device_taints else None)
        self.inventory = InventoryView(inventory_source, health_source, taint)
        state_dir = cfg.state_path
        state_dir.mkdir(parents=True, exist_ok=True)
        self.lock = NodeLock(state_dir, cfg.lock_timeout_s)
        self.store = CheckpointStore(state_dir, cfg.driver_name, cfg.node_name, durable=cfg.durable)
        self.cdi = CdiDir(cfg.cdi_root, cfg.driver_name)
        self.state = DeviceState(driver=cfg.driver_name, family=family, node_name=cfg.node_name, api=api,
                                 inventory=self.inventory, store=self.store, cdi=self.cdi,
                                 setup=family.device_setup(cfg.host_root, cfg.family_host, self._tool_unavailable),
                                 lock=self.lock,
                                 metrics=self.metrics,
                                 events=self.events, host_root=cfg.host_root)
        self.servers = servers or PluginServers.for_config(cfg)
        self.health_stream = self.servers.health_stream
        if self.health_stream is not None:
            self.health_stream.inventory = self.inventory
        self.readiness = ReadinessTaint(api, cfg.driver_name, cfg.node_name, self.events)
        self.publisher = SlicePublisher(api, cfg.driver_name, cfg.node_name, self.metrics,
                                        resync_s=cfg.resync_interval_s, on_synced=self._on_synced)
        self.publisher.refresh_owner = self._node_uid
        self.reconciler = Reconciler(self.state, cfg.reconcile_interval_s)
        self._corrupt_seen = threading.Event()
        self.state.on_corrupt = self._corrupt_seen.set
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pending_reapply = False
        self._pending_rebuild = False
        self._liveness = None
        self._metrics_server = None
        self.health_port = -1

    def _tool_unavailable(self, tool: str, message: str) -> None:
        # The metric keeps its first name (eks_dra_gpu_tool_unavailable_total): dashboards and alerts use it.
        self.metrics.gpu_tool_unavailable.labels(self.cfg.driver_name, tool).inc()
        self.events.warning(self.family.tool_unavailable_reason, f"{self.cfg.driver_name}: {message}")

    # ----- start-up
    def start(self) -> None:
        self._load_checkpoint()
        try:
            self._poll_inventory(rediscover=True)
        except Exception:  # noqa: BLE001 - the poll loop retries; registration must not wait for devices
            log.exception("first device discovery failed; retrying in the background")
        if not self.servers.started:
            self.servers.start()
        self.servers.attach(self.state)
        if self.cfg.health_port >= 0:
            from .health import serve_liveness

            self._liveness = serve_liveness(
                self.cfg.driver_name, str(self.servers.reg_path), str(self.servers.dra_path), self.cfg.health_port,
                self.cfg.health_address)
            self.health_port = self._liveness.port
        if self.cfg.metrics_port >= 0:
            self._metrics_server = self.metrics.serve(self.cfg.metrics_port)
        for target, name in ((self._poll_loop, "inventory"), (self._node_loop, "node")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        self.publisher.start()
        self.reconciler.start()
        log.info("driver started", extra={"durationMs": round((time.monotonic() - self.started_at) * 1000, 1)})

    def _load_checkpoint(self) -> None:
        boot_id = read_boot_id(self.cfg.host_root)
        with self.lock.held():
            # Under the lock: during a rolling update the other plugin pod may be in the middle of a write.
            self.store.remove_stale_temporaries()
            self.cdi.remove_stale_temporaries()
            try:
                cp = self.store.load()
            except CheckpointTooNew as exc:
                self.events.warning("CheckpointTooNew", f"{self.cfg.driver_name}: {exc}")
                self.events.flush(3)
                raise FatalError(str(exc)) from None
            except CheckpointCorrupt as exc:
                self._recover(exc, boot_id)
                return
            if cp.version_read == 0 and self.cdi.claim_uids():
                # Claim specs but no checkpoint: the file was lost (deleted, or an older driver crashed in the
                # middle of its recovery), never a first start: the specs' claims are still prepared.
                self._recover(None, boot_id)
                return
            if cp.version_read == 0:  # first start on this node
                cp.boot_id = boot_id
                self.store.save(cp)
            elif cp.boot_id != boot_id:
                # Rebooted (or a version-1 file without a boot id): CDI specs and device settings are not to be
                # trusted; re-applied as soon as the devices are discovered.
                self._pending_reapply = bool(cp.claims) or cp.boot_id is None
                if not cp.claims:
                    cp.boot_id = boot_id
                    self.store.save(cp)
            elif cp.version_read < 2:
                self.store.save(cp)  # upgrade the file format in place
            # A recovery that crashed before every rebuilt record was completed: finish it.
            self._pending_rebuild = any(rec.incomplete for rec in cp.claims.values())
        self.metrics.prepared_claims.labels(self.cfg.driver_name).set(len(cp.claims))

    def _recover(self, exc: CheckpointCorrupt | None, boot_id: str) -> None:
        """Rebuild the checkpoint from the CDI specs (caller holds the lock); the API fills in the rest later.

        `exc` None: the checkpoint is missing. Each step leaves a state from which a restart recovers again:
        the corrupt file stays in place until the rebuilt one atomically replaces it (kept under a second name).
        """
        cp = self._rebuild_from_cdi(boot_id)
        rebuilt = f"state rebuilt from {len(cp.claims)} CDI specs and the API"
        if exc is None:
            self.store.save(cp)
            self.events.warning("CheckpointLost", f"{self.cfg.driver_name}: {self.store.path} is missing but "
                                                  f"{len(cp.claims)} claim CDI specs exist; {rebuilt}")
        else:
            kept = self.store.replace_corrupt(cp)
            self.metrics.checkpoint_corrupt.labels(self.cfg.driver_name).inc()
            self.events.warning("CheckpointCorrupt", f"{self.cfg.driver_name}: {exc}; moved aside to {kept}; "
                                                     f"{rebuilt}")
        crashpoints.reached("recovery.replaced")
        self._pending_rebuild = True

    def _recover_if_corrupt(self) -> None:
        """The checkpoint went bad while running (disk error, someone's editor): same recovery as at start."""
        self._corrupt_seen.clear()
        with self.lock.held():
            try:
                self.store.load()
            except CheckpointCorrupt as exc:
                self._recover(exc, read_boot_id(self.cfg.host_root))

    def _rebuild_from_cdi(self, boot_id: str) -> Checkpoint:
        """Incomplete records for the claim specs in the CDI directory: devices, CDI ids and the claim's namespace
        and name (spec annotations; none in an older driver's spec), nothing else yet.

        Their devices stay reserved from this moment; request names and settings come from the API claim
        (reconciler pass, or the claim's next prepare, which answers only once that is done).
        """
        cp = Checkpoint(boot_id=boot_id)
        for uid in sorted(self.cdi.claim_uids()):
            spec = self.cdi.read(uid) or {}
            devices = []
            for d in spec.get("devices") or []:
                name = str(d.get("name", ""))
                if name.startswith(uid + "-"):
                    device = name[len(uid) + 1:]
                    devices.append(PreparedDevice([], self.cfg.node_name, device,
                                                  [f"{spec.get('kind')}={name}"]))
            namespace, name = cdi_claim_of(spec)
            try:
                validate_ref(ClaimRef(namespace, uid, name))
            except ClaimError:  # no annotations (an older driver's spec) or edited ones: named from the pods
                namespace = name = ""
            cp.claims[uid] = ClaimRecord(uid, namespace, name, PREPARE_COMPLETED, devices, self.cdi.path(uid).name,
                                         {}, incomplete=True)
        return cp

    def _repair_after_start(self) -> None:
        """Once the devices are known: re-apply after a reboot, re-prepare claims after a lost checkpoint."""
        if self._pending_reapply:
            with self.lock.held():
                cp = self.store.load()
                count = self.state.reapply_all(cp, read_boot_id(self.cfg.host_root))
            self._pending_reapply = False
            self.metrics.cdi_rewritten.labels(self.cfg.driver_name).inc(count)
            self.events.normal("BootChanged", f"{self.cfg.driver_name}: new boot id; re-applied CDI specs and "
                                              f"device settings of {count} prepared claims")
        if self._pending_rebuild:
            try:
                self._rebuild_from_api()
                self._pending_rebuild = False
            except ApiError as exc:
                log.warning("rebuild from the API postponed", extra={"error": str(exc)})

    def _rebuild_from_api(self) -> None:
        """After a lost checkpoint: complete the records rebuilt from CDI specs and reserve the devices of claims
        that pods bound to this node use, allocated here, that have neither a record nor a spec (one reconcile
        pass: the claims are read one by one, by name; the cluster's claims are never listed).

        Those are not prepared again: without a spec the kubelet either released the claim already (its pod
        ended; `reservedFor` lags behind) or never got "prepared" back, and in both cases only the kubelet knows;
        it retries a prepare it still needs (and re-prepares everything after its own restart). The reservation
        keeps a forged or racing allocation of the same devices out until then, costs nothing (the scheduler
        does not hand out allocated devices) and goes with the claim's deallocation at the next reconcile pass.
        """
        counts = self.reconciler.run_once(reserve_unrecorded=True)  # also completes and drops orphans
        self.events.normal("StateRebuilt", f"{self.cfg.driver_name}: {len(self.store.load().claims)} prepared "
                                           f"claims after rebuild ({counts['completed']} completed from the API, "
                                           f"{counts['reserved']} claims without a CDI spec reserved)")

    # ----- loops
    def _poll_inventory(self, rediscover: bool) -> None:
        was_ready = self.inventory.ready
        changed, transitions = self.inventory.refresh(rediscover)
        if was_ready and not self.inventory.ready:
            self.events.warning("InventoryNotReady", f"{self.cfg.driver_name}: {self.inventory.reason}; node "
                                                     "re-tainted, published slices left as they are")
        for healthy in (False, True):
            changes = [t for t in transitions if t.healthy is healthy]
            if not changes:
                continue
            self.metrics.health_changes.labels(self.cfg.driver_name, "healthy" if healthy else "unhealthy").inc(
                len(changes))
            # one Event per device, or one for the lot when many change at once (a driver reload, a switch)
            groups = [changes] if len(changes) > 3 else [[t] for t in changes]
            for group in groups:
                names = ", ".join(t.device for t in group)
                if healthy:
                    self.events.normal("DeviceHealthy", f"{self.cfg.driver_name}: device {names} healthy again; "
                                                        "published")
                else:
                    what = "tainted in" if self.cfg.device_taints else "withdrawn from"
                    self.events.warning("DeviceUnhealthy", f"{self.cfg.driver_name}: device {names} {what} "
                                                           f"the ResourceSlice: {group[0].reason}"
                                                           + (f" (and {len(group) - 1} more)" if len(group) > 1 else ""))
        self.metrics.unhealthy_devices.labels(self.cfg.driver_name).set(len(self.inventory.unhealthy()))
        if changed or transitions:
            self.publisher.set_devices(self.inventory.published_devices())
            if self.health_stream:
                self.health_stream.notify()
        if self.inventory.ready and (self._pending_reapply or self._pending_rebuild):
            self._repair_after_start()

    def _poll_loop(self) -> None:
        last_discovery = time.monotonic()
        while not self._stop.wait(self.cfg.health_interval_s):
            if self._corrupt_seen.is_set():
                try:
                    self._recover_if_corrupt()
                except Exception:  # noqa: BLE001
                    log.exception("checkpoint recovery failed")
            rediscover = (not self.inventory.ready
                          or time.monotonic() - last_discovery >= self.cfg.rediscover_interval_s)
            try:
                self._poll_inventory(rediscover)
            except Exception:  # noqa: BLE001 - discovery must never stop the loop
                log.exception("inventory poll failed")
            if rediscover:
                last_discovery = time.monotonic()

    def _node_loop(self) -> None:
        """The Node: its UID (slice owner), the device-plugin safety check; every resync interval."""
        delay = 0.2
        while not self._stop.is_set():
            try:
                node = self.api.get_node(self.cfg.node_name)
                self.events.node_uid = self.publisher.node_uid = node["metadata"]["uid"]
                conflict = device_plugin_conflict(self.family, node)
                if conflict != (self.publisher.blocked or None):
                    self.publisher.blocked = conflict or ""
                    if conflict:
                        self.events.warning("DevicePluginConflict", f"{self.cfg.driver_name}: {conflict}")
                self.publisher.kick()
                delay = self.cfg.resync_interval_s
            except ApiError as exc:
                log.warning("cannot read the Node", extra={"error": str(exc)})
                delay = min(delay * 2, 10.0)
            self._stop.wait(delay)

    def _node_uid(self) -> str:
        uid = self.api.get_node(self.cfg.node_name)["metadata"]["uid"]
        self.events.node_uid = uid
        return uid

    def _on_synced(self, in_sync: bool) -> None:
        ready = (in_sync and self.inventory.ready and not self.publisher.blocked
                 and any(ok for ok in self.inventory.snapshot().values()))
        if self.readiness.ready is ready:
            return
        try:
            self.readiness.ensure(ready)
        except ApiError as exc:
            log.warning("cannot update the readiness taint", extra={"error": str(exc)})

    # ----- shutdown
    def stop(self, grace_s: float = 5.0) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self.publisher.stop()
        self.reconciler.stop()
        self.servers.stop(grace_s)
        if self._liveness is not None:
            self._liveness.stop()
        if self._metrics_server is not None:
            self._metrics_server.stop()
        self.events.flush(2)
        self.lock.close()
        log.info("driver stopped")
