"""Seeded kill -9 chaos against the GPU driver on the real control plane.

A `Chaos` run plays the kubelet and the scheduler for one simulated p5 node: it creates ResourceClaims (one
or two devices, one or two requests, sometimes a time-slicing config), allocates them by writing their
status and reserves them for a placeholder Pod bound to the node (as the scheduler does), then calls
NodePrepareResources / NodeUnprepareResources on the `eks-dra-driver` process over its sockets, repeats
prepares, and tries forged double allocations. The driver is killed with SIGKILL at random: during a call
(a timer), during start-up, at a named step through the test-only crash points (`EKS_DRA_CRASH_POINT`,
every step of prepare, unprepare, the atomic writes and the recovery), and the checkpoint is corrupted
before some restarts so that recovery runs and is itself killed between its steps.

After every restart the interrupted call is retried (as the kubelet does) and the invariants are checked:
- the driver's CDI specs are exactly the prepared claims, and no device is in two specs;
- a repeated prepare of every prepared claim answers byte for byte as its first prepare (devices, request
  names, CDI ids);
- a forged claim for a device a prepared claim holds is refused;
- a corrupted checkpoint is kept aside byte for byte;
and after the last unprepare nothing is left (no spec, no record once the API's claims are gone).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from controlplane import wait_until
from drivers.kubelet import Kubelet
from kubernetes import client

from eks_dra.devices.names import DEFAULT_DRIVER_NAMES
from eks_dra.devices.names import GPU_CONFIG_API_VERSION as GPU_API_VERSION
from eks_dra.drivers import fixture
from eks_dra.drivers.framework.checkpoint import CHECKPOINT_FILE_NAME

GPU = DEFAULT_DRIVER_NAMES.gpu
DEVICES = [f"gpu-{i}" for i in range(8)]  # p5.48xlarge
CALL_POINTS = ("prepare.started", "prepare.spec_written", "unprepare.spec_removed", "write.temporary")
RECOVERY_POINTS = ("recovery.preserved", "recovery.replaced", "recovery.completed", "recovery.reserved",
                   "write.temporary")
DEVICE_CLASS = "chaos-gpu"


@dataclass
class Claim:
    namespace: str
    name: str
    uid: str
    devices: list[str]
    first: bytes = b""  # the first successful prepare's answer

    @property
    def ref(self) -> tuple[str, str, str]:
        return (self.namespace, self.uid, self.name)


@dataclass
class Result:
    ops: Counter = field(default_factory=Counter)
    kills: Counter = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)

    def line(self) -> str:
        calls = {k: v for k, v in self.ops.items() if k not in ("checks", "corrupt")}
        return (f"chaos: {sum(calls.values())} operations {dict(sorted(calls.items()))}, {self.ops['checks']} "
                f"invariant checks after restarts, {self.ops['corrupt']} corrupted checkpoints, "
                f"{sum(self.kills.values())} kills {dict(sorted(self.kills.items()))}, "
                f"{len(self.violations)} violations")


class DriverDied(Exception):
    pass


class Chaos:
    def __init__(self, api: client.ApiClient, kubeconfig: Path, root: Path, seed: int) -> None:
        self.api, self.kubeconfig, self.root = api, kubeconfig, root
        self.rng = random.Random(seed)
        self.node = f"chaos-{seed}-{os.getpid()}"
        self.ns = self.node
        self.core, self.resource = client.CoreV1Api(api), client.ResourceV1Api(api)
        self.host = fixture.write_fixture("p5.48xlarge", root / "host", self.node)
        self.plugins, self.registry, self.cdi = root / "plugins", root / "registry", root / "cdi"
        self.state_dir = self.plugins / GPU
        self.prepared: dict[str, Claim] = {}
        self.released: list[Claim] = []  # unprepared by "the kubelet", still allocated and reserved in the API
        self.result = Result()
        self.proc: subprocess.Popen | None = None
        self.kubelet: Kubelet | None = None
        self.corrupted: list[bytes] = []
        self.in_flight: set[str] = set()
        self.seq = 0

    # ----- cluster side
    def setup(self) -> None:
        self.core.create_node({"metadata": {"name": self.node, "labels": {"kubernetes.io/hostname": self.node}}})
        self.core.create_namespace({"metadata": {"name": self.ns}})
        try:
            self.resource.create_device_class({"metadata": {"name": DEVICE_CLASS}, "spec": {
                "selectors": [{"cel": {"expression": f"device.driver == '{GPU}'"}}]}})
        except client.ApiException as exc:
            if exc.status != 409:
                raise

    def teardown(self) -> None:
        self.stop_driver()
        for call, name in ((self.core.delete_namespace, self.ns), (self.core.delete_node, self.node)):
            try:
                call(name)
            except client.ApiException:
                pass

    def new_claim(self, devices: list[str]) -> Claim:
        self.seq += 1
        name = f"c{self.seq}"
        two = len(devices) == 2 and self.rng.random() < 0.6
        requests = ["gpu", "extra"] if two else ["gpu"]
        per_device = [requests[min(i, len(requests) - 1)] for i in range(len(devices))]
        created = self.resource.create_namespaced_resource_claim(self.ns, {"metadata": {"name": name}, "spec": {
            "devices": {"requests": [{"name": r, "exactly": {"deviceClassName": DEVICE_CLASS,
                                                             "count": per_device.count(r)}} for r in requests]}}})
        pod = self.core.create_namespaced_pod(self.ns, {"metadata": {"name": name}, "spec": {
            "nodeName": self.node, "containers": [{"name": "c", "image": "registry.invalid/none"}],
            "resourceClaims": [{"name": "c", "resourceClaimName": name}]}})
        configs = []
        if self.rng.random() < 0.4:
            configs.append({"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": GPU, "parameters": {
                "apiVersion": GPU_API_VERSION, "kind": "GpuConfig", "sharing": {
                    "strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}}})
        self.resource.patch_namespaced_resource_claim_status(name, self.ns, {"status": {
            "allocation": {"devices": {"results": [{"request": r, "driver": GPU, "pool": self.node, "device": d}
                                                   for r, d in zip(per_device, devices, strict=True)], "config": configs},
                           "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                               {"key": "metadata.name", "operator": "In", "values": [self.node]}]}]}},
            "reservedFor": [{"resource": "pods", "name": name, "uid": pod.metadata.uid}]}})
        return Claim(self.ns, name, created.metadata.uid, devices)

    def delete_claim(self, claim: Claim) -> None:
        for call in (self.core.delete_namespaced_pod, self.resource.delete_namespaced_resource_claim):
            try:
                call(claim.name, self.ns, grace_period_seconds=0)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise

    # ----- the driver process
    def spawn(self, crash_point: str | None = None) -> None:
        self.killed_by_us = self.death_counted = False
        self.armed = (crash_point or "").partition("@")[0]
        env = {**os.environ}
        env.pop("EKS_DRA_CRASH_POINT", None)
        if crash_point:
            env["EKS_DRA_CRASH_POINT"] = crash_point
        with open(self.root / "driver.log", "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "eks_dra.drivers.main", "gpu", "--node-name", self.node, "--kubeconfig",
                 str(self.kubeconfig), "--host-root", str(self.host), "--plugins-dir", str(self.plugins),
                 "--registry-dir", str(self.registry), "--cdi-root", str(self.cdi), "--health-port", "-1",
                 "--metrics-port", "-1", "--reconcile-interval", "2", "--health-interval", "0.5"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)

    def kill(self, why: str) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.result.kills[why] += 1
            self.killed_by_us = True
        if self.proc is not None:
            self.proc.wait(10)

    def dead(self) -> bool:
        """Whether the driver died; a death we did not cause is a crash point's SIGKILL (counted once)."""
        if self.proc.poll() is None:
            return False
        if not self.killed_by_us and not self.death_counted:
            if self.proc.returncode != -signal.SIGKILL:
                raise AssertionError(f"driver exited {self.proc.returncode}; log {self.root / 'driver.log'}")
            self.result.kills[f"point {self.armed}"] += 1
        self.death_counted = True
        return True

    def stop_driver(self) -> None:
        if self.kubelet is not None:
            self.kubelet.close()
            self.kubelet = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill("stuck")

    def connect(self, timeout: float = 60) -> bool:
        """A kubelet client once the plugin answers DRA calls; False if the process died first (a crash point)."""
        sock = self.registry / f"{GPU}-reg.sock"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.dead():
                return False
            try:
                if sock.exists():
                    self.kubelet = Kubelet(sock, timeout=40)
                    # the sockets serve before the checkpoint is loaded (and recovered): a DRA call waits for it
                    self.kubelet.prepare([])
                    return True
            except grpc.RpcError:
                if self.kubelet is not None:
                    self.kubelet.close()
                    self.kubelet = None
            time.sleep(0.01)
        raise TimeoutError(f"driver not serving after {timeout}s; log {self.root / 'driver.log'}")

    def restart(self) -> None:
        """Start the driver until it serves, with chaos on the way: a corrupted checkpoint, a crash point, a
        kill during start-up. Each death counts; the last start is clean."""
        if self.kubelet is not None:
            self.kubelet.close()
            self.kubelet = None
        cp_path = self.state_dir / CHECKPOINT_FILE_NAME
        raw = cp_path.read_bytes() if cp_path.exists() else None
        # (not a file that no driver has seen yet since the last corruption: that one must be kept as it is)
        if raw is not None and raw not in self.corrupted and self.rng.random() < 0.3:
            broken = raw[: self.rng.randrange(0, max(1, len(raw)))]
            cp_path.write_bytes(broken)
            self.corrupted.append(broken)
            self.result.ops["corrupt"] += 1
        corrupted = bool(self.corrupted) and cp_path.exists() and cp_path.read_bytes() == self.corrupted[-1]
        for _ in range(self.rng.randrange(1, 4) if corrupted else self.rng.randrange(0, 2)):
            if corrupted and self.rng.random() < 0.8:  # a crash point between two steps of the recovery
                self.spawn(f"{self.rng.choice(RECOVERY_POINTS)}@{self.rng.randrange(1, 3)}")
                if not self.connect():
                    continue
                self.kubelet.close()
                self.kubelet = None
                self.kill("after start")
            else:
                self.spawn()
                time.sleep(self.rng.uniform(0, 0.8))
                self.kill("start-up")
        # the process that serves: sometimes armed to die at a step of a later prepare, unprepare or write
        armed = self.rng.random() < 0.4
        self.spawn(f"{self.rng.choice(CALL_POINTS)}@{self.rng.randrange(1, 4)}" if armed else None)
        if not self.connect():
            self.restart()

    # ----- calls
    def call(self, fn, claims: list[Claim]):
        """One gRPC call; a random SIGKILL during it with probability `kill_p` (a timer of 0-8 ms)."""
        timer = None
        if self.rng.random() < self.kill_p:
            timer = threading.Timer(self.rng.uniform(0, 0.008), self.kill, args=("in call",))
            timer.start()
        try:
            out = fn([c.ref for c in claims])
        except grpc.RpcError as exc:
            if timer is not None:
                timer.join()
            try:
                self.proc.wait(5)  # the socket closes a moment before the killed process is reaped
            except subprocess.TimeoutExpired:
                raise AssertionError(f"driver alive but the call failed: {exc}") from None
            self.dead()
            raise DriverDied from None
        finally:
            if timer is not None:
                timer.cancel()
                timer.join()
        if self.dead():  # killed just after it answered: the answer stands, the driver restarts
            self.restart()
            self.check()
        return out

    def until_done(self, fn, claims: list[Claim]):
        """The kubelet's retry: the same call after every restart until it answers. Until then its claims
        may or may not have a spec (the driver never answered): the checks meanwhile allow both."""
        self.in_flight = {c.uid for c in claims}
        try:
            while True:
                try:
                    return self.call(fn, claims)
                except DriverDied:
                    self.restart()
                    self.check()
        finally:
            self.in_flight = set()

    # ----- operations
    def held(self) -> set[str]:
        return {d for c in [*self.prepared.values(), *self.released] for d in c.devices}

    def op_prepare_new(self) -> None:
        free = [d for d in DEVICES if d not in self.held()]
        if not free:
            return self.op_unprepare()
        devices = self.rng.sample(free, min(len(free), self.rng.choice((1, 1, 2))))
        claim = self.new_claim(devices)
        self.result.ops["prepare"] += 1
        entry = self.until_done(lambda refs: self.kubelet.prepare(refs), [claim])[claim.uid]
        if entry.error:
            self.violation(f"prepare of {claim.name} {devices} refused: {entry.error}")
            return
        claim.first = entry.SerializeToString(deterministic=True)
        self.prepared[claim.uid] = claim

    def op_repeat(self) -> None:
        claim = self.rng.choice(list(self.prepared.values()))
        self.result.ops["repeat prepare"] += 1
        entry = self.until_done(lambda refs: self.kubelet.prepare(refs), [claim])[claim.uid]
        self.compare(claim, entry)

    def op_unprepare(self) -> None:
        if not self.prepared:
            return
        claim = self.prepared[self.rng.choice(list(self.prepared))]
        self.result.ops["unprepare"] += 1
        entry = self.until_done(lambda refs: self.kubelet.unprepare(refs), [claim])[claim.uid]
        if entry.error:
            self.violation(f"unprepare of {claim.name} failed: {entry.error}")
            return
        del self.prepared[claim.uid]
        if self.rng.random() < 0.5:
            self.released.append(claim)  # the pod is gone from the kubelet, the API catches up later
        else:
            self.delete_claim(claim)

    def op_forge(self) -> None:
        victim = self.rng.choice(list(self.prepared.values()))
        forged = self.new_claim([self.rng.choice(victim.devices)])
        self.result.ops["forged"] += 1
        entry = self.until_done(lambda refs: self.kubelet.prepare(refs), [forged])[forged.uid]
        if "already prepared" not in entry.error:
            self.violation(f"forged claim for {forged.devices} held by {victim.name} not refused: "
                           f"{entry.error or 'prepared'}")
        self.delete_claim(forged)

    def catch_up(self) -> None:
        while self.released and self.rng.random() < 0.5:
            self.delete_claim(self.released.pop(0))

    # ----- invariants
    def violation(self, what: str) -> None:
        self.result.violations.append(what)

    def compare(self, claim: Claim, entry) -> None:
        got = entry.SerializeToString(deterministic=True)
        if entry.error or got != claim.first:
            self.violation(f"repeated prepare of {claim.name} answered {entry} (first answer differs)")

    def specs(self) -> dict[str, list[str]]:
        prefix = f"k8s.{GPU}-claim_"
        out = {}
        for path in self.cdi.glob(f"{prefix}*.json"):
            uid = path.name[len(prefix):-5]
            try:
                spec = json.loads(path.read_text())
            except ValueError:
                out[uid] = ["<unreadable>"]
                continue
            out[uid] = [d["name"][len(uid) + 1:] for d in spec.get("devices") or []]
        return out

    def check(self) -> None:
        """The invariants; a crash point firing meanwhile (a background write) restarts and checks again."""
        try:
            self._check()
        except grpc.RpcError:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                raise AssertionError("driver alive but a check's call failed") from None
            self.dead()
            self.restart()
            self.check()

    def _check(self) -> None:
        self.result.ops["checks"] += 1
        specs = self.specs()
        stray = set(specs) - set(self.prepared) - self.in_flight
        missing = set(self.prepared) - set(specs) - self.in_flight
        if stray or missing:
            self.violation(f"CDI specs {sorted(stray)} without a prepared claim, prepared claims {sorted(missing)} "
                           "without a spec")
        seen = Counter(d for devices in specs.values() for d in devices)
        if any(n > 1 for n in seen.values()):
            self.violation(f"a device in two CDI specs: {seen}")
        self.catch_up()
        settled = [c for c in self.prepared.values() if c.uid not in self.in_flight]
        if settled:
            out = self.kubelet.prepare([c.ref for c in settled])
            for claim in settled:
                self.compare(claim, out[claim.uid])
            victim = self.rng.choice(settled)
            forged = self.new_claim([victim.devices[0]])
            entry = self.kubelet.prepare([forged.ref])[forged.uid]
            if "already prepared" not in entry.error:
                self.violation(f"after restart: forged claim for {victim.devices[0]} not refused")
            self.delete_claim(forged)
        kept = {p.read_bytes() for p in self.state_dir.glob(f"{CHECKPOINT_FILE_NAME}.corrupt-*")}
        lost = [b for b in self.corrupted if b not in kept]
        if lost:
            self.violation(f"{len(lost)} corrupted checkpoints not kept aside byte for byte")

    # ----- the run
    def run(self, ops: int, kill_p: float = 0.12) -> Result:
        self.kill_p = kill_p
        self.setup()
        self.spawn()
        self.killed_by_us = self.death_counted = False
        assert self.connect(), "first start died"
        for _ in range(ops):
            roll = self.rng.random()
            if roll < 0.35 or not self.prepared:
                self.op_prepare_new()
            elif roll < 0.6:
                self.op_repeat()
            elif roll < 0.85:
                self.op_unprepare()
            elif roll < 0.92:
                self.op_forge()
            else:
                self.kill("between calls")
                self.restart()
                self.check()
            self.catch_up()
        self.finish()
        return self.result

    def finish(self) -> None:
        self.kill_p = 0.0
        claims = list(self.prepared.values())
        if claims:
            out = self.until_done(lambda refs: self.kubelet.unprepare(refs), claims)
            self.result.violations += [f"final unprepare {c.name}: {out[c.uid].error}" for c in claims
                                       if out[c.uid].error]
        self.prepared.clear()
        for claim in self.released:
            self.delete_claim(claim)
        self.released.clear()
        if self.specs():
            self.violation(f"CDI specs left after the last unprepare: {sorted(self.specs())}")

        def records() -> dict:
            try:
                return json.loads((self.state_dir / CHECKPOINT_FILE_NAME).read_text())["data"]["claims"]
            except (OSError, ValueError, KeyError):
                return {"<unreadable>": True}

        try:  # reservations of claims the API released go with the reconciler's next pass
            wait_until(lambda: records() == {}, 30, interval=0.2, what="an empty checkpoint")
        except TimeoutError:
            self.violation(f"records left after the last unprepare: {sorted(records())}")
        self.stop_driver()


def run_chaos(api: client.ApiClient, kubeconfig: Path, base: Path, seed: int, ops: int) -> Result:
    root = base / f"s{seed}"
    chaos = Chaos(api, kubeconfig, root, seed)
    try:
        result = chaos.run(ops)
    finally:
        chaos.teardown()
    if not result.violations:
        shutil.rmtree(root, ignore_errors=True)
    return result
