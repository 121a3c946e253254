"""Driver benchmark: prints start-up, publication, prepare/unprepare latency and memory figures.

A p5.48xlarge fixture host tree (8 GPUs, 32 EFA) and the in-test Kubernetes API server of the driver tests;
the drivers run as real `eks-dra-driver` processes and are driven by a kubelet-side gRPC client over their
Unix sockets, exactly as in tests/test_driver_process.py.

    python bench/driver.py [--cycles 10000] [--samples 500] [--idle 20]

Targets: registered within 2 s, slices within 1 s after, prepare p99 < 20 ms, RSS < 80 MiB per driver,
RSS growth after 10,000 prepare/unprepare cycles <= 10 %.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the in-test API server and kubelet client

from drivers.fake_kube import FakeKube  # noqa: E402
from drivers.harness import DRIVERS, DriverProcess, Node, make_claim, registration_socket, short_tmp  # noqa: E402
from drivers.kubelet import Kubelet  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def wait(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception:  # noqa: BLE001 - socket not answering yet
            pass
        time.sleep(0.001)
    raise SystemExit("timed out")


def start(node: Node, family: str, kubeconfig: Path, kube: FakeKube) -> tuple[DriverProcess, Kubelet, float, float]:
    t0 = time.monotonic()
    proc = DriverProcess(node, family, kubeconfig, "--reconcile-interval", "60", "--resync-interval", "30",
                         "--health-interval", "1", "--rediscover-interval", "10")
    sock = registration_socket(node, family)
    kubelet: list[Kubelet] = []

    def registered() -> bool:
        if not sock.exists():
            return False
        k = Kubelet(sock, timeout=2)
        k.notify(True)
        kubelet.append(k)
        return True

    wait(registered)
    t_reg = time.monotonic() - t0
    wait(lambda: kube.slices_of(node.name, DRIVERS[family]))
    t_slices = time.monotonic() - t0 - t_reg
    return proc, kubelet[0], t_reg, t_slices


def latency(kube: FakeKube, kubelet: Kubelet, node: str, devices: list[str], samples: int) -> dict[str, float]:
    prep, unprep = [], []
    t_all = time.monotonic()
    for _ in range(samples):
        claim = kube.put_claim(make_claim(DRIVERS["gpu"], node, devices))
        t = time.perf_counter()
        out = kubelet.prepare([claim])
        prep.append(time.perf_counter() - t)
        assert not out[claim["metadata"]["uid"]].error, out
        t = time.perf_counter()
        kubelet.unprepare([claim])
        unprep.append(time.perf_counter() - t)
        kube.delete_claim("default", claim["metadata"]["name"])
    total = time.monotonic() - t_all
    return {"prepare_p50_ms": statistics.median(prep) * 1000, "prepare_p99_ms": pct(prep, 99) * 1000,
            "unprepare_p50_ms": statistics.median(unprep) * 1000, "unprepare_p99_ms": pct(unprep, 99) * 1000,
            "cycles_per_s": samples / total}


def registration_client(node: Node) -> Kubelet:
    k = Kubelet(registration_socket(node, "gpu"), timeout=10)
    k.notify(True)
    return k


def recovery(node: Node, kube: FakeKube, kubeconfig: Path, proc: DriverProcess, kubelet: Kubelet | None,
             what: str) -> DriverProcess:
    """Restart the gpu driver after `what` with 8 prepared claims; print when they are usable again."""
    from eks_dra.drivers import fixture

    kubelet = kubelet or registration_client(node)
    claims = [kube.put_claim(make_claim(DRIVERS["gpu"], node.name, [f"gpu-{i}"])) for i in range(8)]
    out = kubelet.prepare(claims)
    assert not any(e.error for e in out.values()), out
    kubelet.close()
    proc.terminate()
    proc.close()
    uids = [c["metadata"]["uid"] for c in claims]
    if what == "reboot":
        fixture.set_boot_id(node.host)
        for spec in node.cdi.glob("*.json"):
            spec.unlink()
    else:
        path = node.plugins / DRIVERS["gpu"] / "checkpoint.json"
        path.write_bytes(path.read_bytes()[:100])
    t0 = time.monotonic()
    new, k, reg, _ = start(node, "gpu", kubeconfig, kube)
    wait(lambda: all((node.cdi / f"k8s.{DRIVERS['gpu']}-claim_{u}.json").exists() for u in uids))
    state = node.plugins / DRIVERS["gpu"] / "checkpoint.json"
    wait(lambda: all(u in state.read_text() for u in uids))
    usable = time.monotonic() - t0
    again = k.prepare(claims)  # the kubelet's view: the same devices, nothing refused
    assert not any(e.error for e in again.values()), again
    print(f"gpu  {what}: registered {reg * 1000:6.1f} ms, 8 prepared claims usable again after "
          f"{usable * 1000:6.1f} ms (target < 60000 reboot, < 30000 corrupt)")
    k.unprepare(claims)
    k.close()
    return new


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=10000, help="prepare/unprepare cycles for the memory check")
    parser.add_argument("--samples", type=int, default=500, help="claims per latency figure")
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of idle for the API-write count")
    args = parser.parse_args()

    base = short_tmp()
    kube = FakeKube()
    node = Node(base, "p5.48xlarge", "bench-node")
    kube.add_node(node.name)
    kubeconfig = kube.write_kubeconfig(base / "kubeconfig")
    print("eks-dra driver bench: p5.48xlarge fixture (8 GPU, 32 EFA), in-test API server, fsync on")

    gpu, k_gpu, reg, slices = start(node, "gpu", kubeconfig, kube)
    print(f"gpu  start-to-registered        {reg * 1000:8.1f} ms   (target < 2000)")
    print(f"gpu  registered-to-slices       {slices * 1000:8.1f} ms   (target < 1000)")
    efa, k_efa, reg_e, slices_e = start(node, "efa", kubeconfig, kube)
    print(f"efa  start-to-registered        {reg_e * 1000:8.1f} ms")
    print(f"efa  registered-to-slices       {slices_e * 1000:8.1f} ms")
    time.sleep(1.0)
    print(f"gpu  RSS after start            {rss_mib(gpu.proc.pid):8.1f} MiB  (target < 80)")
    print(f"efa  RSS after start            {rss_mib(efa.proc.pid):8.1f} MiB  (target < 80)")

    for label, devices in (("1-device", ["gpu-3"]), ("8-device", [f"gpu-{i}" for i in range(8)])):
        r = latency(kube, k_gpu, node.name, devices, args.samples)
        print(f"gpu  {label} prepare   p50 {r['prepare_p50_ms']:6.2f} ms  p99 {r['prepare_p99_ms']:6.2f} ms "
              f"(target p99 < 20)")
        print(f"gpu  {label} unprepare p50 {r['unprepare_p50_ms']:6.2f} ms  p99 {r['unprepare_p99_ms']:6.2f} ms")
        print(f"gpu  {label} throughput    {r['cycles_per_s']:7.1f} prepare+unprepare cycles/s (sequential)")

    # slices deleted (as the kubelet does on restart): time until they are back
    times = []
    for _ in range(20):
        name = kube.slices_of(node.name, DRIVERS["efa"])[0]["metadata"]["name"]
        t = time.monotonic()
        kube.delete_slice(name)
        wait(lambda: kube.slices_of(node.name, DRIVERS["efa"]))
        times.append(time.monotonic() - t)
        time.sleep(0.05)
    print(f"efa  slice recreated after delete p50 {statistics.median(times) * 1000:6.1f} ms  "
          f"max {max(times) * 1000:6.1f} ms (target < 15000)")

    before = sum(kube.writes.values())
    time.sleep(args.idle)
    print(f"both API writes while idle for {args.idle:.0f} s: {sum(kube.writes.values()) - before} (target 0)")

    start_rss = rss_mib(gpu.proc.pid)
    t = time.monotonic()
    r = latency(kube, k_gpu, node.name, ["gpu-5"], args.cycles)
    end_rss = rss_mib(gpu.proc.pid)
    print(f"gpu  {args.cycles} prepare/unprepare cycles in {time.monotonic() - t:.1f} s: RSS {start_rss:.1f} -> "
          f"{end_rss:.1f} MiB, growth {100 * (end_rss - start_rss) / start_rss:+.1f} % (target <= 10); "
          f"prepare p99 {r['prepare_p99_ms']:.2f} ms")

    # reboot (new boot id, /var/run/cdi emptied) and a corrupt checkpoint, each with 8 prepared claims
    gpu = recovery(node, kube, kubeconfig, gpu, k_gpu, "reboot")
    gpu = recovery(node, kube, kubeconfig, gpu, None, "corrupt checkpoint")
    k_gpu = registration_client(node)

    for k in (k_gpu, k_efa):
        k.close()
    for p in (gpu, efa):
        rc = p.terminate()
        p.close()
        if rc != 0:
            print(f"driver exited {rc} on SIGTERM", file=sys.stderr)
            return 1
    kube.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
