"""Device health as device taints (DRADeviceTaints, beta and on by default from Kubernetes 1.36).

Where the gate is on, an unhealthy device stays in the ResourceSlice with a taint instead of being withdrawn,
so the scheduler skips it (a claim must tolerate the taint) and `kubectl get resourceslices -o yaml` shows why.
The taint key is `<driver name>/unhealthy` (the driver's own domain), the value names the fault, the effect
says what the fault does to work already running on the device.

The value is the fault kind the family's health source attached to its reason (`inventory.Fault`); each family's
table (kind -> effect) is its `DeviceFamily.taint_effects`, documented with the family (gpu/family.py,
efa/family.py, neuron/family.py). A reason without a kind, or one the table lacks, is `unknown`, NoSchedule.

NoExecute makes the 1.36 control plane evict the pods whose claims hold the device (DeviceTaintEviction);
NoSchedule only keeps new claims off it. On 1.34/1.35 (gate off) the driver withdraws the device as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from .inventory import fault_kind

NO_SCHEDULE, NO_EXECUTE = "NoSchedule", "NoExecute"

TaintEffects = dict[str, str]  # fault kind (inventory.Fault.kind, the taint's value) -> effect


@dataclass(frozen=True)
class DeviceTaint:
    key: str
    value: str
    effect: str

    def to_api(self) -> dict:
        return {"key": self.key, "value": self.value, "effect": self.effect}


def taint_key(driver_name: str) -> str:
    return f"{driver_name}/unhealthy"


def taint_for(driver_name: str, effects: TaintEffects, reason: str) -> DeviceTaint:
    """The taint of an unhealthy device whose health source said `reason`: value = the reason's fault kind when
    the family's `effects` table has it, else "unknown" with NoSchedule. Messages are never parsed."""
    kind = fault_kind(reason)
    if kind is not None and kind in effects:
        return DeviceTaint(taint_key(driver_name), kind, effects[kind])
    return DeviceTaint(taint_key(driver_name), "unknown", NO_SCHEDULE)
