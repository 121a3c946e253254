"""The shared device model: topology facts survive into the published attributes."""

import pytest

from eks_dra.catalog import INSTANCE_TYPES, get_instance_type
from eks_dra.devices import PCIE_ROOT, Version, resource_slices, simulate_node
from eks_dra.devices.model import Device


def _roots(devices):
    return {d.attributes[PCIE_ROOT] for d in devices}


def test_p5_each_gpu_shares_its_root_with_four_efa():
    devs = simulate_node("p5.48xlarge", "n1")
    for gpu in devs["gpu"]:
        same_root = [e for e in devs["efa"] if e.attributes[PCIE_ROOT] == gpu.attributes[PCIE_ROOT]]
        assert len(same_root) == 4


def test_g6e_no_gpu_shares_a_root_with_an_efa():
    devs = simulate_node("g6e.48xlarge", "n1")
    assert not _roots(devs["gpu"]) & _roots(devs["efa"])


def test_trn2_neuron_and_efa_share_device_group_ids():
    devs = simulate_node("trn2.48xlarge", "n1")
    key = "resource.aws.com/devicegroup4_id"
    groups = {}
    for d in devs["neuron"]:
        groups.setdefault(d.attributes[key], []).append(d.name)
    assert len(groups) == 4 and all(len(v) == 4 for v in groups.values())
    assert {e.attributes[key] for e in devs["efa"]} == set(groups)


def test_trn1_two_neuron_devices_per_efa():
    devs = simulate_node("trn1.32xlarge", "n1")
    ones = [d.attributes["resource.aws.com/devicegroup1_id"] for d in devs["neuron"]]
    assert len(set(ones)) == 8 and all(ones.count(x) == 2 for x in ones)


def test_mig_layout_replaces_parent_gpus():
    devs = simulate_node("p5.48xlarge", "n1", mig_profile="1g.10gb")
    assert len(devs["gpu"]) == 56 and all(d.attributes["type"] == "mig" for d in devs["gpu"])
    with pytest.raises(KeyError, match="known: 1g.10gb"):
        simulate_node("p5.48xlarge", "n1", mig_profile="1g.5gb")
    with pytest.raises(KeyError, match="not MIG-capable"):
        simulate_node("g6e.48xlarge", "n1", mig_profile="1g.10gb")


def test_versions_are_semver():
    assert Version.from_loose("580.95.05").value == "580.95.5"
    assert Version.from_loose("9.0").value == "9.0.0"
    with pytest.raises(ValueError):
        Version.from_loose("abc")


def test_slices_split_at_128_and_count_is_right():
    devices = [Device(f"d-{i}") for i in range(300)]
    slices = resource_slices("gpu.nvidia.com", "node-a", devices, generation=3)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}
    assert {s["spec"]["pool"]["name"] for s in slices} == {"node-a"}


@pytest.mark.parametrize("name", sorted(INSTANCE_TYPES))
def test_every_catalog_type_simulates_unique_devices(name):
    it = get_instance_type(name)
    devs = simulate_node(name, "node-x")
    for family, items in devs.items():
        names = [d.name for d in items]
        assert len(names) == len(set(names)), family
        for d in items:
            assert len(d.attributes) + len(d.capacity) <= 32
    expected = "gpu" if it.gpu else "neuron"
    assert len(devs[expected]) == it.accelerator_count
    assert len(devs.get("efa", [])) == it.max_efa_interfaces
