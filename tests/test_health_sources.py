"""Device health: EFA ports, Neuron ECC counters, GPU XIDs (fixture files and injected NVML events)."""

from __future__ import annotations

import shutil

import pytest
from test_discovery_fakes import FakeNvml

from eks_dra.devices import node_facts
from eks_dra.devices.neuron import neuron_device_name
from eks_dra.drivers.efa.health import efa_port_health
from eks_dra.drivers.families import discover, health_monitor
from eks_dra.drivers.fixture import set_efa_port_state, set_gpu_xid, set_neuron_error, write_fixture
from eks_dra.drivers.framework.hosttree import FIXTURE_DIR
from eks_dra.drivers.gpu.health import GpuHealthMonitor
from eks_dra.drivers.gpu.host import GpuHost
from eks_dra.drivers.gpu.nvml import NvmlEvent, NvmlHealth
from eks_dra.drivers.neuron.health import neuron_health

NODE = "node-h"


def _unhealthy(health: dict) -> dict[str, str]:
    return {name: reason for name, (ok, reason) in health.items() if not ok}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_efa_port_down_is_unhealthy_and_recovers(tmp_path):
    root = write_fixture("p5.48xlarge", tmp_path / "h", node_name=NODE)
    monitor = health_monitor("efa", root)
    assert _unhealthy(monitor.poll()) == {}
    inventory = discover("efa", root, NODE)
    victim = inventory.devices[5]
    ibdev = victim.device.attributes["rdmaDevice"]
    set_efa_port_state(root, ibdev, active=False)
    down = _unhealthy(monitor.poll())
    assert list(down) == [victim.device.name] and "'1: DOWN', not ACTIVE" in down[victim.device.name]
    snapshot = discover("efa", root, NODE).by_name()[victim.device.name]
    assert not snapshot.healthy and "DOWN" in snapshot.health_reason
    set_efa_port_state(root, ibdev, active=True)
    assert _unhealthy(monitor.poll()) == {}


def test_efa_port_state_missing_is_unhealthy(tmp_path):
    root = write_fixture("p4d.24xlarge", tmp_path / "h")
    ibdev = discover("efa", root, NODE).devices[0].device.attributes["rdmaDevice"]
    (root / "sys/class/infiniband" / ibdev / "ports/1/state").unlink()
    ok, reason = efa_port_health(root, ibdev)
    assert not ok and "no port state" in reason


def test_neuron_error_counter_is_unhealthy_until_cleared(tmp_path):
    root = write_fixture("trn2.48xlarge", tmp_path / "h", node_name=NODE)
    monitor = health_monitor("neuron", root)
    assert _unhealthy(monitor.poll()) == {}
    set_neuron_error(root, 9, 3)
    bad = _unhealthy(monitor.poll())
    assert list(bad) == [neuron_device_name(9)] and "mem_ecc_uncorrected=3" in bad[neuron_device_name(9)]
    assert not discover("neuron", root, NODE).by_name()[neuron_device_name(9)].healthy
    set_neuron_error(root, 9, 0)
    assert _unhealthy(monitor.poll()) == {}


def test_neuron_sram_counter_as_plain_file_and_vanished_device(tmp_path):
    root = write_fixture("inf2.24xlarge", tmp_path / "h")
    counter = root / "sys/class/neuron_device/neuron2/stats/hardware/sram_ecc_uncorrected"
    for f in counter.iterdir():
        f.unlink()
    counter.rmdir()
    counter.write_text("7\n")
    ok, reason = neuron_health(root, 2)
    assert not ok and "sram_ecc_uncorrected=7" in reason
    ok, reason = neuron_health(root, 11)
    assert not ok and "disappeared" in reason


def test_fixture_xid_marks_gpu_and_its_mig_children(tmp_path):
    root = write_fixture("p5.48xlarge", tmp_path / "h", node_name=NODE, mig_profile="2g.20gb")
    monitor = health_monitor("gpu", root)
    assert _unhealthy(monitor.poll()) == {}
    set_gpu_xid(root, 6, 79)
    bad = _unhealthy(monitor.poll())
    assert sorted(bad) == [f"gpu-6-mig-2g-20gb-{i}" for i in range(3)]
    assert all("XID 79" in r for r in bad.values())
    set_gpu_xid(root, 6, 13)  # an application fault, not a device fault
    assert _unhealthy(monitor.poll()) == {}
    set_gpu_xid(root, 6, 48)
    assert not discover("gpu", root, NODE).by_name()["gpu-6-mig-2g-20gb-0"].healthy
    set_gpu_xid(root, 6, None)
    assert _unhealthy(monitor.poll()) == {}


def _nvml_monitor(tmp_path, profile=None):
    root = write_fixture("p5.48xlarge", tmp_path / "h", node_name=NODE, mig_profile=profile)
    nvml = FakeNvml.from_facts(node_facts("p5.48xlarge", NODE, mig_profile=profile))
    clock = Clock()
    return root, nvml, clock, GpuHealthMonitor(root, nvml, xid_hold_s=60, clock=clock)


def test_nvml_xid_event_withdraws_the_gpu_for_the_hold_time(tmp_path):
    root, nvml, clock, monitor = _nvml_monitor(tmp_path)
    uuid = nvml.gpu_list[3].uuid
    nvml.events.append(NvmlEvent(uuid, 79, "xid"))
    bad = _unhealthy(monitor.poll())
    assert list(bad) == ["gpu-3"] and "XID 79" in bad["gpu-3"]
    clock.now += 59
    assert "gpu-3" in _unhealthy(monitor.poll())  # events are drained, the state is kept
    clock.now += 1
    assert _unhealthy(monitor.poll()) == {}


