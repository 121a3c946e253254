"""Benchmark the real-control-plane tier: pod creation -> prepared devices, and the scheduler next to the planner.

1. The dev environment (2x p5.48xlarge, trn2.48xlarge, g6e.48xlarge, our drivers as their ServiceAccounts):
   the dev sample workloads are applied at once; for every sample pod, the time from its creation (the pod
   watch's ADDED event) to the kubelet stand-in's successful NodePrepareResources. Prints p50 / max.
2. 200 single-GPU ResourceClaims over 25 p5.48xlarge nodes (200 GPUs; slices published as the drivers would):
   the real kube-scheduler's claims per second (pods released from a scheduling gate at once, until the last
   claim is allocated) next to `eks-dra plan --slices` on the same slices and claims (wall time of the whole
   command: interpreter start-up, parsing, CEL compilation and allocation).

Needs Go >= 1.25 (builds tests/e2e/cluster on first use). Run: .venv/bin/python bench/e2e.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from controlplane import ControlPlane, ensure_binary, go_available, wait_until  # noqa: E402
from helpers import BIN, SAMPLES_NAMESPACE, DevCluster, as_dict, pod_running, prepared  # noqa: E402
from kubernetes import watch  # noqa: E402

from eks_dra.catalog import get_instance_type  # noqa: E402
from eks_dra.devices import DEFAULT_DRIVER_NAMES, resource_slices, simulate_node  # noqa: E402

BENCH_NODES, BENCH_CLAIMS = 25, 200
BENCH_NAMESPACE = "bench-scheduler"
GATE = "eks-dra.io/bench"


def report_time(value: str) -> float:
    """RFC3339Nano from the stand-in's report -> epoch seconds (microsecond precision)."""
    base, _, frac = value.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{base}.{(frac + '000000')[:6]}+00:00").timestamp()


def sample_latencies(dev: DevCluster) -> dict[str, float]:
    """Apply the dev samples; pod name -> seconds from creation to its successful prepare."""
    created: dict[str, float] = {}
    stop = threading.Event()
    w = watch.Watch()

    def watch_pods() -> None:
        try:
            for event in w.stream(dev.core.list_namespaced_pod, SAMPLES_NAMESPACE, timeout_seconds=300):
                if event["type"] == "ADDED":
                    created.setdefault(event["object"].metadata.name, time.time())
        except Exception:  # noqa: BLE001 - w.stop() cuts the stream; anything earlier shows as a missing pod
            if not stop.is_set():
                raise

    # The namespace first, so that the watch can start before any pod exists.
    dev.core.create_namespace({"metadata": {"name": SAMPLES_NAMESPACE}})
    wait_until(lambda: dev.core.read_namespaced_service_account("default", SAMPLES_NAMESPACE), 60, what="default SA")
    watcher = threading.Thread(target=watch_pods, daemon=True)
    watcher.start()
    time.sleep(0.5)
    dev.apply_manifests(lambda p: "dra-samples" in p.name)

    def all_prepared():
        pods = [p for p in dev.pods() if p["spec"].get("nodeName")]
        return pods if len(pods) >= 11 and all(pod_running(p) and prepared(p) for p in pods) else None

    pods = wait_until(all_prepared, 180, interval=0.3, what="every placeable sample pod prepared")
    stop.set()
    w.stop()
    # A claim is prepared once, also when shared: a pod is ready when the last of its claims is.
    claim_prepared: dict[str, float] = {}
    for node in dev.nodes.values():
        for e in node.kubelet.events("prepare"):
            for c in e["claims"]:
                if c["uid"] not in e["errors"]:
                    claim_prepared.setdefault(c["uid"], report_time(e["time"]))
    latencies = {}
    for pod in pods:
        ready = max(claim_prepared[c["metadata"]["uid"]] for c in dev.pod_claims(pod))
        latencies[pod["metadata"]["name"]] = max(0.0, ready - created[pod["metadata"]["name"]])
    return latencies


def publish_bench_nodes(dev: DevCluster) -> list[dict]:
    """BENCH_NODES Ready p5 Nodes (no kubelet: scheduling only) and their slices, as our drivers publish them."""
    p5 = get_instance_type("p5.48xlarge")
    slices = []
    for i in range(BENCH_NODES):
        name = f"bench-p5-{i:02d}"
        node = as_dict(dev.core.create_node, {"metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "eks-dra.io/bench": "true"}}})
        capacity = {"cpu": "192", "memory": "2000Gi", "pods": "250"}
        dev.core.patch_node_status(name, {"status": {"capacity": capacity, "allocatable": capacity, "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench"}]}})
        dev.core.patch_node(name, {"spec": {"taints": None}})
        for family, devices in simulate_node(p5, name).items():
            for body in resource_slices(DEFAULT_DRIVER_NAMES.for_family(family), name, devices, 1, node["metadata"]["uid"]):
                slices.append(as_dict(dev.resource.create_resource_slice, body))
    return slices


