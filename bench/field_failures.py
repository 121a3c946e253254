"""Field-failure figures (tests/e2e/test_field_failures.py at full counts), on the real Kubernetes 1.34 control plane of tests/e2e.

1. Runs tests/e2e/test_field_failures.py with EKS_DRA_FF_FULL=1 (the issue's counts: 20 kubelet restarts,
   200 hostile slice deletions, a 5-minute idle window, 2 minutes of 50 pod creations per minute) and prints
   the figures the scenarios record: recovery times (min/p50/max), API writes while idle, ...
2. Resident memory of a GPU driver process over 10,000 prepare/unprepare cycles, driven over its gRPC socket
   as the kubelet does, with ResourceClaims allocated (by hand) to its node in the real API server.

    python bench/field_failures.py [--scaled] [--skip-scenarios] [--skip-rss] [--cycles 10000]

Needs Go (the control plane is built by tests/e2e/build.sh on first use). Target: RSS growth <= 10 %.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the kubelet-side gRPC client
sys.path.insert(0, str(REPO / "tests" / "e2e"))  # the control plane driver

from controlplane import ControlPlane, ensure_binary, wait_until  # noqa: E402
from drivers.kubelet import Kubelet  # noqa: E402

GPU = "gpu.nvidia.com"


def run_scenarios(full: bool) -> int:
    figures = Path(tempfile.mkstemp(prefix="ff-figures-", suffix=".jsonl")[1])
    env = {**os.environ, "EKS_DRA_FF_FIGURES": str(figures)}
    if full:
        env["EKS_DRA_FF_FULL"] = "1"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/e2e/test_field_failures.py"], cwd=REPO, env=env)
    took = time.monotonic() - t0
    print(f"\n== scenarios ({'full counts' if full else 'scaled counts'}): pytest exit {proc.returncode}, "
          f"{took:.0f} s")
    for line in figures.read_text().splitlines():
        fig = json.loads(line)
        name = fig.pop("scenario")
        fig.pop("full", None)
        print(f"  {name:40s} {json.dumps(fig, sort_keys=True)}")
    figures.unlink()
    return proc.returncode


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def allocated_claims(api, ns: str, node: str, devices: list[str]) -> list[tuple[str, str, str]]:
    """One ResourceClaim per device, allocated to `node` by writing its status (what the scheduler does)."""
    from kubernetes import client

    resource = client.ResourceV1Api(api)
    out = []
    for device in devices:
        name = f"bench-{device}"
        created = resource.create_namespaced_resource_claim(ns, {"metadata": {"name": name}, "spec": {"devices": {
            "requests": [{"name": "dev", "exactly": {"deviceClassName": "bench-gpu"}}]}}})
        resource.patch_namespaced_resource_claim_status(name, ns, {"status": {"allocation": {
            "devices": {"results": [{"request": "dev", "driver": GPU, "pool": node, "device": device}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}})
        out.append((ns, created.metadata.uid, name))
    return out


def run_rss(cycles: int) -> int:
    from kubernetes import client, config

    from eks_dra.drivers import fixture

    base = Path(tempfile.mkdtemp(prefix="ffb", dir="/tmp"))  # short: Unix socket path limit
    cp = ControlPlane(ensure_binary(), base / "cp")
    driver = None
    try:
        cp.start()
        api = config.new_client_from_config(str(cp.kubeconfig))
        core = client.CoreV1Api(api)
        node = "bench-rss"
        core.create_node({"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}})
        client.ResourceV1Api(api).create_device_class({"metadata": {"name": "bench-gpu"}, "spec": {
            "selectors": [{"cel": {"expression": f"device.driver == '{GPU}'"}}]}})
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": ns}})
        host = fixture.write_fixture("p5.48xlarge", base / "host", node)
        log = open(base / "driver.log", "ab")
        driver = subprocess.Popen(
            [sys.executable, "-m", "eks_dra.drivers.main", "gpu", "--node-name", node, "--kubeconfig",
             str(cp.kubeconfig), "--host-root", str(host), "--plugins-dir", str(base / "plugins"), "--registry-dir",
             str(base / "registry"), "--cdi-root", str(base / "cdi"), "--health-port", "-1", "--metrics-port", "-1"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        sock = base / "registry" / f"{GPU}-reg.sock"
        wait_until(sock.exists, 30, what="registration socket")
        kubelet = wait_until(lambda: Kubelet(sock, timeout=45), 30, what="plugin answering")
        claims = allocated_claims(api, ns, node, [f"gpu-{i}" for i in range(8)])

        def cycle(i: int) -> float:
            claim = claims[i % len(claims)]
            t = time.perf_counter()
            prep = kubelet.prepare([claim])[claim[1]]
            if prep.error:
                raise SystemExit(f"prepare failed at cycle {i}: {prep.error}")
            unprep = kubelet.unprepare([claim])[claim[1]]
            if unprep.error:
                raise SystemExit(f"unprepare failed at cycle {i}: {unprep.error}")
            return time.perf_counter() - t

        for i in range(500):  # warm-up: first-use imports, gRPC and HTTP connection pools, caches
            cycle(i)
        before = rss_kib(driver.pid)
        t0 = time.monotonic()
        latencies = [cycle(i) for i in range(cycles)]
        took = time.monotonic() - t0
        after = rss_kib(driver.pid)
        growth = (after - before) / before * 100
        lat = sorted(latencies)
        print(f"\n== RSS over {cycles} prepare/unprepare cycles (real API server, GET per prepare)")
        print(f"  RSS before {before / 1024:.1f} MiB, after {after / 1024:.1f} MiB, growth {growth:+.1f} % "
              f"(target <= 10 %)")
        print(f"  cycle (prepare + unprepare) p50 {statistics.median(lat) * 1000:.2f} ms, "
              f"p99 {lat[int(0.99 * (len(lat) - 1))] * 1000:.2f} ms, {cycles / took:.0f} cycles/s")
        kubelet.close()
        return 0 if growth <= 10 else 1
    finally:
        if driver is not None and driver.poll() is None:
            driver.terminate()
            try:
                driver.wait(15)
            except subprocess.TimeoutExpired:
                driver.kill()
                driver.wait(5)
        cp.stop()
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scaled", action="store_true", help="the test tier's scaled-down counts (minutes, not ~20)")
    p.add_argument("--skip-scenarios", action="store_true")
    p.add_argument("--skip-rss", action="store_true")
    p.add_argument("--cycles", type=int, default=10_000)
    args = p.parse_args()
    rc = 0
    if not args.skip_scenarios:
        rc |= run_scenarios(full=not args.scaled)
    if not args.skip_rss:
        rc |= run_rss(args.cycles)
    return rc


if __name__ == "__main__":
    sys.exit(main())
