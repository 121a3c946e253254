"""Device health as device taints (DRADeviceTaints, 1.36+): the unhealthy device stays in the slice, tainted."""

from __future__ import annotations

import time

import pytest
from drivers.harness import DRIVERS, Sandbox, wait_for

from eks_dra.drivers import fixture
from eks_dra.drivers.families import get_family
from eks_dra.drivers.framework.device_taints import NO_EXECUTE, NO_SCHEDULE, taint_for, taint_key

GPU, EFA = DRIVERS["gpu"], DRIVERS["efa"]


@pytest.fixture
def cluster():
    box = Sandbox()
    yield box.kube, box.node, box.start
    box.close()


def published(kube, node, driver) -> dict[str, list[dict]]:
    """device name -> its taints, as the API server stores the slices."""
    return {d["name"]: d.get("taints") or [] for s in kube.slices_of(node, driver) for d in s["spec"]["devices"]}


@pytest.mark.parametrize(("family", "reason", "value", "effect"), [
    ("gpu", "XID 79 on GPU GPU-1234", "xid", NO_EXECUTE),
    ("gpu", "double-bit ECC error of GPU GPU-1 3s ago", "xid", NO_EXECUTE),
    ("gpu", "2 uncorrected ECC errors since the last reset", "ecc-uncorrected", NO_EXECUTE),
    ("gpu", "NVML cannot reach the GPU: lost", "gpu-lost", NO_EXECUTE),
    ("gpu", "row remapping pending: the GPU needs a reset", "row-remap-pending", NO_SCHEDULE),
    ("gpu", "row remapping failed: replace or reset the GPU", "row-remap-failed", NO_EXECUTE),
    ("gpu", "parent gpu-1 unhealthy: XID 48 on GPU GPU-1", "xid", NO_EXECUTE),
    ("efa", "rdmap0s31 port 1 is '1: DOWN', not ACTIVE", "link-down", NO_EXECUTE),
    ("efa", "rdmap0s31: no port state in sysfs", "unknown", NO_SCHEDULE),
    ("neuron", "neuron3: uncorrected ECC errors (mem_ecc_uncorrected=1); reset the device", "ecc-uncorrected",
     NO_EXECUTE),
    ("neuron", "neuron3 disappeared from /sys/class/neuron_device", "device-lost", NO_EXECUTE),
    ("neuron", "neuron3: unreadable sram_ecc_uncorrected (boom)", "unknown", NO_SCHEDULE),
])
def test_each_fault_has_its_documented_effect(family, reason, value, effect):
    taint = taint_for(DRIVERS[family], get_family(family).taint_faults, reason)
    assert (taint.key, taint.value, taint.effect) == (taint_key(DRIVERS[family]), value, effect)


def test_unhealthy_devices_stay_tainted_and_come_back_clean(cluster):
    kube, make_node, start = cluster
    n = make_node()
    efa = start(n, "efa", device_taints=True)
    start(n, "gpu", device_taints=True)
    wait_for(lambda: len(published(kube, "node-a", EFA)) == 32 and len(published(kube, "node-a", GPU)) == 8,
             what="slices")
    name, dev = sorted(efa.inventory.devices.items())[0]
    fixture.set_efa_port_state(n.host, dev.device.attributes["rdmaDevice"], False)
    fixture.set_gpu_xid(n.host, 2, 79)
    wait_for(lambda: published(kube, "node-a", GPU).get("gpu-2") and published(kube, "node-a", EFA).get(name),
             timeout=10, what="taints")
    gpus, efas = published(kube, "node-a", GPU), published(kube, "node-a", EFA)
    assert len(gpus) == 8 and len(efas) == 32  # nothing withdrawn
    assert gpus["gpu-2"] == [{"key": taint_key(GPU), "value": "xid", "effect": NO_EXECUTE}]
    assert efas[name] == [{"key": taint_key(EFA), "value": "link-down", "effect": NO_EXECUTE}]
    assert sum(1 for t in gpus.values() if t) == 1 and sum(1 for t in efas.values() if t) == 1
    reasons = [m for _, r, m in efa.events.sent if r == "DeviceUnhealthy"]
    assert reasons and "tainted in the ResourceSlice" in reasons[0]
    fixture.set_efa_port_state(n.host, dev.device.attributes["rdmaDevice"], True)
    fixture.set_gpu_xid(n.host, 2, None)
    wait_for(lambda: not any(published(kube, "node-a", GPU).values())
             and not any(published(kube, "node-a", EFA).values()), timeout=10, what="taints removed")


def test_without_the_gate_unhealthy_devices_are_withdrawn(cluster):
    kube, make_node, start = cluster
    n = make_node()
    start(n, "gpu")
    wait_for(lambda: len(published(kube, "node-a", GPU)) == 8, what="slices")
    fixture.set_gpu_xid(n.host, 2, 79)
    wait_for(lambda: "gpu-2" not in published(kube, "node-a", GPU), timeout=10, what="withdrawn")
    time.sleep(0.3)
    assert not any(published(kube, "node-a", GPU).values())  # no taint anywhere: 1.34/1.35 behaviour
