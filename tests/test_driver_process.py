"""The `eks-dra-driver` process: start-up, imports, SIGTERM, liveness, metrics, and kill -9 at random points
during 200 prepare/unprepare cycles."""

from __future__ import annotations

import importlib.metadata
import json
import random
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest
from drivers.harness import DRIVERS, REPO, Sandbox, connect, make_claim, wait_for

from eks_dra.drivers.framework.checkpoint import CheckpointStore
from eks_dra.drivers.framework.readiness import taint_key

GPU = DRIVERS["gpu"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def proc_env():
    box = Sandbox()
    node = box.node(directory="a", taints=[{"key": taint_key(GPU), "value": "true", "effect": "NoSchedule"}])
    yield box.kube, node, lambda *extra, family="gpu", env=None: box.spawn(node, family, *extra, env=env)
    box.close()


def test_bad_flags_exit_2():
    out = subprocess.run([sys.executable, "-m", "eks_dra.drivers.main", "gpu"], capture_output=True, text=True,
                         cwd=REPO, env={"PATH": "/usr/bin:/bin"}, timeout=30)
    assert out.returncode == 2
    assert "--node-name (or NODE_NAME) is required" in out.stderr
    assert "Traceback" not in out.stderr


def test_no_cluster_credentials_exit_2_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "eks_dra.drivers.main", "efa", "--node-name", "n",
                          "--kubeconfig", str(tmp_path / "missing"), "--plugins-dir", str(tmp_path)],
                         capture_output=True, text=True, cwd=REPO, env={"PATH": "/usr/bin:/bin"}, timeout=30)
    assert out.returncode == 2
    assert "cannot configure the Kubernetes client" in out.stderr and "Traceback" not in out.stderr


def test_entry_point_starts_fast_without_cdk_and_sigterm_is_clean(proc_env):
    kube, node, spawn = proc_env
    probe = ("import atexit, runpy, sys\n"
             "atexit.register(lambda: print('MODULES', sorted({m.split('.')[0] for m in sys.modules}), file=sys.stderr))\n"
             "sys.argv = ['eks-dra-driver'] + sys.argv[1:]\n"
             "runpy.run_module('eks_dra.drivers.main', run_name='__main__')\n")
    args = node.args("gpu", node.base.parent / "kubeconfig", "--pod-uid", "aaaaaaaa-0000-4000-8000-000000000001")
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", probe, *args], cwd=REPO, stderr=subprocess.PIPE, text=True)
    k = connect(node, pod_uid="aaaaaaaa-0000-4000-8000-000000000001")
    k.notify(True)
    registered = time.monotonic() - t0
    wait_for(lambda: len(kube.slices_of("node-a", GPU)) == 1, what="slices")
    published = time.monotonic() - t0
    wait_for(lambda: kube.node_taints("node-a") == [], what="taint removed")
    claim = kube.put_claim(make_claim(GPU, "node-a", ["gpu-0"]))
    assert k.prepare([claim])[claim["metadata"]["uid"]].error == ""
    k.close()
    writes_before = sum(v for (res, _), v in kube.writes.items() if res != "events")
    proc.send_signal(15)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err[-2000:]
    modules = json.loads(err.split("MODULES ", 1)[1].splitlines()[0].replace("'", '"'))
    assert not {"aws_cdk", "jsii", "cdk8s", "constructs", "cdk_nag", "boto3", "botocore"} & set(modules)
    # every third-party module the running driver loaded comes from the image's runtime subset (Dockerfile)
    runtime = re.search(r'runtime="([^"]+)"', (REPO / "Dockerfile").read_text().replace("\\\n", "")).group(1)
    allowed = {canonical(n) for n in runtime.split()}
    owners = importlib.metadata.packages_distributions()
    optional = {"eks_dra", "grpc_tools", "_distutils_hack"}  # grpc tries grpc_tools; setuptools' .pth hook
    foreign = {m: owners[m] for m in modules if m in owners and m not in optional
               and not {canonical(d) for d in owners[m]} & allowed}
    assert not foreign, f"modules from outside the image's runtime subset: {foreign}"
    assert registered < 2.0 + 1.0, registered  # target 2 s; slack for 2 busy CPUs
    assert published - registered < 2.0
    # SIGTERM: own sockets gone, slices, taint state and checkpoint untouched
    assert list(node.registry.iterdir()) == []
    assert not list((node.plugins / GPU).glob("*.sock"))
    assert len(kube.slices_of("node-a", GPU)) == 1
    assert kube.node_taints("node-a") == []
    assert kube.writes[("resourceslices", "delete")] == 0
    assert claim["metadata"]["uid"] in CheckpointStore(node.plugins / GPU, GPU, "node-a").load().claims
    assert sum(v for (res, _), v in kube.writes.items() if res != "events") == writes_before  # SIGTERM writes nothing


