"""Discovery on fixture host trees: what the drivers publish is what the planner simulates (DESIGN.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_discovery_fakes import FakeNvml

from eks_dra.catalog import INSTANCE_TYPES, get_instance_type
from eks_dra.devices import FAMILIES, PCIE_ROOT, node_facts, simulate_node
from eks_dra.devices.gpu import DEFAULT_DRIVER_VERSION, PARENT_UUID
from eks_dra.devices.neuron import neuron_device_name
from eks_dra.drivers.families import discover
from eks_dra.drivers.fixture import add_devices, remove_devices, unload_driver, write_fixture
from eks_dra.drivers.framework import hosttree
from eks_dra.drivers.framework.hosttree import DiscoveryError, pcie_root
from eks_dra.drivers.gpu import discovery as gpu_discovery
from eks_dra.drivers.gpu.host import GpuHost

NODE = "ip-10-0-1-23.ec2.internal"


def _assert_same_as_planner(root: Path, instance_type: str, mig_profile: str | None = None, nvml=None) -> None:
    expected = simulate_node(instance_type, NODE, mig_profile=mig_profile)
    for family in FAMILIES:
        inventory = discover(family, root, NODE, nvml=nvml if family == "gpu" else None)
        got = {d.device.name: d.device for d in inventory.devices}
        want = {d.name: d for d in expected.get(family, [])}
        assert got == want, (family, sorted(set(got) ^ set(want)))
        # Ready exactly when the family exists on the node; never ready with an empty pool.
        assert inventory.ready == bool(want), (family, inventory.reason)
        for d in inventory.devices:
            assert d.healthy, d.health_reason
            for node in d.device_nodes:
                assert (root / node.lstrip("/")).exists(), node


@pytest.mark.parametrize("instance_type", sorted(INSTANCE_TYPES))
def test_fixture_discovery_equals_simulation(tmp_path, instance_type):
    root = write_fixture(instance_type, tmp_path / "host", node_name=NODE)
    _assert_same_as_planner(root, instance_type)


MIG_CASES = [(name, p.name) for name, it in sorted(INSTANCE_TYPES.items()) if it.mig_capable
             for p in it.gpu.mig_profiles if name in ("p5.48xlarge", "p4d.24xlarge") or p == it.gpu.mig_profiles[0]]


@pytest.mark.parametrize(("instance_type", "profile"), MIG_CASES)
def test_fixture_discovery_with_mig_equals_simulation(tmp_path, instance_type, profile):
    root = write_fixture(instance_type, tmp_path / "host", node_name=NODE, mig_profile=profile)
    _assert_same_as_planner(root, instance_type, profile)


@pytest.mark.parametrize(("instance_type", "profile"), [("p5.48xlarge", None), ("p5e.48xlarge", "1g.18gb"),
                                                         ("g6e.48xlarge", None), ("p4d.24xlarge", "3g.20gb")])
def test_nvml_path_equals_simulation(tmp_path, instance_type, profile):
    """The NVML code path (fake NVML with the facts' values) builds the same devices as the procfs path."""
    root = write_fixture(instance_type, tmp_path / "host", node_name=NODE, mig_profile=profile)
    nvml = FakeNvml.from_facts(node_facts(instance_type, NODE, mig_profile=profile))
    _assert_same_as_planner(root, instance_type, profile, nvml=nvml)


def test_discovered_devices_carry_nodes_env_and_parents(tmp_path):
    root = write_fixture("p5.48xlarge", tmp_path / "h", node_name=NODE, mig_profile="3g.40gb")
    gpu = discover("gpu", root, NODE)
    assert gpu.common_device_nodes == ["/dev/nvidia-uvm-tools", "/dev/nvidia-uvm", "/dev/nvidiactl"]  # nvcdi's order
    mig = gpu.by_name()["gpu-3-mig-3g-40gb-1"]
    assert mig.parent == "gpu-3"
    assert mig.device_nodes[0] == "/dev/nvidia3" and len(mig.device_nodes) == 3
    assert all(n.startswith("/dev/nvidia-caps/nvidia-cap") for n in mig.device_nodes[1:])
    # No per-device NVIDIA_VISIBLE_DEVICES: the spec-level "void" keeps an nvidia runtime from re-injecting.
    assert mig.env == {}
    parent_uuid = mig.device.attributes[PARENT_UUID]
    assert [h["args"][1:] for h in mig.hooks] == [["apply-cuda-memory-limits", "--driver-root", "/", "--gpu-id",
                                                   parent_uuid]]
    assert "NVIDIA_VISIBLE_DEVICES=void" in gpu.common_edits["env"]
    libcuda = f"/usr/lib64/libcuda.so.{DEFAULT_DRIVER_VERSION}"
    assert {"hostPath": libcuda, "containerPath": libcuda, "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"]} \
        in gpu.common_edits["mounts"]
    efa = discover("efa", root, NODE)
    # Each EFA: the RDMA connection manager and its own verbs device, as DRANET's container edits.
    assert all(d.device_nodes[0] == "/dev/infiniband/rdma_cm" and len(d.device_nodes) == 2 for d in efa.devices)
    verbs = {d.device_nodes[1] for d in efa.devices}
    assert len(verbs) == 32 and all(n.startswith("/dev/infiniband/uverbs") for n in verbs)
    neuron = discover("neuron", write_fixture("trn2.48xlarge", tmp_path / "t"), NODE).by_name()[neuron_device_name(5)]
    assert neuron.device_nodes == ["/dev/neuron5"] and neuron.env == {"AWS_NEURON_VISIBLE_DEVICES": "5"}


