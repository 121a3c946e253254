"""Driver benchmark: prints start-up, publication, prepare/unprepare latency and memory figures.

A p5.48xlarge fixture host tree (8 GPUs, 32 EFA) and the in-test Kubernetes API server of the driver tests;
the drivers run as real `eks-dra-driver` processes and are driven by a kubelet-side gRPC client over their
Unix sockets, exactly as in tests/test_driver_process.py.

    python bench/driver.py [--cycles 10000] [--samples 500] [--idle 20]
    python bench/driver.py --profile [--samples 500]   # where one prepare's time goes (cProfile)

Targets: registration and DRA sockets answering within 100 ms of process start (the first DRA answer needs
the checkpoint loaded and the devices discovered: printed too), slices within 1 s after, prepare p50 <= 1.3x
and p99 <= 2x the I/O floor measured in the same run (one GET of the claim + the same writes, fsyncs and
renames as a prepare), RSS < 50 MiB per driver after the run, RSS growth after 10,000 cycles <= 10 %, a burst
of 40 claims (8 GPU + 32 EFA, concurrent) well under a second without a failed prepare.
"""

from __future__ import annotations

import argparse
import compileall
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
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


def start(node: Node, family: str, kubeconfig: Path, kube: FakeKube) -> tuple[DriverProcess, Kubelet, dict]:
    """Start a driver process; seconds from the spawn to: registration answered (GetInfo), the DRA socket's
    first answer (an empty NodePrepareResources: checkpoint loaded, devices discovered), slices published."""
    t0 = time.monotonic()
    proc = DriverProcess(node, family, kubeconfig, "--reconcile-interval", "60", "--resync-interval", "30",
                         "--health-interval", "1", "--rediscover-interval", "10")
    sock = registration_socket(node, family)
    kubelet: list[Kubelet] = []

    def registered() -> bool:
        if not sock.exists():
            return False
        kubelet.append(Kubelet(sock, timeout=2))  # GetInfo
        return True

    wait(registered)
    times = {"registered": time.monotonic() - t0}
    kubelet[0].notify(True)
    kubelet[0].prepare([])
    times["dra"] = time.monotonic() - t0
    wait(lambda: kube.slices_of(node.name, DRIVERS[family]))
    times["slices"] = time.monotonic() - t0 - times["registered"]
    return proc, kubelet[0], times


def startup_series(node: Node, family: str, kubeconfig: Path, starts: int) -> list[float]:
    """Seconds from spawn to registration answered (GetInfo), over `starts` fresh processes of one family."""
    out = []
    sock = registration_socket(node, family)
    for _ in range(starts):
        t0 = time.monotonic()
        proc = DriverProcess(node, family, kubeconfig, "--reconcile-interval", "60")

        def registered() -> bool:
            if not sock.exists():
                return False
            Kubelet(sock, timeout=2)  # GetInfo
            return True

        wait(registered)
        out.append(time.monotonic() - t0)
        proc.terminate()
    return out


MEMORY_STEPS = (  # (what, code run in one fresh interpreter, in order): what each part of a driver adds to RSS
    ("python interpreter", "pass"),
    ("grpcio + our protos (before the sockets serve)", "from eks_dra.drivers.framework import plugin"),
    ("kubernetes client core (rest, ApiClient; pulls in urllib3 and requests)",
     "from eks_dra.drivers.framework import kube; kube.use_slim_import(); import kubernetes.client.api_client"),
    ("kubeconfig loader (not used in a pod: in-cluster config)", "import kubernetes.config.kube_config"),
    ("prometheus_client (metrics, with its HTTP exposition)", "import prometheus_client"),
    ("the framework (driver, state, checkpoint, publisher, ...)", "import eks_dra.drivers.framework.driver"),
    ("catalog + device model + GPU and EFA discovery",
     "import eks_dra.drivers.gpu.family, eks_dra.drivers.gpu.discovery, eks_dra.drivers.gpu.health, "
     "eks_dra.drivers.efa.discovery"),
)


