"""ML workload kinds in `eks-dra plan`: each pod the controller creates gets its claims; gangs are all or
nothing; a kind the planner does not understand is reported and fails the plan. The manifests under
tests/planner/workloads/ are the upstream projects' examples (each file names its source)."""

from __future__ import annotations

import json
from pathlib import Path

from eks_dra import cli

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = Path(__file__).parent / "planner" / "workloads"


def _plan(capsys, *args: str) -> tuple[int, dict[str, dict], str]:
    code = cli.main(["plan", *args, "-o", "json"])
    out = capsys.readouterr()
    claims = {c["name"]: c for c in json.loads(out.out)["claims"]} if out.out else {}
    return code, claims, out.err


def _dev(capsys, name: str, *extra: str) -> tuple[int, dict[str, dict], str]:
    return _plan(capsys, "-c", "env=dev", "--config-dir", str(REPO / "config"), "--claims", str(WORKLOADS / name),
                 *extra)


def _p5(capsys, name: str) -> tuple[int, dict[str, dict], str]:
    return _plan(capsys, "--instance-type", "p5.48xlarge", "--claims", str(WORKLOADS / name))


def test_pytorchjob_gang_of_five_8_gpu_workers_does_not_fit_dev(capsys):
    # dev's gpu.nvidia.com devices: p5-dra 2 nodes x 8 H100 = 16, g6e-bottlerocket 1 x 8 L40S; p4d-mig publishes
    # only MIG devices (mig.nvidia.com). So 3 workers of 8 GPUs fit, 2 do not, and the gang of 5 starts none.
    code, claims, _ = _dev(capsys, "pytorchjob-5x8gpu.yaml")
    assert code == 1
    assert sorted(claims) == [f"pytorch-simple-worker-{i}-gpus" for i in range(5)]
    assert not any(c["allocated"] for c in claims.values())
    for i in range(5):
        assert "gang PyTorchJob kubeflow/pytorch-simple would start 3 of 5 pods and wait" in claims[
            f"pytorch-simple-worker-{i}-gpus"]["reason"]
    assert "needs 8 matching devices, at most 0 are free" in claims["pytorch-simple-worker-3-gpus"]["reason"]


def test_jobset_gang_that_does_not_fit_whole_gives_its_devices_back(capsys):
    # One p5 (8 GPUs): 2 of the 3 workers (4 GPUs each) fit, the third does not; the driver has no claim.
    # The JobSet waits with 3 of 4 pods, so the Pod after it gets all 8 GPUs.
    code, claims, _ = _p5(capsys, "jobset-3x4gpu.yaml")
    assert code == 1
    workers = [f"paralleljobs-workers-0-{k}-gpus" for k in range(3)]
    assert all(not claims[w]["allocated"] for w in workers)
    assert "gang JobSet default/paralleljobs would start 3 of 4 pods and wait" in claims[workers[0]]["reason"]
    assert claims["after-gpus"]["allocated"] and len(claims["after-gpus"]["devices"]) == 8


def test_leaderworkerset_each_group_is_a_gang(capsys):
    # 2 groups of leader + 1 worker, 4 GPUs each, on one p5: group 0 takes all 8 GPUs, group 1 waits whole.
    code, claims, _ = _p5(capsys, "lws-2x2.yaml")
    assert code == 1
    name = "leaderworkerset-multi-template"
    assert claims[f"{name}-0-gpus"]["allocated"] and claims[f"{name}-0-1-gpus"]["allocated"]
    assert {d["device"] for c in (f"{name}-0-gpus", f"{name}-0-1-gpus") for d in claims[c]["devices"]} == {
        f"gpu-{i}" for i in range(8)}
    for claim in (f"{name}-1-gpus", f"{name}-1-1-gpus"):
        assert not claims[claim]["allocated"]
        assert f"gang LeaderWorkerSet default/{name} group 1 would start 0 of 2 pods" in claims[claim]["reason"]


def test_unknown_kind_is_reported_and_fails_unless_ignored(capsys):
    code, claims, err = _dev(capsys, "unknown-kind.yaml")
    assert code == 1
    assert "Foo train/x: kind not understood (example.com/v1); its pods are not planned" in err
    assert "ConfigMap" not in err
    assert claims == {}  # its template is not planned as a pod of its own
    code, claims, err = _dev(capsys, "unknown-kind.yaml", "--ignore-unknown")
    assert code == 0 and "Foo train/x: kind not understood" in err and claims == {}


def test_typo_in_a_pytorchjob_is_a_one_line_error(capsys):
    code = cli.main(["plan", "-c", "env=dev", "--config-dir", str(REPO / "config"), "--claims",
                     str(WORKLOADS / "pytorchjob-typo.yaml")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0 and "Traceback" not in err
    assert "pytorchjob-typo.yaml: PyTorchJob kubeflow/pytorch-simple: spec.pytorchReplicaSpecs.Worker.replcas: " \
           "unknown field" in err


def test_trainjob_without_its_runtime_is_not_planned(capsys):
    code, claims, err = _p5(capsys, "trainjob-no-runtime.yaml")
    assert code == 1 and claims == {}
    assert "TrainJob ml/train: its pods are not planned: ClusterTrainingRuntime torch-distributed" in err
