"""Device health as device taints (DRADeviceTaints, beta and on by default from Kubernetes 1.36).

Where the gate is on, an unhealthy device stays in the ResourceSlice with a taint instead of being withdrawn,
so the scheduler skips it (a claim must tolerate the taint) and `kubectl get resourceslices -o yaml` shows why.
The taint key is `<driver name>/unhealthy` (the driver's own domain), the value names the fault, the effect
says what the fault does to work already running on the device.

Each family's table (needle of the health reason -> value, effect) is its `DeviceFamily.taint_faults`, documented
with the family (gpu/family.py, efa/family.py, neuron/family.py); a fault no entry matches is `unknown`, NoSchedule.

NoExecute makes the 1.36 control plane evict the pods whose claims hold the device (DeviceTaintEviction);
NoSchedule only keeps new claims off it. On 1.34/1.35 (gate off) the driver withdraws the device as before.
"""

from __future__ import annotations

from dataclasses import dataclass

NO_SCHEDULE, NO_EXECUTE = "NoSchedule", "NoExecute"

# (substring of the health reason, value, effect); first match wins.
TaintFaults = tuple[tuple[str, str, str], ...]


@dataclass(frozen=True)
class DeviceTaint:
    key: str
    value: str
    effect: str

    def to_api(self) -> dict:
        return {"key": self.key, "value": self.value, "effect": self.effect}


def taint_key(driver_name: str) -> str:
    return f"{driver_name}/unhealthy"


def taint_for(driver_name: str, faults: TaintFaults, reason: str) -> DeviceTaint:
    """The taint of an unhealthy device whose health source said `reason`, by the family's `faults` table."""
    for needle, value, effect in faults:
        if needle in reason:
            return DeviceTaint(taint_key(driver_name), value, effect)
    return DeviceTaint(taint_key(driver_name), "unknown", NO_SCHEDULE)
