"""Benchmark `eks-dra plan` on one JobSet of 1,000 pods, each a whole p5.48xlarge, on 1,000 simulated p5.48xlarge.

Each pod gets 8 GPUs and 32 EFAs, GPU i with the 4 EFAs on its PCIe root (one request pair and one
matchAttribute constraint per GPU, as tests/planner/aligned-gpu-efa.yaml does for one GPU). A claim holds at
most 32 devices (AllocationResultsMaxSize), so the pod has two claims of 4 pairs (20 devices) from one
ResourceClaimTemplate. The plan runs in-process through the CLI (`eks-dra plan --instance-type p5.48xlarge
--nodes N --claims FILE -o json`), so it includes loading, the gang's settling and the JSON report.
Prints wall time, peak RSS and how many pods were placed; exits 1 when it cannot measure, or when not every
pod was placed (each has a node of its own). Run: .venv/bin/python bench/plan_jobset.py [--pods N]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import yaml

from eks_dra import cli

PCIE = "resource.kubernetes.io/pcieRoot"
PAIRS_PER_CLAIM = 4  # GPU + 4 EFA pairs: 20 devices, under the 32-device claim limit
CLAIMS_PER_POD = 2


def manifests(pods: int) -> list[dict]:
    requests, constraints = [], []
    for i in range(PAIRS_PER_CLAIM):
        requests += [{"name": f"gpu-{i}", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
                     {"name": f"efa-{i}", "exactly": {"deviceClassName": "efa.networking.k8s.aws", "count": 4}}]
        constraints.append({"requests": [f"gpu-{i}", f"efa-{i}"], "matchAttribute": PCIE})
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "gpu-efa-pairs", "namespace": "bench"},
                "spec": {"spec": {"devices": {"requests": requests, "constraints": constraints}}}}
    entries = [{"name": f"accel-{c}", "resourceClaimTemplateName": "gpu-efa-pairs"} for c in range(CLAIMS_PER_POD)]
    pod_spec = {"tolerations": [{"operator": "Exists"}], "resourceClaims": entries,
                "containers": [{"name": "trainer", "image": "busybox",
                                "resources": {"claims": [{"name": e["name"]} for e in entries]}}]}
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
              "metadata": {"name": "train", "namespace": "bench"},
              "spec": {"replicatedJobs": [{"name": "workers", "replicas": 1, "template": {"spec": {
                  "parallelism": pods, "completions": pods, "backoffLimit": 0,
                  "template": {"spec": pod_spec}}}}]}}
    return [template, jobset]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000, help="pods in the JobSet and p5 nodes (default 1000)")
    args = parser.parse_args(argv)
    if args.pods < 1:
        parser.error("--pods must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "jobset.yaml"
        path.write_text(yaml.safe_dump_all(manifests(args.pods)))
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = io.StringIO()
        start = time.perf_counter()
        with contextlib.redirect_stdout(out):
            code = cli.main(["plan", "--instance-type", "p5.48xlarge", "--nodes", str(args.pods),
                             "--claims", str(path), "-o", "json"])
        wall = time.perf_counter() - start
        rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    if rss_peak <= 0 or wall <= 0 or code not in (0, 1):
        print(f"cannot measure: exit code {code}, peak RSS {rss_peak}, wall {wall}", file=sys.stderr)
        return 1
    summary = json.loads(out.getvalue())["summary"]
    placed, total = summary["pods"]["placed"], summary["pods"]["total"]
    print(f"JobSet of {total} pods (8 GPU + 32 EFA each, {CLAIMS_PER_POD} claims) on {args.pods} p5.48xlarge: "
          f"{placed} placed, {summary['claims']['allocated']} of {summary['claims']['total']} claims allocated")
    print(f"wall {wall:.2f} s ({wall / max(total, 1) * 1000:.2f} ms a pod); peak RSS {rss_peak / 1024:.0f} MiB "
          f"({(rss_peak - rss_before) / 1024:.0f} MiB above the {rss_before / 1024:.0f} MiB before planning)")
    return 0 if placed == total == args.pods else 1


if __name__ == "__main__":
    sys.exit(main())
