"""Checkpoint <-> CDI directory <-> API claims, compared every `interval_s`.

The first pass runs `first_pass_s` after start (not a full interval: a driver that restarts often must still
get there). One pass:
1. incomplete records (rebuilt from the CDI directory after a lost checkpoint) are completed from their
   claims (request names, settings), each read by the namespace and name its CDI spec annotates; a record
   without them (a spec of an older driver) is named from the claims of the pods bound to this node (a paged
   pod list, then a GET per claim), which also finds, after a lost checkpoint, the claims in use here with
   neither record nor spec. No pass lists the cluster's claims: its memory is this node's, not the cluster's;
2. every recorded claim is read from the API (outside the node lock); a claim that is gone (404), was
   re-created (other UID), deallocated, or no longer allocated here is an orphan: its settings are
   reverted, its CDI spec removed, its record dropped (Event OrphanCleaned, metric); a claim that cannot
   be decoded (MalformedObject) is logged and kept, and the others are handled;
3. under the node lock: CDI specs of this driver without a record are removed (orphan spec), a completed
   claim whose spec is missing, torn or names other devices gets it rewritten.
API errors end the pass early (nothing is cleaned on doubt) and the next pass tries again.
"""

from __future__ import annotations

import logging
import threading

from . import crashpoints
from .checkpoint import CheckpointCorrupt
from .configs import ConfigError
from .device_setup import SetupError
from .fsutil import WriteError
from .kube import ApiError, MalformedObject
from .state import ClaimError, ClaimRef, DeviceState

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(self, state: DeviceState, interval_s: float = 60.0, first_pass_s: float = 1.0) -> None:
        self.state = state
        self.interval_s = interval_s
        self.first_pass_s = min(first_pass_s, interval_s)
        self._stop = threading.Event()
        self._pass_lock = threading.Lock()  # the loop and the driver's rebuild may both run a pass
        self._thread: threading.Thread | None = None
        self.passes = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="reconciler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        delay = self.first_pass_s
        while not self._stop.wait(delay):
            delay = self.interval_s
            try:
                self.run_once()
            except ApiError as exc:
                log.warning("reconcile pass stopped: API unavailable", extra={"error": str(exc)})
            except Exception:  # noqa: BLE001 - the loop must survive anything
                log.exception("reconcile pass failed")

    def run_once(self, reserve_unrecorded: bool = False) -> dict[str, int]:
        """One pass; `reserve_unrecorded` (after a lost checkpoint): also reserve the devices of claims that pods
        on this node use, allocated here, with neither record nor CDI spec."""
        with self._pass_lock:
            return self._pass(reserve_unrecorded)

    def _get(self, namespace: str, name: str) -> dict | None:
        """One claim (None: it does not exist). Raises MalformedObject for an unreadable one (callers skip it:
        one bad object never stops the others) and ApiError when the API fails (the pass ends)."""
        try:
            return self.state.api.get_claim(namespace, name)
        except MalformedObject:
            raise
        except ApiError as exc:
            if exc.status != 404:
                raise
            return None

    def _scan_pod_claims(self, reserve: bool, fetched: dict[str, dict | None], counts: dict[str, int]) -> bool:
        """Read the claims that the pods bound to this node use (never the cluster's claim list): name rebuilt
        records without a name (CDI specs of an older driver, which did not annotate the claim) and, with
        `reserve`, reserve claims in use with neither record nor spec. The claims of recorded UIDs go into
        `fetched`. False when a claim could not be read: a record without a name may belong to it."""
        st = self.state
        complete = True
        try:
            names = list(st.api.pod_claim_names(st.node_name))
        except MalformedObject as exc:
            log.warning("cannot read the pods of this node", extra={"error": str(exc)})
            return False
        for namespace, name in names:
            try:
                claim = self._get(namespace, name)
            except MalformedObject as exc:
                log.warning("skipping an unreadable ResourceClaim", extra={"error": str(exc)})
                complete = False
                continue
            if claim is None:
                continue
            uid = str(claim["metadata"].get("uid", ""))
            with st.lock.held():
                cp = st.store.load()
                rec = cp.claims.get(uid)
                if rec is not None:
                    fetched[uid] = claim
                    if not rec.name:
                        rec.namespace, rec.name = namespace, name
                        st.store.save(cp)
                elif (reserve and (claim.get("status") or {}).get("reservedFor")
                      and st.reserve(cp, ClaimRef(namespace, uid, name), claim)):
                    st.store.save(cp)
                    crashpoints.reached("recovery.reserved")
                    counts["reserved"] += 1
        return complete

    def _complete_rebuilt(self, counts: dict[str, int], fetched: dict[str, dict | None]) -> None:
        """Complete the records rebuilt from CDI specs from their claims, each read by its name."""
        st = self.state
        for rec in list(st.store.load().claims.values()):
            if rec.incomplete and rec.name and rec.uid not in fetched:
                try:
                    fetched[rec.uid] = self._get(rec.namespace, rec.name)
                except MalformedObject as exc:
                    log.warning("cannot complete a rebuilt record", extra={"claim": rec.uid, "error": str(exc)})
        with st.lock.held():
            cp = st.store.load()
            for rec in list(cp.claims.values()):
                claim = fetched.get(rec.uid)
                if not rec.incomplete or claim is None:
                    continue
                try:
                    st.complete(rec, claim)
                except (ClaimError, ConfigError, SetupError) as exc:
                    # still reserved; released below if the claim is no longer this node's
                    log.warning("cannot complete a rebuilt record", extra={"claim": rec.uid, "error": str(exc)})
                    continue
                st.store.save(cp)
                counts["completed"] += 1
                crashpoints.reached("recovery.completed")

    def _pass(self, reserve_unrecorded: bool) -> dict[str, int]:
        st = self.state
        counts = {"orphan_claims": 0, "orphan_specs": 0, "rewritten": 0, "completed": 0, "reserved": 0}
        try:
            cp = st.store.load()
        except CheckpointCorrupt:
            st.on_corrupt()
            return counts
        fetched: dict[str, dict | None] = {}  # claims read in this pass, by UID (None: gone)
        nameless = any(not r.name for r in cp.claims.values())
        scanned = (reserve_unrecorded or nameless) and self._scan_pod_claims(reserve_unrecorded, fetched, counts)
        if any(r.incomplete for r in st.store.load().claims.values()):
            self._complete_rebuilt(counts, fetched)
        verdicts: dict[str, str] = {}
        for rec in list(st.store.load().claims.values()):
            if not rec.namespace or not rec.name:
                if scanned:
                    verdicts[rec.uid] = "no pod on this node uses a ResourceClaim with this UID"
                continue
            if rec.uid in fetched:
                claim = fetched[rec.uid]
            else:
                try:
                    claim = self._get(rec.namespace, rec.name)
                except MalformedObject as exc:
                    log.warning("cannot check a prepared claim", extra={"claim": rec.uid, "error": str(exc)})
                    continue  # kept on doubt; the other claims are checked
            reason = st.orphan_reason(rec, claim)
            if reason:
                verdicts[rec.uid] = reason
        with st.lock.held():
            for uid, reason in verdicts.items():
                rec = st.store.load().claims.get(uid)
                if rec is None:
                    continue  # unprepared meanwhile
                st.release(uid)
                counts["orphan_claims"] += 1
                st.metrics.orphans_cleaned.labels(st.driver, "claim").inc()
                st.events.normal("OrphanCleaned", f"{st.driver}: released claim {rec.ref()} "
                                                  f"({', '.join(d.device_name for d in rec.devices)}): {reason}")
            cp = st.store.load()
            for uid in st.cdi.claim_uids() - set(cp.claims):
                st.cdi.remove(uid)
                counts["orphan_specs"] += 1
                st.metrics.orphans_cleaned.labels(st.driver, "cdi_spec").inc()
                st.events.normal("OrphanCleaned", f"{st.driver}: removed CDI spec of unknown claim {uid}")
            for rec in list(cp.claims.values()):
                if rec.completed and not rec.incomplete:
                    try:  # the content, not only the name: a torn or overwritten spec fails the claim's containers
                        if st.ensure_spec(rec):
                            counts["rewritten"] += 1
                    except (ClaimError, WriteError) as exc:
                        log.error("cannot rewrite CDI spec", extra={"claim": rec.uid, "error": str(exc)})
            st.metrics.prepared_claims.labels(st.driver).set(len(st.store.load().claims))
        st.metrics.reconcile_runs.labels(st.driver).inc()
        self.passes += 1
        if any(counts.values()):
            log.info("reconciled", extra={"count": counts})
        return counts
