"""Hostile host data: whatever a sysfs/procfs file holds, discovery and health answer, never raise."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eks_dra.catalog import get_instance_type
from eks_dra.devices import FAMILIES
from eks_dra.drivers.families import discover, health_monitor
from eks_dra.drivers.fixture import write_fixture
from eks_dra.drivers.framework import hosttree
from eks_dra.drivers.gpu import discovery as gpu_discovery
from eks_dra.drivers.neuron import discovery as neuron_discovery


def _targets(instance_type: str) -> list[str]:
    it = get_instance_type(instance_type)
    acc, efa = it.accelerators[0].pci.address, it.efa_interfaces[0].pci.address
    files = [f"sys/bus/pci/devices/{acc}/{f}" for f in ("vendor", "device", "class", "numa_node")]
    files += [f"sys/bus/pci/devices/{efa}/{f}" for f in ("vendor", "device", "class", "numa_node")]
    files += [str(hosttree.DMI_PRODUCT_NAME), "sys/class/infiniband_verbs/uverbs0/ibdev"]
    ibdev = f"rdmap{int(efa.split(':')[1], 16)}s0"
    files.append(f"sys/class/infiniband/{ibdev}/ports/1/state")
    if it.gpu:
        files += [f"proc/driver/nvidia/gpus/{acc}/information", str(gpu_discovery.NVIDIA_VERSION_FILE),
                  str(gpu_discovery.NVIDIA_MIG_MINORS), str(gpu_discovery.FIXTURE_MIG_FILE),
                  str(gpu_discovery.FIXTURE_XID_DIR / "gpu0")]
    else:
        files += ["sys/class/neuron_device/neuron0/core_count", str(neuron_discovery.NEURON_VERSION_FILE),
                  "sys/class/neuron_device/neuron0/stats/hardware/mem_ecc_uncorrected/total"]
    return files


def _exercise(root: Path) -> None:
    for family in FAMILIES:
        inventory = discover(family, root, "n")
        assert isinstance(inventory.ready, bool) and isinstance(inventory.reason, str)
        health = health_monitor(family, root).poll()
        assert all(isinstance(ok, bool) for ok, _ in health.values())


_TREES: dict[str, Path] = {}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_garbage_in_any_host_file_never_raises(tmp_path_factory, data):
    instance_type = data.draw(st.sampled_from(["p4d.24xlarge", "trn1.32xlarge"]))
    if instance_type not in _TREES:  # one tree per type, restored after each example
        root = tmp_path_factory.mktemp("fuzz") / instance_type
        mig = "1g.5gb" if instance_type.startswith("p4d") else None
        _TREES[instance_type] = write_fixture(instance_type, root, mig_profile=mig)
    root = _TREES[instance_type]
    target = root / data.draw(st.sampled_from(_targets(instance_type)))
    content = data.draw(st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
    original = target.read_bytes() if target.is_file() else None
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(content)
    try:
        _exercise(root)
    finally:
        if original is None:
            target.unlink()
        else:
            target.write_bytes(original)