def test_trn2_neuron_and_efa_device_groups_align(tmp_path):
    root = write_fixture("trn2.48xlarge", tmp_path / "h", node_name=NODE)
    neurons = discover("neuron", root, NODE).by_name()
    efas = {d.device.attributes["pciAddress"]: d for d in discover("efa", root, NODE).devices}
    for d in neurons.values():
        bdf = d.device.attributes["resource.aws.com/devicegroup1_id"]
        for size in (1, 4, 8, 16):
            key = f"resource.aws.com/devicegroup{size}_id"
            assert efas[bdf].device.attributes[key] == d.device.attributes[key]


# --- pcieRoot ----------------------------------------------------------------------------------------

def _pci_files(d: Path, vendor="0x10de", device="0x2330", cls="0x030200", numa="1") -> None:
    d.mkdir(parents=True)
    for name, value in (("vendor", vendor), ("device", device), ("class", cls), ("numa_node", numa)):
        (d / name).write_text(value + "\n")


def test_pcie_root_follows_the_bus_symlink_through_bridges(tmp_path):
    real = tmp_path / "sys/devices/pci0000:44/0000:44:01.0/0000:45:02.0/0000:46:00.0"
    _pci_files(real)
    link = tmp_path / "sys/bus/pci/devices/0000:46:00.0"
    link.parent.mkdir(parents=True)
    os.symlink(os.path.relpath(real, link.parent), link)
    assert pcie_root(tmp_path, "0000:46:00.0") == "pci0000:44"
    f = hosttree.read_pci_function(tmp_path, "0000:46:00.0")
    assert (f.vendor, f.device, f.class_code, f.numa_node, f.root) == (0x10DE, 0x2330, 0x030200, 1, "pci0000:44")


def test_pcie_root_of_an_absolute_link_is_read_from_the_link_text(tmp_path):
    # A host tree mounted at another path: the kernel's link is relative, a copied one may be absolute.
    link = tmp_path / "sys/bus/pci/devices/0008:01:00.0"
    link.parent.mkdir(parents=True)
    os.symlink("/sys/devices/pci0008:00/0008:00:01.0/0008:01:00.0", link)
    assert pcie_root(tmp_path, "0008:01:00.0") == "pci0008:00"


@pytest.mark.parametrize("target", ["../../../devices/platform/soc/0000:01:00.0", None])
def test_pcie_root_refuses_paths_outside_a_pci_root(tmp_path, target):
    link = tmp_path / "sys/bus/pci/devices/0000:01:00.0"
    if target is None:
        _pci_files(link)  # a plain directory, not the kernel's symlink
    else:
        (tmp_path / "sys/devices/platform/soc/0000:01:00.0").mkdir(parents=True)
        link.parent.mkdir(parents=True)
        os.symlink(target, link)
    with pytest.raises(DiscoveryError, match="cannot derive resource.kubernetes.io/pcieRoot"):
        pcie_root(tmp_path, "0000:01:00.0")


