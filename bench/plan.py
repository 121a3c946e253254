"""Benchmark `eks-dra plan`: 2,000 mixed claims on 256 p5.48xlarge + 64 trn2.48xlarge simulated nodes.

Prints claims per second, the phases' times and peak memory (target: under 5 s in total on 2 cores).
Run: .venv/bin/python bench/plan.py
"""

from __future__ import annotations

import resource
import sys
import tempfile
import time
from pathlib import Path

import yaml

from eks_dra.planner.cel_env import CelEnvironment
from eks_dra.planner.claims import load_manifests
from eks_dra.planner.plan import Planner
from eks_dra.planner.simulate import nodes_for_instance_type, number_nodes

CLAIMS = 2000
P5_NODES, TRN2_NODES = 256, 64
PCIE = "resource.kubernetes.io/pcieRoot"

CLASSES = [
    ("gpu.nvidia.com", "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"),
    ("efa.networking.k8s.aws", "device.driver == 'dra.net'"),
    ("neuron.aws.com", "device.driver == 'neuron.aws.com'"),
]


def _exact(name: str, cls: str, count: int = 1, selectors: tuple[str, ...] = ()) -> dict:
    body: dict = {"deviceClassName": cls, "count": count}
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": body}


# The mix: (share, devices spec) cycled over the claims.
MIX: list[dict] = [
    {"requests": [_exact("gpu", "gpu.nvidia.com")]},
    {"requests": [_exact("gpu", "gpu.nvidia.com"), _exact("efa", "efa.networking.k8s.aws", 4)],
     "constraints": [{"requests": ["gpu", "efa"], "matchAttribute": PCIE}]},
    {"requests": [_exact("gpus", "gpu.nvidia.com", 2, (
        "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('40Gi'))",
        "device.attributes['gpu.nvidia.com'].cudaComputeCapability.isGreaterThan(semver('8.0.0'))"))]},
    {"requests": [{"name": "gpu", "firstAvailable": [
        {"name": "eight", "deviceClassName": "gpu.nvidia.com", "count": 8},
        {"name": "four", "deviceClassName": "gpu.nvidia.com", "count": 4},
        {"name": "one", "deviceClassName": "gpu.nvidia.com"}]}]},
    {"requests": [_exact("neuron", "neuron.aws.com", 4), _exact("efa", "efa.networking.k8s.aws", 4)],
     "constraints": [{"requests": ["neuron", "efa"], "matchAttribute": "resource.aws.com/devicegroup4_id"}]},
    {"requests": [_exact("neuron", "neuron.aws.com", 8)],
     "constraints": [{"matchAttribute": "resource.aws.com/devicegroup8_id"}]},
    {"requests": [_exact("gpu", "gpu.nvidia.com")]},
    {"requests": [_exact("efa", "efa.networking.k8s.aws")]},
    {"requests": [_exact("gpus", "gpu.nvidia.com", 16)]},  # never fits: exercises the failure path
    {"requests": [_exact("neuron", "neuron.aws.com", 1, ("device.attributes['neuron.aws.com'].coreCount == 8",))]},
]


def manifests() -> list[dict]:
    docs: list[dict] = [{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": n},
                         "spec": {"selectors": [{"cel": {"expression": e}}]}} for n, e in CLASSES]
    for i in range(CLAIMS):
        docs.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                     "metadata": {"name": f"claim-{i}", "namespace": "bench"},
                     "spec": {"devices": MIX[i % len(MIX)]}})
    return docs


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "claims.yaml"
        path.write_text(yaml.safe_dump_all(manifests()))
        start = time.perf_counter()
        env = CelEnvironment()
        loaded = load_manifests([path], env)
        t_load = time.perf_counter()
        nodes = number_nodes(nodes_for_instance_type("p5.48xlarge", P5_NODES)
                             + nodes_for_instance_type("trn2.48xlarge", TRN2_NODES))
        t_nodes = time.perf_counter()
        result = Planner(env, nodes).run(loaded.pods)
        end = time.perf_counter()
    allocated = sum(c.allocated for c in result.claims)
    total = end - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"claims: {len(result.claims)} ({allocated} allocated, {len(result.claims) - allocated} not) on "
          f"{len(nodes)} nodes ({P5_NODES} p5.48xlarge + {TRN2_NODES} trn2.48xlarge, "
          f"{sum(len(n.devices) for n in nodes)} devices)")
    print(f"load manifests: {t_load - start:.2f} s, simulate nodes: {t_nodes - t_load:.2f} s, "
          f"allocate: {end - t_nodes:.2f} s")
    print(f"total: {total:.2f} s, {len(result.claims) / total:.0f} claims/s (target: under 5 s)")
    print(f"peak memory (max RSS): {peak_mib:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
