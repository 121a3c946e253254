"""ML workload kinds in `eks-dra plan`: each pod the controller creates gets its claims; gangs are all or
nothing; a kind the planner does not understand is reported and fails the plan. The manifests under
tests/planner/workloads/ are the upstream projects' examples (each file names its source).

Expected allocations are worked by hand from the instance types: p5.48xlarge has 8 GPUs and 32 EFAs, 4 on
each GPU's PCIe root; trn2.48xlarge 16 Neuron devices and 16 EFAs, 4 of each per devicegroup4_id; g6e.48xlarge
8 GPUs. `-c env=dev` plans p5-dra (2 nodes), trn2-dra (2), g6e-bottlerocket (1) and p4d-mig (1, MIG devices
only), in that order. Ray is planned at the worker count KubeRay runs; Volcano as a gang of minAvailable.
"""

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


def _table(capsys, *args: str) -> tuple[int, str]:
    code = cli.main(["plan", *args, "-o", "table"])
    return code, capsys.readouterr().out


def _dev_args(*files: Path) -> list[str]:
    return ["-c", "env=dev", "--config-dir", str(REPO / "config"), "--claims", *map(str, files)]


def _p5_args(nodes: int, *files: Path) -> list[str]:
    return ["--instance-type", "p5.48xlarge", "--nodes", str(nodes), "--claims", *map(str, files)]


def _devices(claim: dict, request: str | None = None) -> list[str]:
    return [d["device"] for d in claim["devices"] if request is None or d["request"] == request]


def _edited(tmp_path: Path, name: str, old: str, new: str) -> Path:
    text = (WORKLOADS / name).read_text()
    assert text.count(old) == 1
    path = tmp_path / name
    path.write_text(text.replace(old, new))
    return path


def test_raycluster_runs_min_replicas_when_replicas_is_below_it(capsys):
    # replicas 1, minReplicas 2: KubeRay starts 2 workers of 8 GPUs, one per p5; the head claims nothing.
    args = _p5_args(2, WORKLOADS / "raycluster-min-replicas.yaml")
    code, claims, err = _plan(capsys, *args)
    assert code == 0
    workers = [f"raycluster-kuberay-workergroup-worker-{k}-gpus" for k in range(2)]
    assert sorted(claims) == workers
    for k, claim in enumerate(workers):
        assert claims[claim]["node"] == f"p5.48xlarge-{k}"
        assert _devices(claims[claim]) == [f"gpu-{i}" for i in range(8)]
    said = ("RayCluster default/raycluster-kuberay: spec.workerGroupSpecs[0] (workergroup): 2 worker pods planned: "
            "minReplicas 2, as replicas 1 is below it")
    assert said in err
    code, table = _table(capsys, *args)
    assert code == 0 and f"warning: tests/planner/workloads/raycluster-min-replicas.yaml: {said}" in table.replace(
        str(WORKLOADS) + "/", "tests/planner/workloads/")
    assert "RayCluster default/raycluster-kuberay: 2 of 2 pods fit" in table


def test_rayjob_runs_max_replicas_when_replicas_is_above_it(capsys):
    # replicas 3, maxReplicas 2: 2 workers of 8 GPUs, on p5-dra-0 and p5-dra-1; none goes on to g6e.
    code, claims, err = _plan(capsys, *_dev_args(WORKLOADS / "rayjob-max-replicas.yaml"))
    assert code == 0
    assert {name: c["node"] for name, c in claims.items()} == {
        "rayjob-sample-small-group-worker-0-gpus": "p5-dra-0", "rayjob-sample-small-group-worker-1-gpus": "p5-dra-1"}
    assert all(len(c["devices"]) == 8 for c in claims.values())
    assert ("RayJob default/rayjob-sample: spec.rayClusterSpec.workerGroupSpecs[0] (small-group): 2 worker pods "
            "planned: maxReplicas 2, as replicas 3 is above it") in err


def test_volcano_job_starts_with_min_available_of_its_pods(capsys):
    # ps (no claim) + 4 workers of 8 GPUs on 2 p5s: the ps and workers 0-1 run, 3 >= minAvailable 3, so the
    # job starts; workers 2-3 stay pending for want of GPUs (exit 1), not for the gang.
    args = _p5_args(2, WORKLOADS / "volcano-min-available.yaml")
    code, claims, _ = _plan(capsys, *args)
    assert code == 1
    name = "tensorflow-benchmark-worker-{}-gpus"
    assert [claims[name.format(k)]["node"] for k in range(4)] == ["p5.48xlarge-0", "p5.48xlarge-1", None, None]
    assert all(len(claims[name.format(k)]["devices"]) == 8 for k in range(2))
    for k in (2, 3):
        reason = claims[name.format(k)]["reason"]
        assert "request gpus needs 8 matching devices, at most 0 are free" in reason and "gang" not in reason
    code, table = _table(capsys, *args)
    assert "Job default/tensorflow-benchmark: 2 of 4 pods fit; 2 do not" in table
    assert "would start" not in table