def test_fixture_roots_match_the_catalog(tmp_path):
    root = write_fixture("p5en.48xlarge", tmp_path / "h")
    it = get_instance_type("p5en.48xlarge")
    for acc in it.accelerators:
        assert pcie_root(root, acc.pci.address) == acc.pci.root
    roots = [d.device.attributes[PCIE_ROOT] for d in discover("gpu", root, NODE).devices]
    assert roots == [a.pci.root for a in it.accelerators]


# --- readiness ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("instance_type", "family", "words"), [
    ("p5.48xlarge", "gpu", "NVIDIA kernel driver not loaded"),
    ("p5.48xlarge", "efa", "efa kernel driver has not registered"),
    ("trn2.48xlarge", "neuron", "neuron kernel driver is not loaded"),
    ("trn2.48xlarge", "efa", "efa kernel driver has not registered"),
])
def test_not_ready_before_the_device_driver_loads_then_full_inventory(tmp_path, instance_type, family, words):
    root = write_fixture(instance_type, tmp_path / "h", node_name=NODE, without_driver=True)
    before = discover(family, root, NODE)
    assert not before.ready and words in before.reason and before.devices == []
    add_devices(root, family)
    after = discover(family, root, NODE)
    assert after.ready, after.reason
    by_name = sorted(simulate_node(instance_type, NODE)[family], key=lambda d: d.name)
    assert sorted((d.device for d in after.devices), key=lambda d: d.name) == by_name


@pytest.mark.parametrize(("family", "count", "total"), [("gpu", 3, 8), ("efa", 5, 32)])
def test_partial_devices_are_never_ready(tmp_path, family, count, total):
    root = write_fixture("p5.48xlarge", tmp_path / "h", node_name=NODE)
    remove_devices(root, family, count)
    inventory = discover(family, root, NODE)
    assert not inventory.ready
    assert f"found {total - count} of {total} expected" in inventory.reason
    add_devices(root, family)
    assert discover(family, root, NODE).ready


def test_partial_neuron_devices_and_catalog_count(tmp_path):
    root = write_fixture("trn1.32xlarge", tmp_path / "h", node_name=NODE)
    remove_devices(root, "neuron", 1)
    inventory = discover("neuron", root, NODE)
    assert not inventory.ready and "found 15 of 16 expected Neuron devices" in inventory.reason
    # Even with every PCI function bound, the catalog's count for the instance type is the floor.
    unload_driver(root, "neuron")
    assert "not loaded" in discover("neuron", root, NODE).reason


def test_catalog_count_applies_when_pci_functions_are_missing_too(tmp_path):
    root = write_fixture("p5.48xlarge", tmp_path / "h", node_name=NODE)
    gone = get_instance_type("p5.48xlarge").accelerators[7].pci.address
    (root / "sys/bus/pci/devices" / gone).unlink()  # the GPU fell off the bus entirely
    inventory = discover("gpu", root, NODE)
    assert not inventory.ready and "found 7 of 8 expected GPU devices" in inventory.reason


def test_unknown_instance_type_expects_what_the_pci_bus_has(tmp_path):
    root = write_fixture("g6.12xlarge", tmp_path / "h", node_name=NODE)
    (root / hosttree.DMI_PRODUCT_NAME).write_text("some-future.48xlarge\n")
    inventory = discover("gpu", root, NODE)
    assert inventory.ready and len(inventory.devices) == 4
    # An explicit instance type wins over DMI.
    assert not discover("gpu", root, NODE, instance_type="g6.48xlarge").ready


def test_family_absent_is_not_ready(tmp_path):
    root = write_fixture("inf2.48xlarge", tmp_path / "h")
    for family in ("gpu", "efa"):
        inventory = discover(family, root, NODE)
        assert not inventory.ready and inventory.devices == [] and "found" in inventory.reason


def test_missing_device_nodes_block_readiness(tmp_path):
    root = write_fixture("p4d.24xlarge", tmp_path / "h")
    (root / "dev/nvidiactl").unlink()
    assert "/dev/nvidiactl missing" in discover("gpu", root, NODE).reason
    (root / "dev/infiniband/uverbs2").unlink()
    assert "no uverbs device node" in discover("efa", root, NODE).reason
    root = write_fixture("inf2.xlarge", tmp_path / "i")
    (root / "dev/neuron0").unlink()
    assert "/dev/neuron0 missing" in discover("neuron", root, NODE).reason


