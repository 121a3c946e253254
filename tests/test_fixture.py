"""`eks-dra fixture`: the host tree's layout, the command line and the helpers that change a tree."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from eks_dra.catalog import get_instance_type
from eks_dra.cli import main
from eks_dra.drivers.families import discover
from eks_dra.drivers.fixture import (
    add_devices,
    set_boot_id,
    set_efa_port_state,
    set_gpu_xid,
    set_neuron_error,
    unload_driver,
    write_fixture,
)
from eks_dra.drivers.framework import hosttree
from eks_dra.drivers.gpu import discovery as gpu_discovery
from eks_dra.errors import UserError


def test_cli_writes_a_tree(tmp_path, capsys):
    out = tmp_path / "p5"
    assert main(["fixture", "--instance-type", "p5.48xlarge", "--out", str(out), "--node-name", "n-1"]) == 0
    assert "8 GPU, 32 EFA" in capsys.readouterr().out
    host = json.loads((out / hosttree.FIXTURE_DIR / "host.json").read_text())
    assert host == {"instanceType": "p5.48xlarge", "nodeName": "n-1", "migProfile": None, "os": "al2023"}
    assert (out / hosttree.DMI_PRODUCT_NAME).read_text().strip() == "p5.48xlarge"
    assert discover("gpu", out, "n-1").ready


@pytest.mark.parametrize(("argv", "message"), [
    (["--instance-type", "p5.48xlarg"], "closest: p5.48xlarge"),
    (["--instance-type", "p5.48xlarge", "--mig-profile", "1g.5gb"], "known: 1g.10gb"),
    (["--instance-type", "g6e.48xlarge", "--mig-profile", "1g.10gb"], "not MIG-capable"),
])
def test_cli_bad_input_exits_2_with_a_clear_message(tmp_path, capsys, argv, message):
    assert main(["fixture", "--out", str(tmp_path / "x"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_refuses_a_directory_that_is_not_a_fixture(tmp_path, capsys):
    (tmp_path / "precious.txt").write_text("keep me")
    assert main(["fixture", "--instance-type", "g5.xlarge", "--out", str(tmp_path)]) == 2
    assert "is not a fixture host tree" in capsys.readouterr().err
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_cli_without_driver(tmp_path, capsys):
    assert main(["fixture", "--instance-type", "trn1.32xlarge", "--out", str(tmp_path / "t"),
                 "--without-driver"]) == 0
    assert "device drivers not loaded" in capsys.readouterr().out
    assert not (tmp_path / "t/sys/class/neuron_device").exists()
    assert not (tmp_path / "t/dev/neuron0").exists()


def test_layout_is_sysfs_like(tmp_path):
    root = write_fixture("p4d.24xlarge", tmp_path / "h")
    it = get_instance_type("p4d.24xlarge")
    gpu = it.accelerators[3].pci
    link = root / "sys/bus/pci/devices" / gpu.address
    assert link.is_symlink() and not os.path.isabs(os.readlink(link))
    real = Path(os.path.realpath(link))
    assert real.relative_to(os.path.realpath(root / "sys/devices")).parts[0] == gpu.root
    assert (real / "vendor").read_text() == "0x10de\n" and (real / "class").read_text() == "0x030200\n"
    assert Path(os.readlink(real / "driver")).name == "nvidia"
    info = (root / "proc/driver/nvidia/gpus" / gpu.address / "information").read_text()
    assert f"Bus Location: \t {gpu.address}" in info and "Device Minor: \t 3" in info
    assert "Kernel Module for x86_64  580.95.05" in (root / "proc/driver/nvidia/version").read_text()
    assert (root / "dev/nvidia3").is_file() and (root / "dev/nvidiactl").is_file()
    efa = it.efa_interfaces[0].pci
    ibdev = f"rdmap{int(efa.address.split(':')[1], 16)}s0"  # the efa driver's name: bus in decimal, slot
    ib = root / "sys/class/infiniband" / ibdev
    assert Path(os.path.realpath(ib / "device")).name == efa.address
    assert (ib / "ports/1/state").read_text() == "4: ACTIVE\n"
    assert (root / "sys/class/infiniband_verbs/uverbs0/ibdev").read_text() == ibdev + "\n"
    assert len((root / "proc/sys/kernel/random/boot_id").read_text().strip()) == 36
    # The ENA, the NVMe controller and six NVSwitches share the devices' vendors; discovery skips them.
    classes = sorted((p / "class").read_text() for p in (root / "sys/devices/pci0000:00").iterdir())
    assert classes == ["0x010802\n", "0x020000\n"] + ["0x068000\n"] * 6
    # Bridges sit on the bus too, and discovery must skip them.
    bridges = [p for p in (root / "sys/bus/pci/devices").iterdir() if (p / "class").read_text() == "0x060400\n"]
    assert bridges


def test_neuron_layout(tmp_path):
    root = write_fixture("trn2.48xlarge", tmp_path / "h")
    d = root / "sys/class/neuron_device/neuron5"
    assert (d / "core_count").read_text() == "8\n"
    assert (d / "info/architecture/instance_type").read_text() == "trn2.48xlarge\n"
    assert (d / "connected_devices").read_text() == "1, 4, 6, 9\n"  # 4x4 torus neighbours of (1, 1)
    assert (d / "stats/hardware/mem_ecc_uncorrected/total").read_text() == "0\n"
    assert Path(os.path.realpath(d / "device")).name == get_instance_type("trn2.48xlarge").accelerators[5].pci.address
    assert (root / "sys/module/neuron/version").read_text() == "2.25.4.0\n"


def test_mig_files(tmp_path):
    root = write_fixture("p5e.48xlarge", tmp_path / "h", mig_profile="3g.71gb")
    mig = json.loads((root / gpu_discovery.FIXTURE_MIG_FILE).read_text())
    assert len(mig["gpus"]) == 8 and all(len(v) == 2 for v in mig["gpus"].values())
    minors = (root / gpu_discovery.NVIDIA_MIG_MINORS).read_text().splitlines()
    assert minors[:2] == ["config 1", "monitor 2"] and len(minors) == 2 + 8 * 2 * 2
    assert (root / "proc/driver/nvidia/capabilities/gpu7/mig/gi2/ci0/access").is_file()


def test_rewriting_a_tree_is_idempotent_and_keeps_the_boot_id(tmp_path):
    root = write_fixture("g6.48xlarge", tmp_path / "h", node_name="a")
    boot = (root / "proc/sys/kernel/random/boot_id").read_text()
    before = [d.device for d in discover("gpu", root, "a").devices]
    write_fixture("g6.48xlarge", root, node_name="a")
    assert [d.device for d in discover("gpu", root, "a").devices] == before
    assert (root / "proc/sys/kernel/random/boot_id").read_text() == boot
    new = set_boot_id(root)
    assert new != boot.strip() and (root / "proc/sys/kernel/random/boot_id").read_text() == new + "\n"


def test_unload_and_reload_a_driver(tmp_path):
    root = write_fixture("p6-b200.48xlarge", tmp_path / "h")
    unload_driver(root, "gpu")
    assert "not loaded" in discover("gpu", root, "n").reason
    assert not any((root / "sys/bus/pci/devices" / a.pci.address / "driver").exists()
                   for a in get_instance_type("p6-b200.48xlarge").accelerators)
    unload_driver(root, "efa")
    assert not discover("efa", root, "n").ready
    add_devices(root)
    assert discover("gpu", root, "n").ready and discover("efa", root, "n").ready


@pytest.mark.parametrize("helper", [
    lambda r: set_efa_port_state(r, "rdmap999s0", False),
    lambda r: set_neuron_error(r, 99, 1),
])
def test_fault_helpers_name_a_missing_device(tmp_path, helper):
    root = write_fixture("trn1.32xlarge", tmp_path / "h")
    with pytest.raises(UserError, match="no such"):
        helper(root)


def test_gpu_xid_helper_writes_and_clears_the_fixture_file(tmp_path):
    root = write_fixture("g5.xlarge", tmp_path / "h")
    set_gpu_xid(root, 0, 79)
    assert (root / gpu_discovery.FIXTURE_XID_DIR / "gpu0").read_text() == "79\n"
    set_gpu_xid(root, 0, None)
    assert not (root / gpu_discovery.FIXTURE_XID_DIR / "gpu0").exists()


def test_helpers_refuse_a_tree_that_is_not_a_fixture(tmp_path):
    with pytest.raises(UserError, match="not a fixture host tree"):
        add_devices(tmp_path)