def test_liveness_and_metrics_endpoints(proc_env):
    kube, node, spawn = proc_env
    health_port, metrics_port = free_port(), free_port()
    spawn("--health-port", str(health_port), "--health-address", "127.0.0.1", "--metrics-port", str(metrics_port))
    k = connect(node)
    wait_for(lambda: len(kube.slices_of("node-a", GPU)) == 1, what="slices")
    claim = kube.put_claim(make_claim(GPU, "node-a", ["gpu-1"]))
    assert k.prepare([claim])[claim["metadata"]["uid"]].error == ""
    def livez() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/livez", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    wait_for(lambda: livez()[0] == 200, timeout=10, what="liveness passes")
    (node.plugins / GPU / "dra.sock").unlink()  # the DRA socket is gone: not alive any more
    wait_for(lambda: livez()[0] == 503, timeout=20, what="liveness fails")
    assert "UNAVAILABLE" in livez()[1]
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    assert f'eks_dra_prepare_total{{driver="{GPU}",result="ok"}} 1.0' in text
    assert f'eks_dra_published_devices{{driver="{GPU}"}} 8.0' in text
    assert "eks_dra_prepare_seconds_bucket" in text
    k.close()


def test_kill_minus_nine_during_200_cycles(proc_env):
    """Kill -9 at random moments of 200 prepare/unprepare cycles; after each restart: no prepared claim
    forgotten, no device held by two claims, no CDI spec without a claim."""
    kube, node, spawn = proc_env
    rng = random.Random(7)
    devices = [f"gpu-{i}" for i in range(8)]
    proc = spawn("--reconcile-interval", "3600")
    k = connect(node)
    prepared: dict[str, dict] = {}  # what the kubelet believes: uid -> claim
    pending: dict[str, tuple[str, dict]] = {}  # calls that died with the process: uid -> (op, claim)
    kills = 0
    store = CheckpointStore(node.plugins / GPU, GPU, "node-a")

    def check_invariants():
        cp = store.load()
        for uid in prepared:
            if uid in pending:  # an unprepare died half-way: the kubelet retries it, no promise either way
                continue
            assert uid in cp.claims and cp.claims[uid].completed, f"prepared claim {uid} forgotten"
            assert (node.cdi / f"k8s.{GPU}-claim_{uid}.json").exists(), f"spec of {uid} missing"
        holders: dict[str, str] = {}
        for rec in cp.claims.values():
            for d in rec.devices:
                assert d.device_name not in holders, f"{d.device_name} held by {holders.get(d.device_name)} and {rec.uid}"
                holders[d.device_name] = rec.uid
        specs = {p.name.split("_", 1)[1].removesuffix(".json") for p in node.cdi.glob(f"k8s.{GPU}-claim_*.json")}
        assert specs <= set(cp.claims) | set(pending), f"leaked specs {specs - set(cp.claims) - set(pending)}"

    def call(op, claim):
        uid = claim["metadata"]["uid"]
        resp = (k.prepare if op == "prepare" else k.unprepare)([claim])[uid]
        assert resp.error == "", resp.error
        pending.pop(uid, None)
        if op == "prepare":
            prepared[uid] = claim
        else:
            prepared.pop(uid, None)

    cycle = 0
    while cycle < 200:
        free = [d for d in devices if not any(c["status"]["allocation"]["devices"]["results"][0]["device"] == d
                                              for c in list(prepared.values()) + [c for _, c in pending.values()])]
        if pending:
            uid, (op, claim) = next(iter(pending.items()))
        elif free and (not prepared or rng.random() < 0.55):
            op, claim = "prepare", kube.put_claim(make_claim(GPU, "node-a", [rng.choice(free)]))
        else:
            op, claim = "unprepare", prepared[rng.choice(sorted(prepared))]
        killer = None
        if rng.random() < 0.15:
            killer = threading.Timer(rng.uniform(0, 0.006), proc.proc.kill)
            killer.start()
        try:
            call(op, claim)
            cycle += 1
        except grpc.RpcError:
            pending[claim["metadata"]["uid"]] = (op, claim)  # the kubelet retries it after the restart
        if killer is not None:
            killer.join()
            kills += 1
            proc.proc.wait(10)
            k.close()
            check_invariants()
            proc = spawn("--reconcile-interval", "3600")
            k = connect(node)
            check_invariants()
    for claim in list(prepared.values()):
        call("unprepare", claim)
    k.close()
    cp = store.load()
    assert cp.claims == {}
    assert list(node.cdi.glob("*.json")) == []
    assert list(node.cdi.glob(".*")) == []
    assert kills >= 15


def test_newer_checkpoint_exit_3_with_a_clear_message(proc_env):
    kube, node, spawn = proc_env
    state = node.plugins / GPU
    state.mkdir(parents=True)
    doc = {"kind": "EksDraCheckpoint", "version": 99, "minReaderVersion": 99, "checksum": "sha256:x", "data": {}}
    (state / "checkpoint.json").write_text(json.dumps(doc))
    p = spawn()
    assert p.proc.wait(30) == 3
    p.log.flush()
    log = (node.base / "driver-gpu.log").read_text()
    assert "refusing to run" in log and "newer driver" in log and "Traceback" not in log
    assert json.loads((state / "checkpoint.json").read_text()) == doc
    wait_for(lambda: any(e["reason"] == "CheckpointTooNew" for e in kube.events), what="Warning Event")