def test_mig_mode_without_mig_devices_is_not_ready(tmp_path):
    root = write_fixture("p5.48xlarge", tmp_path / "h", node_name=NODE)
    nvml = FakeNvml.from_facts(node_facts("p5.48xlarge", NODE))
    nvml.replace_gpu(2, mig_enabled=True)
    inventory = discover("gpu", root, NODE, nvml=nvml)
    assert not inventory.ready and "MIG mode is on for GPU" in inventory.reason


def test_real_node_mig_without_nvml_is_not_ready(tmp_path, fresh_shared_nvml):
    root = write_fixture("p5.48xlarge", tmp_path / "h", node_name=NODE, mig_profile="1g.10gb")
    # Make the tree look like a real node whose NVML does not load: no fixture marker, no NVML.
    (root / gpu_discovery.FIXTURE_MIG_FILE).unlink()
    for f in (root / hosttree.FIXTURE_DIR).iterdir():
        f.unlink()
    (root / hosttree.FIXTURE_DIR).rmdir()
    # The real loading path (fresh_shared_nvml): the fixture's libnvidia-ml.so.1 is a code-free ELF that dlopen()
    # refuses.
    host = GpuHost.for_node(root)
    reports: list[tuple[str, str]] = []
    host.on_unavailable = lambda tool, message: reports.append((tool, message))
    inventory = discover("gpu", root, NODE, host=host)
    assert not inventory.ready and "MIG instances but NVML is unavailable" in inventory.reason
    library = str(root / "usr/lib64/libnvidia-ml.so.1")
    assert library in inventory.reason
    assert reports == [("nvml", f"cannot load {library}: {library}: ELF load command address/offset not "
                                "page-aligned")]
    discover("gpu", root, NODE, host=host)
    assert len(reports) == 1  # said once


def test_nvml_failure_falls_back_to_procfs(tmp_path):
    root = write_fixture("g6e.48xlarge", tmp_path / "h", node_name=NODE)
    nvml = FakeNvml.from_facts(node_facts("g6e.48xlarge", NODE))
    nvml.fail_with = RuntimeError("NVML_ERROR_UNKNOWN")
    inventory = discover("gpu", root, NODE, nvml=nvml)
    assert inventory.ready
    assert [d.device for d in inventory.devices] == simulate_node("g6e.48xlarge", NODE)["gpu"]
    assert any("NVML failed" in p for p in inventory.problems)


def test_nvml_gpu_absent_from_sysfs_is_reported(tmp_path):
    root = write_fixture("g6e.12xlarge", tmp_path / "h", node_name=NODE)
    nvml = FakeNvml.from_facts(node_facts("g6e.12xlarge", NODE))
    nvml.replace_gpu(1, pci_address="0000:ee:00.0")
    inventory = discover("gpu", root, NODE, nvml=nvml)
    assert not inventory.ready
    assert any("0000:ee:00.0" in p and "not in /sys/bus/pci/devices" in p for p in inventory.problems)


# --- malformed host data: a clear reason, never a crash ---------------------------------------------

def _bdf(instance_type: str, index: int) -> str:
    return get_instance_type(instance_type).accelerators[index].pci.address


@pytest.mark.parametrize(("file", "content", "message"), [
    ("vendor", "nvidia\n", "expected a hex number"),
    ("class", "", "expected a hex number"),
    ("numa_node", "zero\n", "expected an integer"),
])
def test_malformed_pci_files_skip_the_device(tmp_path, file, content, message):
    root = write_fixture("p4de.24xlarge", tmp_path / "h", node_name=NODE)
    bdf = _bdf("p4de.24xlarge", 6)
    (root / "sys/bus/pci/devices" / bdf / file).write_text(content)
    inventory = discover("gpu", root, NODE)
    assert not inventory.ready and len(inventory.devices) == 7
    assert any(bdf in p and message in p for p in inventory.problems), inventory.problems


def test_unreadable_pci_file_is_a_problem_not_a_crash(tmp_path):
    root = write_fixture("g5.48xlarge", tmp_path / "h", node_name=NODE)
    bdf = _bdf("g5.48xlarge", 0)
    vendor = root / "sys/bus/pci/devices" / bdf / "vendor"
    vendor.unlink()
    vendor.mkdir()  # reading a directory fails with IsADirectoryError
    inventory = discover("gpu", root, NODE)
    assert not inventory.ready and any("cannot read" in p for p in inventory.problems)


