"""Device health as device taints (DRADeviceTaints, beta and on by default from Kubernetes 1.36).

Where the gate is on, an unhealthy device stays in the ResourceSlice with a taint instead of being withdrawn,
so the scheduler skips it (a claim must tolerate the taint) and `kubectl get resourceslices -o yaml` shows why.
The taint key is `<driver name>/unhealthy` (the driver's own domain), the value names the fault, the effect
says what the fault does to work already running on the device:

| family | fault (health_sources reason) | value | effect |
|---|---|---|---|
| gpu | XID (not an application XID) or double-bit ECC event | xid | NoExecute: the GPU context is lost |
| gpu | uncorrected volatile ECC errors | ecc-uncorrected | NoExecute: memory contents are corrupt |
| gpu | NVML cannot reach the GPU | gpu-lost | NoExecute: the GPU fell off the bus |
| gpu | row remapping failed | row-remap-failed | NoExecute: the GPU needs replacing |
| gpu | row remapping pending | row-remap-pending | NoSchedule: running work continues; reset when idle |
| gpu (MIG) | parent GPU unhealthy | the parent's value | the parent's effect |
| efa | a port not ACTIVE | link-down | NoExecute: traffic over the interface fails |
| efa | no or unreadable port state | unknown | NoSchedule: health cannot be told |
| neuron | uncorrected ECC errors | ecc-uncorrected | NoExecute: memory contents are corrupt |
| neuron | device gone from sysfs | device-lost | NoExecute |
| neuron | unreadable ECC counters, anything else | unknown | NoSchedule |

NoExecute makes the 1.36 control plane evict the pods whose claims hold the device (DeviceTaintEviction);
NoSchedule only keeps new claims off it. On 1.34/1.35 (gate off) the driver withdraws the device as before.
"""

from __future__ import annotations

from dataclasses import dataclass

NO_SCHEDULE, NO_EXECUTE = "NoSchedule", "NoExecute"

# (family, substring of the health reason) -> (value, effect); first match wins.
_FAULTS: tuple[tuple[str, str, str, str], ...] = (
    ("gpu", "row remapping pending", "row-remap-pending", NO_SCHEDULE),
    ("gpu", "row remapping failed", "row-remap-failed", NO_EXECUTE),
    ("gpu", "XID", "xid", NO_EXECUTE),
    ("gpu", "double-bit ECC", "xid", NO_EXECUTE),
    ("gpu", "uncorrected ECC", "ecc-uncorrected", NO_EXECUTE),
    ("gpu", "NVML cannot reach", "gpu-lost", NO_EXECUTE),
    ("efa", " is '", "link-down", NO_EXECUTE),
    ("neuron", "uncorrected ECC", "ecc-uncorrected", NO_EXECUTE),
    ("neuron", "disappeared", "device-lost", NO_EXECUTE),
)


@dataclass(frozen=True)
class DeviceTaint:
    key: str
    value: str
    effect: str

    def to_api(self) -> dict:
        return {"key": self.key, "value": self.value, "effect": self.effect}


def taint_key(driver_name: str) -> str:
    return f"{driver_name}/unhealthy"


def taint_for(driver_name: str, family: str, reason: str) -> DeviceTaint:
    """The taint of an unhealthy device of `family` whose health source said `reason`."""
    for fault_family, needle, value, effect in _FAULTS:
        if fault_family == family and needle in reason:
            return DeviceTaint(taint_key(driver_name), value, effect)
    return DeviceTaint(taint_key(driver_name), "unknown", NO_SCHEDULE)
