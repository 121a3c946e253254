"""Device health as device taints (DRADeviceTaints, 1.36+): the unhealthy device stays in the slice, tainted."""

from __future__ import annotations

import time

import pytest
from drivers.harness import DRIVERS, Sandbox, wait_for
from test_discovery_fakes import FakeNvml

from eks_dra.devices import node_facts
from eks_dra.drivers import fixture
from eks_dra.drivers.efa.health import efa_port_health
from eks_dra.drivers.families import discover, get_family
from eks_dra.drivers.framework.device_taints import NO_EXECUTE, NO_SCHEDULE, taint_for, taint_key
from eks_dra.drivers.framework.inventory import Fault, InventoryView, derived_reason, fault_kind
from eks_dra.drivers.gpu.health import GpuHealthMonitor, nvml_level_health
from eks_dra.drivers.gpu.nvml import NvmlEvent, NvmlHealth
from eks_dra.drivers.neuron.health import neuron_health

GPU, EFA = DRIVERS["gpu"], DRIVERS["efa"]


@pytest.fixture
def cluster():
    box = Sandbox()
    yield box.kube, box.node, box.start
    box.close()


def published(kube, node, driver) -> dict[str, list[dict]]:
    """device name -> its taints, as the API server stores the slices."""
    return {d["name"]: d.get("taints") or [] for s in kube.slices_of(node, driver) for d in s["spec"]["devices"]}


def _gpu_event(kind: str, xid: int, tmp_path) -> str:
    root = fixture.write_fixture("p5.48xlarge", tmp_path / "g")
    nvml = FakeNvml.from_facts(node_facts("p5.48xlarge", "n"))
    monitor = GpuHealthMonitor(root, nvml)
    nvml.events.append(NvmlEvent(nvml.gpu_list[1].uuid, xid, kind))
    return monitor.poll()["gpu-1"][1]


def _efa_port(tmp_path, down: bool = True, remove: bool = False) -> str:
    root = fixture.write_fixture("p4d.24xlarge", tmp_path / "e")
    ibdev = str(discover("efa", root).devices[0].device.attributes["rdmaDevice"])
    if remove:
        (root / "sys/class/infiniband" / ibdev / "ports/1/state").unlink()
    else:
        fixture.set_efa_port_state(root, ibdev, active=not down)
    return efa_port_health(root, ibdev)[1]


def _neuron(tmp_path, what: str) -> str:
    root = fixture.write_fixture("trn1.32xlarge", tmp_path / "n")
    base = root / "sys/class/neuron_device/neuron3"
    if what == "ecc":
        fixture.set_neuron_error(root, 3, 1)
    elif what == "gone":
        base.unlink()  # the class device is a link into /sys/devices
    else:
        counter = base / "stats/hardware/sram_ecc_uncorrected"
        counter.mkdir(parents=True, exist_ok=True)
        (counter / "total").write_text("not a number")
    return neuron_health(root, 3)[1]


# The reasons come from the real health sources, so the test holds each source to the kind it must report.
@pytest.mark.parametrize(("family", "reason_of", "value", "effect"), [
    ("gpu", lambda p: _gpu_event("xid", 79, p), "xid", NO_EXECUTE),
    ("gpu", lambda p: _gpu_event("ecc", 0, p), "xid", NO_EXECUTE),  # double-bit ECC event
    ("gpu", lambda p: nvml_level_health(NvmlHealth(uncorrected_ecc_volatile=2))[1], "ecc-uncorrected", NO_EXECUTE),
    ("gpu", lambda p: nvml_level_health(NvmlHealth(error="GPU is lost"))[1], "gpu-lost", NO_EXECUTE),
    ("gpu", lambda p: nvml_level_health(NvmlHealth(row_remap_pending=True))[1], "row-remap-pending", NO_SCHEDULE),
    ("gpu", lambda p: nvml_level_health(NvmlHealth(row_remap_failure=True))[1], "row-remap-failed", NO_EXECUTE),
    ("efa", lambda p: _efa_port(p), "link-down", NO_EXECUTE),
    ("efa", lambda p: _efa_port(p, remove=True), "unknown", NO_SCHEDULE),
    ("neuron", lambda p: _neuron(p, "ecc"), "ecc-uncorrected", NO_EXECUTE),
    ("neuron", lambda p: _neuron(p, "gone"), "device-lost", NO_EXECUTE),
    ("neuron", lambda p: _neuron(p, "unreadable"), "unknown", NO_SCHEDULE),
])
def test_each_fault_has_its_documented_effect(family, reason_of, value, effect, tmp_path):
    reason = reason_of(tmp_path)
    assert reason  # an unhealthy device's message
    taint = taint_for(DRIVERS[family], get_family(family).taint_effects, reason)
    assert (taint.key, taint.value, taint.effect) == (taint_key(DRIVERS[family]), value, effect)


def test_the_taint_comes_from_the_fault_kind_not_the_words():
    effects = get_family("gpu").taint_effects
    assert taint_for(GPU, effects, "XID 79 on GPU GPU-1").value == "unknown"  # a bare message: no kind
    assert taint_for(GPU, effects, Fault("xid", "reworded: the GPU fell over")).to_api() == {
        "key": taint_key(GPU), "value": "xid", "effect": NO_EXECUTE}
    assert taint_for(GPU, effects, Fault("link-down", "an EFA fault on a GPU driver")).value == "unknown"


def test_mig_devices_report_their_gpus_fault(tmp_path):
    root = fixture.write_fixture("p5.48xlarge", tmp_path / "h", mig_profile="3g.40gb")
    view = InventoryView(lambda: discover("gpu", root))
    fixture.set_gpu_xid(root, 1, 48)
    view.refresh()
    reasons = view.unhealthy()
    assert sorted(reasons) == ["gpu-1-mig-3g-40gb-0", "gpu-1-mig-3g-40gb-1"]
    assert {fault_kind(r) for r in reasons.values()} == {"xid"}


def test_a_derived_reason_keeps_the_source_fault():
    derived = derived_reason(Fault("xid", "XID 48 on GPU GPU-1"), "parent gpu-1 unhealthy: XID 48 on GPU GPU-1")
    assert fault_kind(derived) == "xid" and derived == "parent gpu-1 unhealthy: XID 48 on GPU GPU-1"
    assert fault_kind(derived_reason("no kind", "parent gpu-1 unhealthy: no kind")) is None


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