def memory_breakdown() -> list[tuple[str, float]]:
    """RSS added by each part of a driver process, imported in start-up order in one fresh interpreter."""
    code = ["import json", "def rss():", "    for line in open('/proc/self/status'):",
            "        if line.startswith('VmRSS:'):", "            return int(line.split()[1]) / 1024", "out = []"]
    for what, stmt in MEMORY_STEPS:
        code += [stmt, f"out.append(({what!r}, rss()))"]
    code.append("print(json.dumps(out))")
    result = subprocess.run([sys.executable, "-c", "\n".join(code)], check=True, capture_output=True, text=True)
    steps, previous, out = json.loads(result.stdout), 0.0, []
    for what, total in steps:
        out.append((what, total - previous))
        previous = total
    return out


def spread(values: list[float]) -> str:
    return f"min {min(values) * 1000:6.1f}  median {pct(values, 50) * 1000:6.1f}  max {max(values) * 1000:6.1f} ms"


def spawn_seconds(code: str, runs: int) -> list[float]:
    """Seconds from spawn to exit of `python -c code`: what any Python process (and one importing grpc) pays."""
    out = []
    for _ in range(runs):
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c", code], check=True)
        out.append(time.monotonic() - t0)
    return out


class IoFloor:
    """The I/O a prepare cannot avoid, measured on the same disk and API server: one GET of the claim (plain
    HTTP + JSON decode) and the prepare's writes: the CDI spec (write + rename) and the checkpoint (write +
    fsync + rename + directory fsync); an unprepare's: unlink + the checkpoint write."""

    def __init__(self, kube: FakeKube, directory: Path, spec_bytes: int, checkpoint_bytes: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", kube.server.server_address[1])
        self.cdi, self.state = directory / "cdi", directory / "state"  # two directories, as the driver's
        for d in (self.cdi, self.state):
            d.mkdir(parents=True, exist_ok=True)
        self.spec, self.checkpoint = b"x" * spec_bytes, b"y" * checkpoint_bytes

    def _write(self, directory: Path, name: str, data: bytes, durable: bool) -> None:
        tmp = directory / f".{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, data)
        if durable:
            os.fsync(fd)
        os.close(fd)
        os.replace(tmp, directory / name)
        if durable:
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            os.fsync(dfd)
            os.close(dfd)

    def prepare(self, claim: dict) -> float:
        t = time.perf_counter()
        self.conn.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{claim['metadata']['namespace']}/"
                                 f"resourceclaims/{claim['metadata']['name']}")
        json.loads(self.conn.getresponse().read())
        self._write(self.cdi, "spec.json", self.spec, False)
        self._write(self.state, "checkpoint.json", self.checkpoint, True)
        return time.perf_counter() - t

    def unprepare(self) -> float:
        t = time.perf_counter()
        os.unlink(self.cdi / "spec.json")
        self._write(self.state, "checkpoint.json", self.checkpoint, True)
        return time.perf_counter() - t


def latency(kube: FakeKube, kubelet: Kubelet, node: Node, devices: list[str], samples: int,
            floor: IoFloor | None = None) -> dict[str, float]:
    """Sequential prepare+unprepare cycles; with `floor`, a floor sample after each (same disk conditions)."""
    prep, unprep, fprep, funprep = [], [], [], []
    t_all = time.monotonic()
    for _ in range(samples):
        claim = kube.put_claim(make_claim(DRIVERS["gpu"], node.name, devices))
        t = time.perf_counter()
        out = kubelet.prepare([claim])
        prep.append(time.perf_counter() - t)
        assert not out[claim["metadata"]["uid"]].error, out
        t = time.perf_counter()
        kubelet.unprepare([claim])
        unprep.append(time.perf_counter() - t)
        kube.delete_claim("default", claim["metadata"]["name"])
        if floor is not None:
            fprep.append(floor.prepare(claim))
            funprep.append(floor.unprepare())
    total = time.monotonic() - t_all
    out = {"prepare_p50_ms": statistics.median(prep) * 1000, "prepare_p99_ms": pct(prep, 99) * 1000,
           "unprepare_p50_ms": statistics.median(unprep) * 1000, "unprepare_p99_ms": pct(unprep, 99) * 1000,
           "cycles_per_s": samples / total}
    if floor is not None:
        out.update({"floor_prepare_p50_ms": statistics.median(fprep) * 1000,
                    "floor_prepare_p99_ms": pct(fprep, 99) * 1000,
                    "floor_unprepare_p50_ms": statistics.median(funprep) * 1000,
                    "floor_unprepare_p99_ms": pct(funprep, 99) * 1000})
    return out


