"""`eks-dra plan` as the README shows it: built-in DeviceClasses, repeated --claims, natural device order, and a
reader that closes the pipe early."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from eks_dra import cli
from eks_dra.devices import DEFAULT_DRIVER_NAMES
from eks_dra.devices.neuron import neuron_device_name
from eks_dra.planner.report import natural_key

NEURON_CLASS = DEFAULT_DRIVER_NAMES.class_name("neuron")
EFA_CLASS = DEFAULT_DRIVER_NAMES.class_name("efa")


def _claim(name: str, cls: str, count: int = 1) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "d", "exactly": {"deviceClassName": cls, "count": count}}]}}}


def test_claims_may_be_given_more_than_once_without_any_device_class(tmp_path, capsys):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump(_claim("a", NEURON_CLASS, 4)))
    b.write_text(yaml.safe_dump(_claim("b", EFA_CLASS, 2)))
    assert cli.main(["plan", "--instance-type", "trn2.48xlarge", "--claims", str(a), "--claims", str(b),
                     "--output", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in out["claims"]] == ["a", "b"]  # the second --claims no longer drops the first


def test_devices_are_shown_in_natural_order(tmp_path, capsys):
    path = tmp_path / "all.yaml"
    path.write_text(yaml.safe_dump(_claim("all", NEURON_CLASS, 16)))
    assert cli.main(["plan", "--instance-type", "trn2.48xlarge", "--claims", str(path), "--output", "json"]) == 0
    devices = [d["device"] for d in json.loads(capsys.readouterr().out)["claims"][0]["devices"]]
    assert devices == [neuron_device_name(i) for i in range(16)]  # neurondevice2 before neurondevice10
    assert cli.main(["plan", "--instance-type", "trn2.48xlarge", "--claims", str(path)]) == 0
    shown = [line.split()[-1].split("/")[-1] for line in capsys.readouterr().out.splitlines()[1:17]]
    assert shown == [neuron_device_name(i) for i in range(16)]
    assert sorted(["gpu-10", "gpu-2", "gpu-1"], key=natural_key) == ["gpu-1", "gpu-2", "gpu-10"]


def test_a_closed_pipe_ends_quietly(tmp_path):
    # Enough output (about 300 kB of JSON) that the writer is still writing when the reader goes away.
    path = tmp_path / "many.yaml"
    path.write_text(yaml.safe_dump_all([_claim(f"efa-{i}", EFA_CLASS) for i in range(1000)]))
    proc = subprocess.Popen([sys.executable, "-m", "eks_dra.cli", "plan", "--instance-type", "p5.48xlarge",
                             "--nodes", "32", "--claims", str(path), "--output", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(__file__).resolve().parents[1])
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(100)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
