"""Checkpoint <-> CDI directory <-> API claims, compared every `interval_s`.

The first pass runs `first_pass_s` after start (not a full interval: a driver that restarts often must still
get there). One pass:
1. incomplete records (rebuilt from the CDI directory after a lost checkpoint) are matched to the API's
   claims by UID with one LIST and completed from them (name, request names, settings);
2. every recorded claim is read from the API (outside the node lock); a claim that is gone (404), was
   re-created (other UID), deallocated, or no longer allocated here is an orphan: its settings are
   reverted, its CDI spec removed, its record dropped (Event OrphanCleaned, metric);
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
from .kube import ApiError
from .state import ClaimError, DeviceState

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

    def run_once(self) -> dict[str, int]:
        with self._pass_lock:
            return self._pass()

    def _complete_rebuilt(self, counts: dict[str, int]) -> None:
        st = self.state
        by_uid = {(c.get("metadata") or {}).get("uid"): c for c in st.api.list_claims()}
        with st.lock.held():
            cp = st.store.load()
            for rec in list(cp.claims.values()):
                claim = by_uid.get(rec.uid)
                if not rec.incomplete or claim is None:
                    continue
                try:
                    st.complete(rec, claim)
                except (ClaimError, ConfigError, SetupError) as exc:
                    # still reserved; released below if the claim is no longer this node's
                    rec.namespace = rec.namespace or str(claim["metadata"].get("namespace", ""))
                    rec.name = rec.name or str(claim["metadata"].get("name", ""))
                    log.warning("cannot complete a rebuilt record", extra={"claim": rec.uid, "error": str(exc)})
                    continue
                st.store.save(cp)
                counts["completed"] += 1
                crashpoints.reached("recovery.completed")

    def _pass(self) -> dict[str, int]:
        st = self.state
        counts = {"orphan_claims": 0, "orphan_specs": 0, "rewritten": 0, "completed": 0}
        try:
            cp = st.store.load()
        except CheckpointCorrupt:
            st.on_corrupt()
            return counts
        if any(r.incomplete for r in cp.claims.values()):
            self._complete_rebuilt(counts)
        verdicts: dict[str, str] = {}
        for rec in list(st.store.load().claims.values()):
            if not rec.namespace or not rec.name:
                verdicts[rec.uid] = "no ResourceClaim with this UID exists"
                continue
            try:
                claim = st.api.get_claim(rec.namespace, rec.name)
            except ApiError as exc:
                if exc.status != 404:
                    raise
                claim = None
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