def burst(kube: FakeKube, node: Node, k_gpu: Kubelet, k_efa: Kubelet) -> tuple[float, int, list[float]]:
    """40 claims at once, one per device of the node (8 GPU + 32 EFA), each in its own concurrent gRPC call
    as the kubelet's pod workers make them; seconds until all answered, failures, per-call seconds."""
    efa_devices = sorted(d["name"] for s in kube.slices_of(node.name, DRIVERS["efa"]) for d in s["spec"]["devices"])
    jobs = [(k_gpu, kube.put_claim(make_claim(DRIVERS["gpu"], node.name, [f"gpu-{i}"]))) for i in range(8)]
    jobs += [(k_efa, kube.put_claim(make_claim(DRIVERS["efa"], node.name, [d]))) for d in efa_devices]
    results: list[tuple[str, float]] = [("", 0.0)] * len(jobs)
    go = threading.Event()

    def one(i: int) -> None:
        k, claim = jobs[i]
        go.wait()
        t = time.perf_counter()
        entry = k.prepare([claim])[claim["metadata"]["uid"]]
        results[i] = (entry.error, time.perf_counter() - t)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    go.set()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    for k, claim in jobs:
        k.unprepare([claim])
        kube.delete_claim("default", claim["metadata"]["name"])
    return took, sum(1 for e, _ in results if e), [d for _, d in results]


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
    new, k, times = start(node, "gpu", kubeconfig, kube)
    reg = times["registered"]
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


# (label, module file suffix, function): cumulative time inside these per prepare; nested rows are marked
PROFILE_ROWS = [
    ("DeviceState.prepare (all driver work)", "drivers/framework/state.py", "prepare"),
    ("  API GET of the claim + JSON decode", "drivers/framework/kube.py", "get_claim"),
    ("    JSON decode of the claim", "drivers/framework/kube.py", "<json.loads>"),
    ("  claim checks + config decode (plan)", "drivers/framework/state.py", "plan"),
    ("    device-node presence (stat)", "drivers/framework/state.py", "_check_device_nodes"),
    ("  checkpoint load/verify", "drivers/framework/checkpoint.py", "load"),
    ("    checkpoint decode + checksum", "drivers/framework/checkpoint.py", "decode"),
    ("  checkpoint serialize + write", "drivers/framework/checkpoint.py", "save"),
    ("    checkpoint encode + checksum", "drivers/framework/checkpoint.py", "encode"),
    ("  settings + CDI spec (_apply)", "drivers/framework/state.py", "_apply"),
    ("    CDI spec write", "drivers/framework/cdi.py", "write"),
    ("  node lock acquire/release", "drivers/framework/lock.py", "held"),
    ("  fsync (file + directory)", "~", "<built-in method posix.fsync>"),
    ("  logging", "logging/__init__.py", "_log"),
    ("  metrics", "prometheus_client/metrics.py", "inc"),
]