def test_volcano_job_below_min_available_starts_none(capsys, tmp_path):
    # minAvailable 4: the same 3 pods can run, fewer than 4, so none runs and both p5s stay free.
    path = _edited(tmp_path, "volcano-min-available.yaml", "minAvailable: 3", "minAvailable: 4")
    code, claims, _ = _plan(capsys, *_p5_args(2, path))
    assert code == 1
    assert not any(c["allocated"] for c in claims.values())
    assert ("gang Job default/tensorflow-benchmark would start 3 of 5 pods and wait (minAvailable 4)"
            in claims["tensorflow-benchmark-worker-0-gpus"]["reason"])
    code, table = _table(capsys, *_p5_args(2, path))
    assert "Job default/tensorflow-benchmark: would start 3 of 5 pods and wait" in table
    assert "gpu.nvidia.com/gpu 0 used, 16 free" in table


def test_mpijob_workers_get_a_whole_p5_each_gpu_with_the_efas_on_its_pcie_root(capsys):
    # Launcher (no claim) + 2 workers, each 2 claims of 4 (GPU + 4 EFA) pairs: worker k fills p5-dra-k.
    code, claims, _ = _plan(capsys, *_dev_args(WORKLOADS / "mpijob-2x-p5-aligned.yaml"))
    assert code == 0
    assert sorted(claims) == [f"pi-worker-{k}-accel-{x}" for k in range(2) for x in "ab"]
    for k in range(2):
        pod = [claims[f"pi-worker-{k}-accel-{x}"] for x in "ab"]
        assert {c["node"] for c in pod} == {f"p5-dra-{k}"}
        gpus = [d for c in pod for d in c["devices"] if d["driver"] == "gpu.nvidia.com"]
        efas = [d for c in pod for d in c["devices"] if d["driver"] == "dra.net"]
        assert sorted(d["device"] for d in gpus) == sorted(f"gpu-{i}" for i in range(8))
        assert len({d["device"] for d in efas}) == 32
        for claim in pod:
            for i in range(4):
                (gpu,) = [d for d in claim["devices"] if d["request"] == f"gpu-{i}"]
                pair = [d for d in claim["devices"] if d["request"] == f"efa-{i}"]
                root = gpu["attributes"]["resource.kubernetes.io/pcieRoot"]
                assert len(pair) == 4 and {d["attributes"]["resource.kubernetes.io/pcieRoot"] for d in pair} == {root}


def test_tfjob_two_workers_of_four_gpus_share_the_first_p5(capsys):
    code, claims, _ = _plan(capsys, *_dev_args(WORKLOADS / "tfjob-2x4gpu.yaml"))
    assert code == 0
    assert {n: (c["node"], _devices(c)) for n, c in claims.items()} == {
        "tfjob-simple-worker-0-gpus": ("p5-dra-0", [f"gpu-{i}" for i in range(4)]),
        "tfjob-simple-worker-1-gpus": ("p5-dra-0", [f"gpu-{i}" for i in range(4, 8)]),
    }


def test_xgboostjob_master_and_workers_are_one_gang(capsys):
    # Master + 2 workers of 4 GPUs on one p5 (8 GPUs): 2 of the 3 fit, so none runs.
    args = _p5_args(1, WORKLOADS / "xgboostjob-3x4gpu.yaml")
    code, claims, _ = _plan(capsys, *args)
    assert code == 1
    assert sorted(claims) == [f"xgboost-dist-iris-test-train-{p}-gpus" for p in ("master-0", "worker-0", "worker-1")]
    for claim in claims.values():
        assert not claim["allocated"]
        assert "gang XGBoostJob default/xgboost-dist-iris-test-train would start 2 of 3 pods and wait (all of them)" \
            in claim["reason"]
    code, table = _table(capsys, *args)
    assert "XGBoostJob default/xgboost-dist-iris-test-train: would start 2 of 3 pods and wait" in table


def test_trainjob_with_its_cluster_training_runtime_fills_both_trn2(capsys):
    # numNodes 8, each node 4 Neuron + their 4 EFAs: 4 pods per trn2.48xlarge (16 Neuron, 16 EFA), 2 nodes.
    code, claims, _ = _plan(capsys, *_dev_args(WORKLOADS / "trainjob-runtime-trn2.yaml"))
    assert code == 0
    assert sorted(claims) == [f"train-node-0-{k}-accel" for k in range(8)]
    for k in range(8):
        claim = claims[f"train-node-0-{k}-accel"]
        assert claim["node"] == f"trn2-dra-{k // 4}"
        assert len(_devices(claim, "neurons")) == 4 and len(_devices(claim, "efas")) == 4
        groups = {d["attributes"]["resource.aws.com/devicegroup4_id"] for d in claim["devices"]}
        assert len(groups) == 1


def test_trainjob_of_nine_nodes_does_not_start(capsys, tmp_path):
    # 9 x 4 Neuron > 32 on the two trn2: the JobSet the trainer builds is one gang, 8 of 9 would start.
    path = _edited(tmp_path, "trainjob-runtime-trn2.yaml", "numNodes: 8", "numNodes: 9")
    code, claims, _ = _plan(capsys, *_dev_args(path))
    assert code == 1
    assert len(claims) == 9 and not any(c["allocated"] for c in claims.values())
    assert "gang TrainJob ml/train would start 8 of 9 pods and wait (all of them)" in claims[
        "train-node-0-0-accel"]["reason"]
