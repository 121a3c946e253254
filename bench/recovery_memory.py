"""Peak memory of a GPU driver's recovery after a lost checkpoint, in a cluster with many ResourceClaims.

On the real Kubernetes 1.34 control plane of tests/e2e: creates `--claims` ResourceClaims (default 8,000) with
9 KiB opaque configs for an unrelated driver, spread over 8 namespaces; prepares 8 claims allocated (by hand)
to a simulated p5.48xlarge node over the driver's gRPC socket, as the kubelet does; stops the driver, deletes
its checkpoint and starts it again. Once the rebuild is done (Event StateRebuilt on the Node) it prints the
driver process's peak resident memory (VmHWM in /proc/<pid>/status: start-up and recovery) and the memory limit
of the driver DaemonSet the chart synthesizes for config/dev.yaml.

    python bench/recovery_memory.py [--claims 8000] [--workers 8]

Exit status 1 when it cannot measure (no VmHWM, the rebuild not done within the timeout) or when the peak
reaches the limit. Needs Go (the control plane is built by tests/e2e/build.sh on first use).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent import futures
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
for path in ("bench", "tests", "tests/e2e"):  # field_failures' claim set-up, the kubelet client, the control plane
    sys.path.insert(0, str(REPO / path))

from controlplane import ControlPlane, ensure_binary, wait_until  # noqa: E402
from drivers.kubelet import Kubelet  # noqa: E402
from field_failures import GPU, allocated_claims  # noqa: E402

CONFIG_BYTES = 9 * 1024
NAMESPACES = 8
NODE = "bench-recovery"


def chart_memory_limit() -> str:
    """resources.limits.memory of the GPU driver DaemonSet, as the chart synthesizes it for config/dev.yaml."""
    from eks_dra.config import load_environment
    from eks_dra.stacks.manifests import write_manifests

    out = Path(tempfile.mkdtemp(prefix="bench-chart-"))
    try:
        for path in write_manifests(load_environment("dev", REPO / "config"), out):
            for doc in yaml.safe_load_all(Path(path).read_text()):
                if (doc or {}).get("kind") != "DaemonSet":
                    continue
                (container, *_) = doc["spec"]["template"]["spec"]["containers"]
                if container.get("command") == ["eks-dra-driver", "gpu"]:
                    return container["resources"]["limits"]["memory"]
    finally:
        shutil.rmtree(out, ignore_errors=True)
    raise SystemExit("no GPU driver DaemonSet with a memory limit in the synthesized chart")


def mebibytes(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * factor
    return float(quantity) / 2**20


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise SystemExit(f"cannot measure: no VmHWM in /proc/{pid}/status")


def create_claims(api, count: int, workers: int) -> float:
    """`count` unallocated claims with a 9 KiB opaque config each; the seconds it took."""
    from kubernetes import client

    resource, core = client.ResourceV1Api(api), client.CoreV1Api(api)
    namespaces = [f"bench-tenant-{i}-{uuid.uuid4().hex[:4]}" for i in range(NAMESPACES)]
    for ns in namespaces:
        core.create_namespace({"metadata": {"name": ns}})
    blob = "x" * (CONFIG_BYTES - 100)  # the config's JSON comes to 9 KiB with its apiVersion and kind

    def create(i: int) -> None:
        resource.create_namespaced_resource_claim(namespaces[i % NAMESPACES], {
            "metadata": {"name": f"tenant-{i}"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "bench-other"}}],
                                 "config": [{"opaque": {"driver": "other.example.com", "parameters": {
                                     "apiVersion": "example.com/v1", "kind": "Blob", "data": blob}}}]}}},
            _preload_content=False)

    t0 = time.monotonic()
    with futures.ThreadPoolExecutor(workers) as pool:
        for done, _ in enumerate(pool.map(create, range(count)), 1):
            if done % 1000 == 0:
                print(f"  {done} claims created ({time.monotonic() - t0:.0f} s)", flush=True)
    return time.monotonic() - t0


def start_driver(cp: ControlPlane, base: Path, host: Path) -> subprocess.Popen:
    log = open(base / "driver.log", "ab")
    return subprocess.Popen(
        [sys.executable, "-m", "eks_dra.drivers.main", "gpu", "--node-name", NODE, "--kubeconfig",
         str(cp.kubeconfig), "--host-root", str(host), "--plugins-dir", str(base / "plugins"), "--registry-dir",
         str(base / "registry"), "--cdi-root", str(base / "cdi"), "--health-port", "-1", "--metrics-port", "-1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def run(count: int, workers: int, timeout_s: float) -> int:
    from kubernetes import client, config

    from eks_dra.drivers import fixture

    limit = chart_memory_limit()
    base = Path(tempfile.mkdtemp(prefix="brm", dir="/tmp"))  # short: Unix socket path limit
    cp = ControlPlane(ensure_binary(), base / "cp")
    driver = None
    try:
        cp.start()
        api = config.new_client_from_config(str(cp.kubeconfig))
        core = client.CoreV1Api(api)
        core.create_node({"metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}})
        for name, driver_name in (("bench-gpu", GPU), ("bench-other", "other.example.com")):
            client.ResourceV1Api(api).create_device_class({"metadata": {"name": name}, "spec": {
                "selectors": [{"cel": {"expression": f"device.driver == '{driver_name}'"}}]}})
        print(f"== creating {count} ResourceClaims with {CONFIG_BYTES // 1024} KiB opaque configs", flush=True)
        took = create_claims(api, count, workers)
        print(f"  created in {took:.0f} s")
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": ns}})
        host = fixture.write_fixture("p5.48xlarge", base / "host", NODE)
        driver = start_driver(cp, base, host)
        sock = base / "registry" / f"{GPU}-reg.sock"
        wait_until(sock.exists, 30, what="registration socket")
        kubelet = wait_until(lambda: Kubelet(sock, timeout=45), 30, what="plugin answering")
        claims = allocated_claims(api, ns, NODE, [f"gpu-{i}" for i in range(8)])
        errors = {uid: e.error for uid, e in kubelet.prepare(claims).items() if e.error}
        kubelet.close()
        if errors:
            raise SystemExit(f"prepare failed: {errors}")
        stop(driver)
        (base / "plugins" / GPU / "checkpoint.json").unlink()  # lost: the next start rebuilds from the specs

        t0 = time.monotonic()
        driver = start_driver(cp, base, host)

        def rebuilt():
            if driver.poll() is not None:
                raise SystemExit(f"cannot measure: the driver exited ({driver.returncode}) during recovery; "
                                 f"log {base / 'driver.log'}")
            events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={NODE},"
                                                "reason=StateRebuilt").items
            return events[0] if events else None

        try:
            event = wait_until(rebuilt, timeout_s, interval=0.2, what="StateRebuilt Event")
        except TimeoutError:
            peak = peak_rss_kib(driver.pid)
            print(f"cannot measure: no rebuild within {timeout_s:.0f} s (peak RSS so far {peak / 1024:.1f} MiB); "
                  f"log tail:\n" + "\n".join((base / "driver.log").read_text(errors="replace").splitlines()[-5:]))
            return 1
        recovery_s = time.monotonic() - t0
        peak = peak_rss_kib(driver.pid)
        print(f"\n== recovery after a lost checkpoint, {count} claims x {CONFIG_BYTES // 1024} KiB configs in the "
              f"cluster, 8 prepared here")
        print(f"  rebuild: {event.message} ({recovery_s:.1f} s from the driver's start)")
        print(f"  driver peak RSS (VmHWM, start-up + recovery): {peak / 1024:.1f} MiB")
        print(f"  DaemonSet memory limit (chart, config/dev): {limit} ({mebibytes(limit):.0f} MiB)")
        return 0 if peak / 1024 < mebibytes(limit) else 1
    finally:
        stop(driver)
        cp.stop()
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--claims", type=int, default=8000, help="ResourceClaims with 9 KiB configs to create")
    p.add_argument("--workers", type=int, default=8, help="parallel creates")
    p.add_argument("--timeout", type=float, default=120, help="seconds to wait for the rebuild")
    args = p.parse_args()
    return run(args.claims, args.workers, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
