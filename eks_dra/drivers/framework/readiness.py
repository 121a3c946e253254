"""The driver-owned readiness taint `<driver>/not-ready=true:NoSchedule` on the Node.

Accelerator node groups start with it; the driver removes it once its slices are published, complete and
at least one device is healthy, and puts it back when that stops being true (devices gone, host driver
unloaded, all devices unhealthy, publishing refused). No pod lands on a node whose devices are not
advertised. Both edits are JSON patches guarded by a `test` of the Node's resourceVersion, so a
concurrent change of the taint list (kubelet, another driver) is never overwritten; they are made only
when the taint is in the wrong state (no writes at steady state). Shutdown leaves the taint alone.
"""

from __future__ import annotations

import logging

from .kube import ApiError

log = logging.getLogger(__name__)


def taint_key(driver: str) -> str:
    return f"{driver}/not-ready"


class ReadinessTaint:
    def __init__(self, api, driver: str, node_name: str, events=None) -> None:
        self.api, self.driver, self.node_name, self.events = api, driver, node_name, events
        self.key = taint_key(driver)
        self.ready: bool | None = None  # last state written or confirmed

    def ensure(self, ready: bool, node: dict | None = None) -> bool:
        """Make the taint match `ready`; returns True when a patch was written."""
        node = node or self.api.get_node(self.node_name)
        taints = list((node.get("spec") or {}).get("taints") or [])
        present = any(t.get("key") == self.key for t in taints)
        if present != ready:
            self.ready = ready
            return False
        rv = node["metadata"]["resourceVersion"]
        if ready:
            new = [t for t in taints if t.get("key") != self.key]
        else:
            new = taints + [{"key": self.key, "value": "true", "effect": "NoSchedule"}]
        ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}]
        ops.append({"op": "replace" if "taints" in (node.get("spec") or {}) else "add", "path": "/spec/taints",
                    "value": new})
        try:
            self.api.patch_node_json(self.node_name, ops)
        except ApiError as exc:
            if exc.status in (409, 422):  # the Node changed under us: the next pass retries on fresh data
                log.info("node changed while editing the readiness taint; will retry", extra={"error": str(exc)})
                return False
            raise
        self.ready = ready
        if self.events:
            if ready:
                self.events.normal("SlicesPublished", f"{self.driver}: ResourceSlices published; removed taint "
                                                      f"{self.key}:NoSchedule")
            else:
                self.events.warning("NotReady", f"{self.driver}: devices not advertised; added taint "
                                                f"{self.key}:NoSchedule")
        log.info("readiness taint " + ("removed" if ready else "added"), extra={"reason": self.key})
        return True