@pytest.mark.parametrize(("content", "message"), [
    ("Model: NVIDIA H100 80GB HBM3\n", "needs 'Device Minor' and 'GPU UUID'"),
    ("Device Minor: x\nGPU UUID: GPU-1\n", "needs 'Device Minor' and 'GPU UUID'"),
])
def test_malformed_nvidia_information_skips_the_gpu(tmp_path, content, message):
    root = write_fixture("p5.48xlarge", tmp_path / "h", node_name=NODE)
    (root / "proc/driver/nvidia/gpus" / _bdf("p5.48xlarge", 4) / "information").write_text(content)
    inventory = discover("gpu", root, NODE)
    assert not inventory.ready and any(message in p for p in inventory.problems)


def test_malformed_driver_version_and_mig_file(tmp_path):
    root = write_fixture("p5.48xlarge", tmp_path / "h", node_name=NODE, mig_profile="7g.80gb")
    (root / gpu_discovery.FIXTURE_MIG_FILE).write_text("{\"gpus\": [1, 2]}")
    inventory = discover("gpu", root, NODE)
    assert not inventory.ready and "malformed fixture MIG file" in inventory.reason
    (root / gpu_discovery.NVIDIA_VERSION_FILE).write_text("garbage\n")
    assert "no driver version" in discover("gpu", root, NODE).reason


def test_unknown_gpu_model_without_nvml_names_the_fix(tmp_path):
    root = write_fixture("g6.xlarge", tmp_path / "h", node_name=NODE)
    (root / "sys/bus/pci/devices" / _bdf("g6.xlarge", 0) / "device").write_text("0x9999\n")
    inventory = discover("gpu", root, NODE)
    assert not inventory.ready and "0x9999 is not in the catalog" in inventory.reason


def test_non_efa_rdma_devices_and_other_vendors_are_ignored(tmp_path):
    root = write_fixture("p4d.24xlarge", tmp_path / "h", node_name=NODE)
    mlx = root / "sys/devices/pci0000:30/0000:31:00.0"
    _pci_files(mlx, vendor="0x15b3", device="0x101b", cls="0x020700", numa="0")
    os.symlink(os.path.relpath(mlx, root / "sys/bus/pci/devices"), root / "sys/bus/pci/devices/0000:31:00.0")
    (mlx / "infiniband/mlx5_0").mkdir(parents=True)
    os.symlink("../..", mlx / "infiniband/mlx5_0/device")
    os.symlink(os.path.relpath(mlx / "infiniband/mlx5_0", root / "sys/class/infiniband"),
               root / "sys/class/infiniband/mlx5_0")
    inventory = discover("efa", root, NODE)
    assert inventory.ready and len(inventory.devices) == 4
    assert all(d.device.attributes["rdmaDevice"] != "mlx5_0" for d in inventory.devices)


@pytest.mark.parametrize("instance_type", ["trn1.32xlarge", "inf2.48xlarge"])
def test_virtual_neuron_class_devices_map_by_bus_order(tmp_path, instance_type):
    """The Neuron driver documents /sys/devices/virtual/neuron_device (no `device` link): bus order."""
    root = write_fixture(instance_type, tmp_path / "h", node_name=NODE)
    for d in (root / "sys/class/neuron_device").iterdir():
        (d / "device").unlink()
    _assert_same_as_planner(root, instance_type)


def test_unknown_family_is_a_programming_error(tmp_path):
    with pytest.raises(ValueError, match="unknown device family 'tpu'"):
        discover("tpu", tmp_path, NODE)  # type: ignore[arg-type]


def test_parsers():
    info = gpu_discovery.parse_nvidia_information("Model: \t\t NVIDIA H200\nGPU UUID: \t GPU-abc\nDevice Minor: \t 3\n")
    assert info == {"Model": "NVIDIA H200", "GPU UUID": "GPU-abc", "Device Minor": "3"}
    legacy = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n"
    assert gpu_discovery.parse_nvidia_version(legacy) == "535.183.01"
    open_km = "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  (x@y)  date\n"
    assert gpu_discovery.parse_nvidia_version(open_km) == "580.95.05"