def test_nvml_ignored_xids_and_ecc_events(tmp_path):
    root, nvml, clock, monitor = _nvml_monitor(tmp_path)
    nvml.events += [NvmlEvent(nvml.gpu_list[0].uuid, 43, "xid"), NvmlEvent(nvml.gpu_list[1].uuid, 0, "ecc")]
    bad = _unhealthy(monitor.poll())
    assert list(bad) == ["gpu-1"] and "double-bit ECC" in bad["gpu-1"]


def test_nvml_xid_on_parent_marks_every_mig_child_and_gi_event_only_its_instance(tmp_path):
    root, nvml, clock, monitor = _nvml_monitor(tmp_path, profile="3g.40gb")
    parent = nvml.gpu_list[2]
    nvml.events.append(NvmlEvent(parent.uuid, 94, "xid", gpu_instance_id=parent.migs[1].gpu_instance_id))
    assert list(_unhealthy(monitor.poll())) == ["gpu-2-mig-3g-40gb-1"]
    nvml.events.append(NvmlEvent(parent.uuid, 79, "xid"))
    assert sorted(_unhealthy(monitor.poll())) == ["gpu-2-mig-3g-40gb-0", "gpu-2-mig-3g-40gb-1"]


def test_nvml_event_naming_the_mig_device_itself(tmp_path):
    root, nvml, clock, monitor = _nvml_monitor(tmp_path, profile="2g.20gb")
    mig = nvml.gpu_list[4].migs[2]
    nvml.events.append(NvmlEvent(mig.uuid, 0, "ecc", gpu_instance_id=mig.gpu_instance_id))
    bad = _unhealthy(monitor.poll())
    assert list(bad) == ["gpu-4-mig-2g-20gb-2"] and "double-bit ECC error on GPU instance 3" in bad[
        "gpu-4-mig-2g-20gb-2"]


@pytest.mark.parametrize(("health", "words"), [
    (NvmlHealth(uncorrected_ecc_volatile=2), "2 uncorrected ECC errors"),
    (NvmlHealth(row_remap_pending=True), "row remapping pending"),
    (NvmlHealth(row_remap_failure=True), "row remapping failed"),
    (NvmlHealth(error="GPU is lost"), "GPU is lost"),
])
def test_nvml_level_signals(tmp_path, health, words):
    root, nvml, clock, monitor = _nvml_monitor(tmp_path, profile="1g.10gb")
    nvml.health_by_uuid[nvml.gpu_list[5].uuid] = health
    bad = _unhealthy(monitor.poll())
    assert sorted(bad) == [f"gpu-5-mig-1g-10gb-{i}" for i in range(7)]
    assert all(words in r for r in bad.values())
    inventory = discover("gpu", root, NODE, nvml=nvml)
    assert {d.device.name for d in inventory.devices if not d.healthy} == set(bad)
    del nvml.health_by_uuid[nvml.gpu_list[5].uuid]
    assert _unhealthy(monitor.poll()) == {}


def test_monitor_takes_topology_from_the_drivers_inventory(tmp_path):
    root = write_fixture("g6e.48xlarge", tmp_path / "h", node_name=NODE)
    monitor = health_monitor("gpu", root)
    inventory = discover("gpu", root, NODE)
    inventory.devices = inventory.devices[:2]
    monitor.refresh(inventory)
    set_gpu_xid(root, 7, 79)  # not in the given topology
    set_gpu_xid(root, 1, 79)
    assert set(monitor.poll()) == {"gpu-0", "gpu-1"}
    assert list(_unhealthy(monitor.poll())) == ["gpu-1"]


def test_a_failing_nvml_never_breaks_the_poll(tmp_path):
    root, nvml, clock, monitor = _nvml_monitor(tmp_path, profile="1g.20gb")

    def boom():
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    nvml.poll_events = boom
    nvml.gpus = boom
    monitor.refresh(discover("gpu", root, NODE))
    assert _unhealthy(monitor.poll()) == {}
    nvml.health_by_uuid[nvml.gpu_list[0].uuid] = NvmlHealth(error="GPU is lost")
    assert len(_unhealthy(monitor.poll())) == 4  # gpu-0's four 1g.20gb instances


def test_gpu_monitor_loads_nvml_from_the_driver_root(tmp_path, fresh_shared_nvml):
    """A real-node tree whose driver lives under /run/nvidia/driver: the monitor asks that root for NVML
    (as discovery does), not the container's default library path, and the failure names the root."""
    root = write_fixture("p5.48xlarge", tmp_path / "h", node_name=NODE)
    shutil.rmtree(root / FIXTURE_DIR)  # no fixture marker: the monitor loads NVML itself, as on a node
    host = GpuHost.for_node(root, "/run/nvidia/driver")
    reports: list[tuple[str, str]] = []
    host.on_unavailable = lambda tool, message: reports.append((tool, message))
    monitor = health_monitor("gpu", root, host=host)
    monitor.refresh(discover("gpu", root, NODE, nvml=FakeNvml.from_facts(node_facts("p5.48xlarge", NODE))))
    assert [tool for tool, _ in reports] == ["nvml"]
    assert f"driver root {root / 'run/nvidia/driver'}" in reports[0][1]
