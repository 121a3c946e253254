"""Kubernetes Events on the Node (CoreV1 `events`), so `kubectl describe node` shows what the driver did.

Reasons (type):
    CheckpointCorrupt (Warning)       a corrupt checkpoint was moved aside and state rebuilt
    CheckpointTooNew (Warning)        a newer driver's checkpoint; this (older) driver refuses to run
    StateRebuilt (Normal)             prepared claims rebuilt from the API and the CDI directory
    BootChanged (Normal)              new boot id: CDI specs and device settings re-applied
    CDISpecRewritten (Normal)         a prepared claim's CDI spec was missing, torn or wrong and was rewritten
    OrphanCleaned (Normal)            a prepared claim without a live allocation was cleaned up
    DeviceUnhealthy (Warning)         a device was withdrawn from the ResourceSlices
    DeviceHealthy (Normal)            a device came back
    DevicePluginConflict (Warning)    the family's device plugin is on the node; nothing published
    InventoryNotReady (Warning)       devices not (yet) ready; nothing published, node kept tainted
    SlicesPublished (Normal)          the node's ResourceSlices are complete; readiness taint removed
    NotReady (Warning)                readiness taint (re-)added: devices not advertised
Events are sent from a background thread (never on the kubelet's call path) and identical ones are
suppressed for a minute to keep a flapping device from flooding the API.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import deque

from .kube import ApiError

log = logging.getLogger(__name__)
DEDUP_SECONDS = 60.0
EVENTS_NAMESPACE = "default"  # where the kubelet records Node events too


class EventRecorder:
    def __init__(self, api, driver: str, node_name: str, component: str | None = None) -> None:
        self.api = api
        self.driver = driver
        self.node_name = node_name
        self.node_uid = ""
        self.component = component or driver
        self.sent: deque[tuple[str, str, str]] = deque(maxlen=1000)  # (type, reason, message), newest last
        self._recent: dict[tuple[str, str], float] = {}
        self._queue: queue.Queue = queue.Queue(maxsize=1000)
        self._thread = threading.Thread(target=self._run, name="events", daemon=True)
        self._thread.start()

    def normal(self, reason: str, message: str) -> None:
        self.record("Normal", reason, message)

    def warning(self, reason: str, message: str) -> None:
        self.record("Warning", reason, message)

    def record(self, type_: str, reason: str, message: str) -> None:
        now = time.monotonic()
        key = (reason, message)
        if now - self._recent.get(key, -DEDUP_SECONDS) < DEDUP_SECONDS:
            return
        self._recent[key] = now
        if len(self._recent) > 1000:  # forget what is past the window: bounded memory on long runs
            self._recent = {k: t for k, t in self._recent.items() if now - t < DEDUP_SECONDS}
        self.sent.append((type_, reason, message))
        log.log(logging.WARNING if type_ == "Warning" else logging.INFO, message, extra={"reason": reason})
        try:
            self._queue.put_nowait((type_, reason, message))
        except queue.Full:
            log.warning("event queue full; dropped", extra={"reason": reason})

    def flush(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def _run(self) -> None:
        while True:
            type_, reason, message = self._queue.get()
            try:
                self._send(type_, reason, message)
            except ApiError as exc:
                log.warning("could not record event", extra={"reason": reason, "error": str(exc)})
            finally:
                self._queue.task_done()

    def _send(self, type_: str, reason: str, message: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.api.create_event(EVENTS_NAMESPACE, {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{self.node_name}.{uuid.uuid4().hex[:16]}", "namespace": EVENTS_NAMESPACE},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": self.node_uid},
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            # legacy core/v1 shape (source + timestamps): setting reportingComponent would switch the API
            # server to the events.k8s.io rules, which also require eventTime and action
            "source": {"component": self.component, "host": self.node_name},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        })
