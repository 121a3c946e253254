"""Pods that ask for device plugins' extended resources (nvidia.com/gpu: 2), planned on device-plugin node groups.

Expectations are worked by hand from the configs: dev's g6-device-plugin group is one g6.12xlarge (4 L4 GPUs,
1 EFA interface: nvidia.com/gpu 4, vpc.amazonaws.com/efa 1) with the nvidia.com/gpu NoSchedule taint.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from eks_dra import cli
from eks_dra.catalog import get_instance_type
from eks_dra.planner.cel_env import CelEnvironment
from eks_dra.planner.claims import load_manifests

REPO = Path(__file__).resolve().parents[1]
GPU_TOLERATION = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
NO_GROUP = ("asks for nvidia.com/gpu: 2, which only device-plugin node groups serve on Kubernetes 1.34 (none in "
            "this environment); add a group with deviceMode: device-plugin, or use a ResourceClaim, or Kubernetes "
            "1.36+ where DeviceClass gpu.nvidia.com maps it")


def _pod(name: str, gpus: int, *, init: list[dict] | None = None, containers: int = 1) -> dict:
    spec: dict = {"tolerations": GPU_TOLERATION,
                  "containers": [{"name": f"c{i}", "image": "x", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
                                 for i in range(containers)]}
    if init is not None:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml"}, "spec": spec}


def _config(tmp_path: Path, name: str, version: str, *groups: dict) -> Path:
    config = tmp_path / "config"
    config.mkdir(exist_ok=True)
    (config / f"{name}.yaml").write_text(yaml.safe_dump({
        "region": "us-east-2", "clusterName": name, "kubernetesVersion": version,
        "nodeGroups": [{"name": "system", "instanceType": "m7i.xlarge", "maxSize": 2}, *groups]}))
    return config


def _plan(capsys, tmp_path: Path, env: str, config: Path, *docs: dict) -> tuple[int, dict, str]:
    path = tmp_path / "pods.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    args = ["plan", "-c", f"env={env}", "--config-dir", str(config), "--claims", str(path)]
    code = cli.main([*args, "-o", "json"])
    report = json.loads(capsys.readouterr().out)
    assert cli.main(args) == code
    return code, report, capsys.readouterr().out


def _entries(report: dict) -> dict[str, dict]:
    """The claim-less entries (pods served by device plugins), by pod name."""
    return {c["name"]: c for c in report["podsWithoutClaims"]}


def test_catalog_counts_of_the_device_plugins():
    from eks_dra.devices.device_plugins import advertised

    assert advertised(get_instance_type("g6.12xlarge"), ("gpu", "efa")) == {
        "nvidia.com/gpu": 4, "vpc.amazonaws.com/efa": 1}
    # 16 Trainium2 of 8 cores, default logical cores of 2: 64 neuroncores; EFA only where the group has it.
    assert advertised(get_instance_type("trn2.48xlarge"), ("neuron",)) == {
        "aws.amazon.com/neuron": 16, "aws.amazon.com/neuroncore": 64}
    assert advertised(get_instance_type("inf2.48xlarge"), ("neuron",))["aws.amazon.com/neuroncore"] == 24


def test_two_gpu_pod_on_1_34_fits_on_devs_device_plugin_group(tmp_path, capsys):
    code, report, table = _plan(capsys, tmp_path, "dev", REPO / "config", _pod("two", 2))
    assert code == 0
    entry = _entries(report)["two"]
    assert entry["allocated"] and entry["node"] == "g6-device-plugin-0" and entry["reason"] is None
    assert entry["extendedResources"] == {"nvidia.com/gpu": 2}
    assert entry["workload"] == {"kind": "Pod", "namespace": "ml", "name": "two"}
    group = next(g for g in report["summary"]["nodeGroups"] if g["name"] == "g6-device-plugin")
    assert group["devices"]["nvidia.com/gpu"] == {"used": 2, "free": 2}
    assert report["summary"]["pods"] == {"placed": 1, "total": 1}
    assert "  Pod ml/two: 1 of 1 pod fits" in table.splitlines()
    assert table.splitlines()[-1] == "0 of 0 claims allocated, on 0 of 7 nodes; 1 of 1 pod without claims placed"


def test_two_gpu_pod_without_a_device_plugin_group_says_which_group_or_version_would(tmp_path, capsys):
    config = _config(tmp_path, "dra-only", "1.34", {"name": "p5-dra", "instanceType": "p5.48xlarge", "maxSize": 1})
    code, report, table = _plan(capsys, tmp_path, "dra-only", config, _pod("two", 2))
    assert code == 1
    entry = _entries(report)["two"]
    assert not entry["allocated"] and entry["node"] is None and entry["reason"] == NO_GROUP
    assert f"  Pod ml/two: 0 of 1 pod fit; 1 does not: {NO_GROUP}" in table.splitlines()
    assert "ml/two (pod)" in table and "NOT PLACED" in table


def test_device_plugin_gpus_are_bin_packed_in_pod_order(tmp_path, capsys):
    # 3 pods x 4 GPUs on one node of 8 (g6.48xlarge): the first two fit, the third finds 0 free.
    config = _config(tmp_path, "plugins", "1.34", {"name": "g6-plugin", "instanceType": "g6.48xlarge",
                                                    "deviceMode": "device-plugin", "maxSize": 1})
    code, report, _ = _plan(capsys, tmp_path, "plugins", config, *(_pod(f"p{i}", 4) for i in range(3)))
    assert code == 1
    entries = _entries(report)
    assert [entries[f"p{i}"]["node"] for i in range(3)] == ["g6-plugin-0", "g6-plugin-0", None]
    assert entries["p2"]["reason"] == ("the only g6.48xlarge node already holds other pods' nvidia.com/gpu: it asks "
                                       "for 4, at most 0 are free on one node")
    group = report["summary"]["nodeGroups"][0]
    assert group["devices"]["nvidia.com/gpu"] == {"used": 8, "free": 0}


def test_init_containers_count_at_their_peak_not_on_top_of_the_app(tmp_path, capsys):
    # App containers 1 + 1 = 2; an init container of 3 runs before them: the pod needs max(2, 3) = 3 GPUs.
    # A sidecar (restartPolicy Always) of 1 stays for the pod's life: 2 + 1 = 3 and init 3 + 1 = 4.
    env = CelEnvironment()

    def counts(pod: dict) -> dict[str, int]:
        path = tmp_path / "pod.yaml"
        path.write_text(yaml.safe_dump(pod))
        (planned,) = load_manifests([path], env).pods
        return planned.extended_resources

    init = {"name": "init", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 3}}}
    sidecar = {"name": "side", "image": "x", "restartPolicy": "Always",
               "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}
    assert counts(_pod("p", 1, containers=2)) == {"nvidia.com/gpu": 2}
    assert counts(_pod("p", 1, containers=2, init=[init])) == {"nvidia.com/gpu": 3}
    assert counts(_pod("p", 1, containers=2, init=[sidecar, init])) == {"nvidia.com/gpu": 4}
    # dev's g6-device-plugin node has 4: the pod with the init container of 5 does not fit there.
    big = {**init, "resources": {"limits": {"nvidia.com/gpu": 5}}}
    code, report, _ = _plan(capsys, tmp_path, "dev", REPO / "config", _pod("p", 1, containers=2, init=[big]))
    assert code == 1
    assert _entries(report)["p"]["reason"].startswith(
        "asks for nvidia.com/gpu: 5, a g6.12xlarge node advertises 4")


def test_1_36_mapping_class_lands_on_a_dra_node_or_a_device_plugin_node(tmp_path, capsys):
    # k8s136: DRA p5 (8 H100) before the g6 device-plugin group. The first pod of 2 GPUs gets the scheduler's
    # claim on p5-dra-0 (DeviceClass gpu.nvidia.com maps nvidia.com/gpu there); one of 8 more GPUs also fits on
    # DRA nodes (p5-dra-0 has 6 left, p5-dra-1 has 8), and with both p5 nodes full the device plugin serves one.
    config = REPO / "tests" / "charts" / "envs"
    groups = yaml.safe_load((config / "k8s136.yaml").read_text())["nodeGroups"]
    assert [g["name"] for g in groups] == ["system", "p5-dra", "trn2-dra", "p4d-mig", "g6-plugin"]
    code, report, _ = _plan(capsys, tmp_path, "k8s136", config, _pod("a", 2), _pod("b", 8), _pod("c", 6),
                            _pod("d", 3))
    assert code == 0, report
    claims = {c["name"]: c for c in report["claims"] if c["name"] is not None}
    assert claims["a-extended-resources"]["node"] == "p5-dra-0" and len(claims["a-extended-resources"]["devices"]) == 2
    assert claims["b-extended-resources"]["node"] == "p5-dra-1"
    assert claims["c-extended-resources"]["node"] == "p5-dra-0"
    # d: 3 GPUs, none free on p5 nodes; trn2 and p4d (MIG) publish no full GPU of the class; g6's plugin has 4.
    entry = _entries(report)["d"]
    assert entry["node"] == "g6-plugin-0" and entry["allocated"] and "d-extended-resources" not in claims
    assert {g["name"]: g["devices"].get("nvidia.com/gpu") for g in report["summary"]["nodeGroups"]}["g6-plugin"] == {
        "used": 3, "free": 1}


def test_an_extended_resource_nothing_serves_is_refused_not_dropped(tmp_path):
    manifest = tmp_path / "foo.yaml"
    manifest.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: foo}\nspec:\n  tolerations: [{operator: Exists}]\n"
                        "  containers:\n"
                        "  - name: c\n    image: x\n    resources: {limits: {example.com/foo: 1, cpu: 1, "
                        "hugepages-2Mi: 2Mi}}\n")
    proc = subprocess.run([sys.executable, "-m", "eks_dra.cli", "plan", "-c", "env=dev", "--claims", str(manifest),
                           "--output", "json"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["claims"] == []
    (entry,) = report["podsWithoutClaims"]
    assert entry["allocated"] is False and entry["extendedResources"] == {"example.com/foo": 1}
    assert "asks for example.com/foo: 1, which no device plugin eks-dra deploys advertises" in entry["reason"]