def profile_prepare(samples: int) -> int:
    """In-process driver (fsync on), the kubelet client over the real socket; cProfile inside the gRPC worker
    thread around DeviceState.prepare; the rest of the client-measured latency is gRPC (both ends)."""
    import cProfile
    import pstats

    from drivers.harness import start_driver

    base = short_tmp()
    kube = FakeKube()
    node = Node(base, "p5.48xlarge", "bench-node")
    kube.add_node(node.name)
    driver = start_driver(kube, node, "gpu", durable=True, reconcile_interval_s=3600)
    kubelet = registration_client(node)
    prof = cProfile.Profile()
    inner: list[float] = []
    prepare = driver.state.prepare

    def profiled(refs):
        t = time.perf_counter()
        prof.enable()
        try:
            return prepare(refs)
        finally:
            prof.disable()
            inner.append(time.perf_counter() - t)

    driver.state.prepare = profiled
    for label, devices in (("1-device", ["gpu-3"]), ("8-device", [f"gpu-{i}" for i in range(8)])):
        prof = cProfile.Profile()
        inner.clear()
        outer = []
        for _ in range(samples):
            claim = kube.put_claim(make_claim(DRIVERS["gpu"], node.name, devices))
            t = time.perf_counter()
            out = kubelet.prepare([claim])
            outer.append(time.perf_counter() - t)
            assert not out[claim["metadata"]["uid"]].error, out
            kubelet.unprepare([claim])
            kube.delete_claim("default", claim["metadata"]["name"])
        stats = pstats.Stats(prof).stats  # {(file, line, func): (cc, nc, tottime, cumtime, callers)}
        print(f"\n== profile: gpu {label} prepare, {samples} samples (cProfile adds overhead; shares matter)")
        print(f"  client-measured prepare        p50 {statistics.median(outer) * 1000:7.3f} ms")
        print(f"  inside DeviceState.prepare     p50 {statistics.median(inner) * 1000:7.3f} ms")
        print(f"  gRPC (client + server + proto) p50 "
              f"{(statistics.median(outer) - statistics.median(inner)) * 1000:7.3f} ms")
        total = sum(v[3] for k, v in stats.items() if k[0].endswith("drivers/framework/state.py") and k[2] == "prepare")
        for row, suffix, func in PROFILE_ROWS:
            if func == "<json.loads>":
                cum = sum(t for k, v in stats.items() if k[2] == "loads" and k[0].endswith("json/__init__.py")
                          for (cf, _cl, cfn), (_a, _b, _c, t) in v[4].items()
                          if cf.endswith("drivers/framework/kube.py") and cfn == "_call")
            else:
                cum = sum(v[3] for k, v in stats.items() if k[2] == func and k[0].endswith(suffix))
            print(f"  {row:42s} {cum / samples * 1000:7.3f} ms/prepare  {100 * cum / total if total else 0:5.1f} %")
        top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:12]
        print("  top functions by own time:")
        for (file, line, func), (_cc, nc, tottime, _cum, _callers) in top:
            print(f"    {tottime / samples * 1000:7.3f} ms/prepare {nc / samples:6.1f} calls  "
                  f"{Path(file).name}:{line} {func}")
    kubelet.close()
    driver.stop(0.5)
    kube.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=10000, help="prepare/unprepare cycles for the memory check")
    parser.add_argument("--samples", type=int, default=500, help="claims per latency figure")
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of idle for the API-write count")
    parser.add_argument("--profile", action="store_true", help="only profile a prepare (cProfile) and print it")
    parser.add_argument("--starts", type=int, default=10, help="fresh processes per family for the start-up figure")
    args = parser.parse_args()
    if args.profile:
        return profile_prepare(args.samples)
    # The image byte-compiles the package at build time (Dockerfile: compileall); do the same here, so that a
    # source file edited since its last .pyc (PYTHONDONTWRITEBYTECODE=1 keeps it stale) is not recompiled on
    # every start and counted as start-up.
    compileall.compile_dir(str(REPO / "eks_dra"), quiet=1)

    base = short_tmp()
    kube = FakeKube()
    node = Node(base, "p5.48xlarge", "bench-node")
    kube.add_node(node.name)
    kubeconfig = kube.write_kubeconfig(base / "kubeconfig")
    print("eks-dra driver bench: p5.48xlarge fixture (8 GPU, 32 EFA), in-test API server, fsync on")

    for family in ("gpu", "efa"):
        series = startup_series(node, family, kubeconfig, args.starts)
        print(f"{family:4s} start-to-registration, {args.starts} starts: {spread(series)}   (target < 100)")
    print(f"     python -c pass, {args.starts} runs:              {spread(spawn_seconds('pass', args.starts))}")
    print(f"     python -c 'import grpc', {args.starts} runs:     {spread(spawn_seconds('import grpc', args.starts))}")
    gpu, k_gpu, t_gpu = start(node, "gpu", kubeconfig, kube)
    efa, k_efa, t_efa = start(node, "efa", kubeconfig, kube)
    for family, t in (("gpu", t_gpu), ("efa", t_efa)):
        print(f"{family:4s} start-to-registration answered {t['registered'] * 1000:8.1f} ms   (target < 100)")
        print(f"{family:4s} start-to-first DRA answer       {t['dra'] * 1000:8.1f} ms   (checkpoint loaded, devices "
              "discovered)")
        print(f"{family:4s} registered-to-slices            {t['slices'] * 1000:8.1f} ms   (target < 1000)")
    time.sleep(1.0)
    print(f"gpu  RSS after start            {rss_mib(gpu.proc.pid):8.1f} MiB  (target < 50)")
    print(f"efa  RSS after start            {rss_mib(efa.proc.pid):8.1f} MiB  (target < 50)")

    state = node.plugins / DRIVERS["gpu"]
    rows = []
    for label, devices in (("1-device", ["gpu-3"]), ("8-device", [f"gpu-{i}" for i in range(8)])):
        latency(kube, k_gpu, node, devices, 20)  # warm-up
        claim = kube.put_claim(make_claim(DRIVERS["gpu"], node.name, devices))  # the sizes a prepare writes
        k_gpu.prepare([claim])
        sizes = [(node.cdi / f"k8s.{DRIVERS['gpu']}-claim_{claim['metadata']['uid']}.json").stat().st_size,
                 (state / "checkpoint.json").stat().st_size]
        k_gpu.unprepare([claim])
        floor = IoFloor(kube, base / "floor", *sizes)
        r = latency(kube, k_gpu, node, devices, args.samples, floor)
        rows.append((label, r))
        print(f"gpu  {label} prepare   p50 {r['prepare_p50_ms']:6.2f} ms  p99 {r['prepare_p99_ms']:6.2f} ms")
        print(f"gpu  {label} unprepare p50 {r['unprepare_p50_ms']:6.2f} ms  p99 {r['unprepare_p99_ms']:6.2f} ms")
        print(f"gpu  {label} throughput    {r['cycles_per_s']:7.1f} prepare+unprepare cycles/s (sequential)")
    # The kubelet-plugin gRPC hop alone (an empty NodePrepareResources over the same socket), which the I/O floor
    # leaves out: what is left of ours after the floor and this hop is the driver's own processing.
    empty = []
    for _ in range(args.samples):
        t = time.perf_counter()
        k_gpu.prepare([])
        empty.append((time.perf_counter() - t) * 1000)
    empty_p50 = pct(empty, 50)
    print(f"gpu  empty NodePrepareResources (gRPC hop only) p50 {empty_p50:.2f} ms  p99 {pct(empty, 99):.2f} ms")
    print("\n| claim | call | ours p50 | floor p50 | ratio (<= 1.3) | ours p99 | floor p99 | ratio (<= 2) "
          "| ours - floor - gRPC hop, p50 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, r in rows:
        for call in ("prepare", "unprepare"):
            o50, f50 = r[f"{call}_p50_ms"], r[f"floor_{call}_p50_ms"]
            o99, f99 = r[f"{call}_p99_ms"], r[f"floor_{call}_p99_ms"]
            print(f"| {label} | {call} | {o50:.2f} ms | {f50:.2f} ms | {o50 / f50:.2f} | {o99:.2f} ms | {f99:.2f} ms "
                  f"| {o99 / f99:.2f} | {o50 - f50 - empty_p50:.2f} ms |")
    print()
    for i in range(3):
        took, failed, per_call = burst(kube, node, k_gpu, k_efa)
        print(f"both burst {i + 1}: 40 claims (8 GPU + 32 EFA, concurrent) all prepared in {took * 1000:7.1f} ms, "
              f"{failed} failed, slowest call {max(per_call) * 1000:.1f} ms (target well under 1000, 0 failed)")

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
    r = latency(kube, k_gpu, node, ["gpu-5"], args.cycles)
    end_rss = rss_mib(gpu.proc.pid)
    print(f"gpu  {args.cycles} prepare/unprepare cycles in {time.monotonic() - t:.1f} s: RSS {start_rss:.1f} -> "
          f"{end_rss:.1f} MiB, growth {100 * (end_rss - start_rss) / start_rss:+.1f} % (target <= 10); "
          f"prepare p99 {r['prepare_p99_ms']:.2f} ms")

    # reboot (new boot id, /var/run/cdi emptied) and a corrupt checkpoint, each with 8 prepared claims
    gpu = recovery(node, kube, kubeconfig, gpu, k_gpu, "reboot")
    gpu = recovery(node, kube, kubeconfig, gpu, None, "corrupt checkpoint")
    k_gpu = registration_client(node)
    print(f"gpu  RSS after the run          {rss_mib(gpu.proc.pid):8.1f} MiB  (target < 50)")
    print(f"efa  RSS after the run          {rss_mib(efa.proc.pid):8.1f} MiB  (target < 50)")
    print("     what the parts of a driver add to RSS (imports, one fresh interpreter; the rest of a running")
    print("     driver's RSS is its threads, sockets, caches and allocator slack):")
    for what, mib in memory_breakdown():
        print(f"       {mib:5.1f} MiB  {what}")

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
