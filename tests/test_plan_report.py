"""`eks-dra plan`'s report through the real CLI: reasons per workload said once, wrapping, plurals, the JSON
summary for CI, manifests on stdin, gangs, and the hint found by planning again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from eks_dra.planner.cel_env import CelEnvironment
from eks_dra.planner.claims import load_manifests
from eks_dra.planner.fit_hint import Replanner, gang_starts
from eks_dra.planner.model import Gang
from eks_dra.planner.plan import Planner
from eks_dra.planner.report import Findings, to_table
from eks_dra.planner.simulate import nodes_for_instance_type

REPO = Path(__file__).resolve().parents[1]
CLASSES = Path(__file__).parent / "planner" / "classes.yaml"
GPU_TOLERATION = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
FULL = "other claims' devices: request gpus needs {} matching device{}, at most 0 are free on one node"


def _template(name: str, count: int, selector: str | None = None) -> dict:
    exactly: dict = {"deviceClassName": "gpu.nvidia.com", "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}}}


def _deployment(name: str, replicas: int, template: str) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "ml"},
            "spec": {"replicas": replicas, "template": {"spec": {
                "tolerations": GPU_TOLERATION, "containers": [],
                "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}]}}}}


def _write(tmp_path: Path, *docs: dict) -> Path:
    path = tmp_path / "workloads.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


def _plan(*args: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    """The CLI as a user runs it: stdout is a pipe, not a terminal."""
    run = subprocess.run([sys.executable, "-m", "eks_dra.cli", "plan", *args], input=stdin if stdin is not None
                         else b"", capture_output=True, cwd=REPO, timeout=300)
    return run.returncode, run.stdout.decode(), run.stderr.decode()


def _env(tmp_path: Path, name: str, *groups: dict) -> list[str]:
    """-c env=NAME on a config with a system group and `groups`."""
    config = tmp_path / "config"
    config.mkdir(exist_ok=True)
    (config / f"{name}.yaml").write_text(yaml.safe_dump({
        "region": "us-east-2", "clusterName": name, "kubernetesVersion": "1.34",
        "nodeGroups": [{"name": "system", "instanceType": "m7i.xlarge", "maxSize": 2}, *groups]}))
    return ["-c", f"env={name}", "--config-dir", str(config)]


def _sixty(tmp_path: Path) -> Path:
    """60 pods of 1 GPU on 2 p5.48xlarge (8 GPUs each): 16 fit, 44 do not; and one claim no pod uses."""
    lone = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "lone", "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "d", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
    return _write(tmp_path, _template("one-gpu", 1), _deployment("infer", 60, "one-gpu"), lone)


def test_a_60_replica_deployment_says_its_reason_once(tmp_path):
    code, out, _ = _plan("--instance-type", "p5.48xlarge", "--nodes", "2", "--claims", str(CLASSES),
                         str(_sixty(tmp_path)))
    assert code == 1
    reason = "all 2 p5.48xlarge nodes already hold " + FULL.format(1, "")
    assert f"  Deployment ml/infer: 16 of 60 pods fit; 44 do not: {reason}" in out.splitlines()
    assert out.count(reason) == 1  # for all 44 pods
    assert f"  ResourceClaim ml/lone: not allocated: {reason.replace('request gpus', 'request d')}" in out.splitlines()
    assert out.count("NOT ALLOCATED") == 45  # each claim keeps its row, without the reason
    assert "  p5.48xlarge: 2 nodes; dra.net 0 used, 64 free; gpu.nvidia.com/gpu 16 used, 0 free" in out.splitlines()
    assert "16 of 61 claims allocated, on 2 of 2 nodes" in out.splitlines()


def test_reasons_wrap_at_the_width_and_not_in_a_pipe(tmp_path):
    path = _sixty(tmp_path)
    _, piped, _ = _plan("--instance-type", "p5.48xlarge", "--nodes", "2", "--claims", str(CLASSES), str(path))
    code, wrapped, _ = _plan("--instance-type", "p5.48xlarge", "--nodes", "2", "--claims", str(CLASSES), str(path),
                             "--width", "100")
    assert code == 1
    section = wrapped[wrapped.index("Workloads:"):wrapped.index("Node groups:")].splitlines()[1:-1]
    assert section == [
        "  Deployment ml/infer: 16 of 60 pods fit; 44 do not: all 2 p5.48xlarge nodes already hold other",
        "      claims' devices: request gpus needs 1 matching device, at most 0 are free on one node",
        "  ResourceClaim ml/lone: not allocated: all 2 p5.48xlarge nodes already hold other claims' devices:",
        "      request d needs 1 matching device, at most 0 are free on one node",
    ]
    long_line = next(line for line in piped.splitlines() if line.startswith("  Deployment ml/infer"))
    assert len(long_line) > 100  # a pipe (grep, CI logs) gets each paragraph on one line
    assert " ".join(section[0:2]).split() == long_line.split()


def test_singular_and_plural(tmp_path):
    path = _write(tmp_path, _template("eight", 8), _deployment("two", 2, "eight"))
    code, out, _ = _plan("--instance-type", "p5.48xlarge", "--claims", str(CLASSES), str(path))
    assert code == 1
    lines = out.splitlines()
    assert ("  Deployment ml/two: 1 of 2 pods fits; 1 does not: the only p5.48xlarge node already holds "
            + FULL.format(8, "s")) in lines
    assert "  p5.48xlarge: 1 node; dra.net 0 used, 32 free; gpu.nvidia.com/gpu 8 used, 0 free" in lines


def test_json_names_pod_and_workload_and_sums_up(tmp_path):
    code, out, _ = _plan("--instance-type", "p5.48xlarge", "--nodes", "2", "--claims", str(CLASSES),
                         str(_sixty(tmp_path)), "-o", "json")
    assert code == 1
    plan = json.loads(out)
    deployment = {"kind": "Deployment", "namespace": "ml", "name": "infer"}
    first, last, lone = plan["claims"][0], plan["claims"][59], plan["claims"][60]
    assert set(first) == {"name", "namespace", "allocated", "node", "devices", "reason", "pod", "workload"}
    assert (first["name"], first["pod"], first["workload"], first["allocated"]) == \
        ("infer-0-gpus", "infer-0", deployment, True)
    assert (last["name"], last["pod"], last["workload"], last["allocated"]) == \
        ("infer-59-gpus", "infer-59", deployment, False)
    assert (lone["pod"], lone["workload"]) == (None, {"kind": "ResourceClaim", "namespace": "ml", "name": "lone"})
    assert plan["summary"] == {
        "claims": {"allocated": 16, "total": 61},
        "pods": {"placed": 16, "total": 60},
        "workloads": [
            {"kind": "Deployment", "namespace": "ml", "name": "infer", "pods": 60, "podsPlaced": 16,
             "allocated": False, "hint": None},  # no hints without an environment to change
            {"kind": "ResourceClaim", "namespace": "ml", "name": "lone", "pods": 0, "podsPlaced": 0,
             "allocated": False, "hint": None},
        ],
        "nodeGroups": [{"name": "p5.48xlarge", "nodes": 2, "devices": {
            "dra.net": {"used": 0, "free": 64}, "gpu.nvidia.com/gpu": {"used": 16, "free": 0}}}],
    }


def test_claims_from_stdin(tmp_path):
    path = _sixty(tmp_path)
    from_file = _plan("--instance-type", "p5.48xlarge", "--nodes", "2", "--claims", str(CLASSES), str(path),
                      "-o", "json")
    from_stdin = _plan("--instance-type", "p5.48xlarge", "--nodes", "2", "--claims", str(CLASSES), "-",
                       "-o", "json", stdin=path.read_bytes())
    assert from_stdin == from_file and from_file[0] == 1
    # The file budgets hold for stdin too, and messages name it <stdin>.
    code, _, err = _plan("--instance-type", "p5.48xlarge", "--claims", "-", stdin=b"a: &x 1\nb: *x\n")
    assert code == 2 and err.strip() == ("eks-dra plan: error: <stdin>: line 1: YAML aliases/anchors are not accepted; write the "
                                         "value out")
    code, _, err = _plan("--instance-type", "p5.48xlarge", "--claims", "-", stdin=b"kind: Pod\nx: \xff\n")
    assert code == 2 and "<stdin>: line 2: not UTF-8 (byte 13 is 0xff)" in err
    code, _, err = _plan("--instance-type", "p5.48xlarge", "--claims", "-", "-")
    assert code == 2 and "- (stdin) is given more than once" in err


def test_env_help_says_what_is_simulated():
    run = subprocess.run([sys.executable, "-m", "eks_dra.cli", "plan", "--help"], capture_output=True, text=True,
                         cwd=REPO, timeout=120, env={**os.environ, "COLUMNS": "1000"})
    text = " ".join(run.stdout.split())
    assert "each simulated at its maxSize" in text
    assert "device-plugin families advertise their extended resources; system (non-accelerator) groups are left " \
           "out" in text
    assert "- reads them from stdin" in text


def test_hint_raises_max_size_found_by_replanning(tmp_path):
    # 3 pods x 8 GPUs, p5-dra at maxSize 2 (8 GPUs a node): one pod is left; maxSize 3 places it.
    env = _env(tmp_path, "p5", {"name": "p5-dra", "instanceType": "p5.48xlarge", "maxSize": 2},
               {"name": "g6-plugin", "instanceType": "g6.12xlarge", "deviceMode": "device-plugin", "maxSize": 1})
    path = _write(tmp_path, _template("eight", 8), _deployment("train", 3, "eight"))
    code, out, _ = _plan(*env, "--claims", str(CLASSES), str(path))
    assert code == 1
    lines = out.splitlines()
    # The device-plugin group's node is in the plan too: its GPUs are no DRA devices.
    at = lines.index("  Deployment ml/train: 2 of 3 pods fit; 1 does not: all 2 p5.48xlarge nodes already hold "
                     + FULL.format(8, "s") + "; request gpus: no device of g6.12xlarge matches DeviceClass "
                     "gpu.nvidia.com (devices there: none)")
    assert lines[at + 1] == "    would fit with p5-dra maxSize 3"
    assert "  p5-dra: 2 nodes; dra.net 0 used, 64 free; gpu.nvidia.com/gpu 16 used, 0 free" in lines
    code, out, _ = _plan(*env, "--claims", str(CLASSES), str(path), "-o", "json")
    (workload,) = json.loads(out)["summary"]["workloads"]
    assert workload["hint"] == {"change": "maxSize", "nodeGroup": "p5-dra", "maxSize": 3,
                                "text": "p5-dra maxSize 3"}
    # 20 such pods need 20 nodes: past 4x maxSize (8) but within +16 (18)? No: 20 > 18, and a new group of
    # 16 p5 nodes with the 2 there makes 18 < 20: no single change within the bounds.
    many = _write(tmp_path, _template("eight", 8), _deployment("train", 20, "eight"))
    code, out, _ = _plan(*env, "--claims", str(CLASSES), str(many))
    assert code == 1 and ("    no single change makes it fit: one DRA group's maxSize up to 4x or +16 (whichever is "
                          "more), or one new group of up to 16 nodes") in out.splitlines()
    # 18 pods: maxSize 18 (2 + 16) is the bound and fits; a new group would need 16 nodes, more than 16 added.
    code, out, _ = _plan(*env, "--claims", str(CLASSES), str(_write(tmp_path, _template("eight", 8),
                                                                     _deployment("train", 18, "eight"))))
    assert "    would fit with p5-dra maxSize 18" in out.splitlines()


def test_hint_counts_what_other_groups_take(tmp_path):
    # dev: 10 pods x 8 GPUs; p5-dra (maxSize 2) takes 2 and g6e-bottlerocket's one L40S node takes 1. The re-plan
    # places the rest on p5-dra with maxSize 9 (9 + 1 = 10), not the 10 that counting p5 nodes alone would say.
    path = _write(tmp_path, _template("eight", 8), _deployment("train", 10, "eight"))
    code, out, _ = _plan("-c", "env=dev", "--config-dir", str(REPO / "config"), "--claims", str(CLASSES), str(path))
    assert code == 1
    assert "  Deployment ml/train: 3 of 10 pods fit; 7 do not: all 2 p5.48xlarge nodes already hold " in out
    assert "    would fit with p5-dra maxSize 9" in out.splitlines()


def test_hint_adds_a_node_group_when_no_group_has_the_devices(tmp_path):
    # 3 pods x 4 H100 on an environment of L40S only: no maxSize helps; p5.48xlarge (8 H100) takes 2 pods a
    # node, so a new group of 2 nodes.
    env = _env(tmp_path, "l40s", {"name": "g6e-dra", "instanceType": "g6e.48xlarge", "maxSize": 1})
    h100 = "device.attributes['gpu.nvidia.com'].productName.contains('H100')"
    path = _write(tmp_path, _template("h100", 4, h100), _deployment("infer", 3, "h100"))
    code, out, _ = _plan(*env, "--claims", str(CLASSES), str(path))
    assert code == 1
    assert "    would fit with a new node group of 2 p5.48xlarge nodes" in out.splitlines()
    code, out, _ = _plan(*env, "--claims", str(CLASSES), str(path), "-o", "json")
    assert json.loads(out)["summary"]["workloads"][0]["hint"] == {
        "change": "newNodeGroup", "instanceType": "p5.48xlarge", "nodes": 2,
        "text": "a new node group of 2 p5.48xlarge nodes"}


def test_a_gang_is_one_line(tmp_path):
    # A JobSet-like gang of 4 pods x 8 GPUs that needs all 4, on 3 p5 nodes: 3 would start and wait for the 4th.
    path = _write(tmp_path, _template("eight", 8), _deployment("workers", 4, "eight"))
    env = CelEnvironment()
    manifests = load_manifests([CLASSES, path], env)
    gang = Gang("JobSet ml/x", 4, 4)
    for pod in manifests.pods:
        pod.gang = gang
    replanner = Replanner(env, list(manifests.pods), {}, "1.34")
    result = Planner(env, nodes_for_instance_type("p5.48xlarge", 3)).run(manifests.pods)
    findings = Findings(None, gang_starts(replanner, result))
    assert findings.gang_starts == {"JobSet ml/x": 3}
    section = to_table(result, findings).split("Workloads:\n")[1].split("\n\n")[0]
    assert section == "  JobSet ml/x: would start 3 of 4 pods and wait"