def claim(i: int) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"gpu-{i:03d}", "namespace": BENCH_NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}


def gated_pod(i: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"gpu-{i:03d}", "namespace": BENCH_NAMESPACE},
            "spec": {"schedulingGates": [{"name": GATE}], "nodeSelector": {"eks-dra.io/bench": "true"},
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": f"gpu-{i:03d}"}],
                     "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def scheduler_rate(dev: DevCluster) -> tuple[float, float, int]:
    """(seconds to allocate all, seconds spent releasing the gates, allocated) for BENCH_CLAIMS claims."""
    dev.core.create_namespace({"metadata": {"name": BENCH_NAMESPACE}})
    wait_until(lambda: dev.core.read_namespaced_service_account("default", BENCH_NAMESPACE), 60, what="default SA")
    for i in range(BENCH_CLAIMS):
        dev.resource.create_namespaced_resource_claim(BENCH_NAMESPACE, claim(i))
        dev.core.create_namespaced_pod(BENCH_NAMESPACE, gated_pod(i))
    start = time.monotonic()
    for i in range(BENCH_CLAIMS):
        dev.core.patch_namespaced_pod(f"gpu-{i:03d}", BENCH_NAMESPACE, {"spec": {"schedulingGates": None}})
    ungated = time.monotonic() - start

    def allocated():
        claims = as_dict(dev.resource.list_namespaced_resource_claim, BENCH_NAMESPACE)["items"]
        n = sum(1 for c in claims if (c.get("status") or {}).get("allocation"))
        return n if n == BENCH_CLAIMS else None

    n = wait_until(allocated, 120, interval=0.1, what=f"{BENCH_CLAIMS} claims allocated by the scheduler")
    return time.monotonic() - start, ungated, n


def planner_rate(slices: list[dict], workdir: Path) -> tuple[float, int]:
    slices_file, claims_file = workdir / "bench-slices.yaml", workdir / "bench-claims.yaml"
    slices_file.write_text(yaml.safe_dump_all([{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", **s}
                                               for s in slices]))
    classes = next(p for p in (workdir / "dist-dev").glob("*device-classes*"))
    claims_file.write_text(yaml.safe_dump_all([claim(i) for i in range(BENCH_CLAIMS)]))
    start = time.monotonic()
    proc = subprocess.run([str(BIN / "eks-dra"), "plan", "--slices", str(slices_file), "--claims", str(classes),
                           str(claims_file), "--output", "json"], capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - start
    plan = json.loads(proc.stdout)["claims"]
    return elapsed, sum(1 for c in plan if c["allocated"])


def main() -> int:
    if not go_available():
        print("bench/e2e.py: Go toolchain not found on PATH; install Go >= 1.25 to build the control plane")
        return 1
    binary = ensure_binary()
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        root = Path(tmp)
        cp = ControlPlane(binary, root / "cp")
        cp.start()
        dev = DevCluster(cp, binary, root)
        try:
            dev.apply_manifests(lambda p: "dra-samples" not in p.name)
            dev.create_nodes()
            started = time.monotonic()
            dev.start_nodes()
            dev.wait_drivers_ready()
            ready = time.monotonic() - started
            latencies = sample_latencies(dev)
            dev.stop()
            dev.remove()  # its nodes' GPUs must not take part below; the DeviceClasses come back
            dev.apply_manifests(lambda p: "device-classes" in p.name)
            slices = publish_bench_nodes(dev)
            sched_s, ungate_s, sched_n = scheduler_rate(dev)
            plan_s, plan_n = planner_rate(slices, root)
        finally:
            dev.stop()
            dev.remove_dirs()
            cp.stop()

    values = sorted(latencies.values())
    print(f"e2e bench (Kubernetes v1.34.12 control plane, {len(dev.nodes)} simulated dev nodes, "
          f"{sum(len(n.drivers) for n in dev.nodes.values())} driver processes)")
    print(f"  drivers started -> all registered, slices published, readiness taints removed: {ready:.2f} s")
    print(f"  sample pods: creation -> devices prepared ({len(values)} pods):"
          f" p50 {statistics.median(values) * 1000:.0f} ms, max {values[-1] * 1000:.0f} ms")
    for name, seconds in sorted(latencies.items(), key=lambda kv: kv[1]):
        print(f"    {name:<24} {seconds * 1000:7.0f} ms")
    print(f"  {BENCH_CLAIMS} single-GPU claims on {BENCH_NODES} p5.48xlarge nodes:")
    print(f"    kube-scheduler: {sched_n} allocated in {sched_s:.2f} s = {sched_n / sched_s:.0f} claims/s"
          f" (incl. {ungate_s:.2f} s of releasing the scheduling gates)")
    print(f"    eks-dra plan:   {plan_n} allocated in {plan_s:.2f} s = {plan_n / plan_s:.0f} claims/s"
          " (whole command: start-up, parsing, CEL, allocation)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
