"""Rolling update (maxSurge: 1) and kubelet restarts under a stream of pod creations, with real driver
processes: no failed prepare, no slice deletion by the drivers, no prepared claim lost."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from drivers.fake_kube import FakeKube
from drivers.harness import DRIVERS, Sandbox, connect, make_claim, wait_for
from drivers.kubelet import Kubelet

from eks_dra.drivers.framework.checkpoint import CheckpointStore

EFA = DRIVERS["efa"]
OLD, NEW = "aaaaaaaa-1111-4000-8000-000000000001", "bbbbbbbb-2222-4000-8000-000000000002"


class Churn:
    """Pods coming and going: prepare a claim on a free device, unprepare an older one, through whichever
    plugin the kubelet currently uses (`self.kubelet`)."""

    def __init__(self, kube: FakeKube, node: str, devices: list[str], kubelet: Kubelet) -> None:
        self.kube, self.node, self.free = kube, node, list(devices)
        self.kubelet = kubelet
        self.prepared: list[dict] = []
        self.failures: list[str] = []
        self.prepares = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            k = self.kubelet
            try:
                if self.free and len(self.prepared) < 6:
                    claim = self.kube.put_claim(make_claim(EFA, self.node, [self.free.pop(0)]))
                    entry = k.prepare([claim])[claim["metadata"]["uid"]]
                    if entry.error:
                        self.failures.append(entry.error)
                    else:
                        self.prepared.append(claim)
                        self.prepares += 1
                else:
                    claim = self.prepared.pop(0)
                    entry = k.unprepare([claim])[claim["metadata"]["uid"]]
                    if entry.error:
                        self.failures.append(entry.error)
                    self.free.append(claim["status"]["allocation"]["devices"]["results"][0]["device"])
                    self.kube.delete_claim("default", claim["metadata"]["name"])
            except grpc.RpcError as exc:
                self.failures.append(f"{exc.code().name}: {exc.details()}")
            time.sleep(0.01)


@pytest.fixture
def rollout_env():
    box = Sandbox()
    node = box.node(directory="a")
    yield box.kube, node, lambda pod_uid: box.spawn(node, "efa", "--pod-uid", pod_uid)
    box.close()


def test_rolling_update_disrupts_nothing(rollout_env):
    kube, node, spawn = rollout_env
    old = spawn(OLD)
    k_old = connect(node, "efa", OLD)
    wait_for(lambda: kube.device_count("node-a", EFA) == 32, what="slices")
    devices = sorted(d["name"] for s in kube.slices_of("node-a", EFA) for d in s["spec"]["devices"])[:12]
    churn = Churn(kube, "node-a", devices, k_old)
    churn.thread.start()
    time.sleep(0.5)
    new = spawn(NEW)  # maxSurge: 1 - the new pod starts beside the old one
    k_new = connect(node, "efa", NEW)
    k_new.notify(True)
    churn.kubelet = k_new  # the kubelet uses the newest registration
    time.sleep(0.3)
    assert old.terminate() == 0  # the old pod goes
    time.sleep(1.0)
    churn.stop.set()
    churn.thread.join(10)
    assert churn.failures == []
    assert churn.prepares >= 10
    assert kube.writes[("resourceslices", "delete")] == 0
    assert kube.device_count("node-a", EFA) == 32
    assert (node.registry / f"{EFA}-{NEW}-reg.sock").exists()  # the old pod removed only its own sockets
    assert not (node.registry / f"{EFA}-{OLD}-reg.sock").exists()
    for claim in churn.prepared:  # claims prepared by the old pod unprepare cleanly on the new one
        assert k_new.unprepare([claim])[claim["metadata"]["uid"]].error == ""
    assert CheckpointStore(node.plugins / EFA, EFA, "node-a").load().claims == {}
    assert list(node.cdi.glob("*.json")) == []
    k_old.close()
    k_new.close()
    assert new.terminate() == 0


def test_kubelet_restarts_wipe_slices_twenty_times(rollout_env):
    kube, node, spawn = rollout_env
    spawn(OLD)
    k = connect(node, "efa", OLD)
    wait_for(lambda: kube.device_count("node-a", EFA) == 32, what="slices")
    devices = sorted(d["name"] for s in kube.slices_of("node-a", EFA) for d in s["spec"]["devices"])[:12]
    churn = Churn(kube, "node-a", devices, k)
    churn.thread.start()
    worst = 0.0
    for _ in range(20):
        t = time.monotonic()
        for s in kube.slices_of("node-a"):  # kubelet start: delete every slice of the node
            kube.delete_slice(s["metadata"]["name"])
        wait_for(lambda: kube.device_count("node-a", EFA) == 32, timeout=30, interval=0.005, what="slices back")
        worst = max(worst, time.monotonic() - t)
        time.sleep(0.05)
    churn.stop.set()
    churn.thread.join(10)
    assert worst < 30
    assert churn.failures == []
    recorded = set(CheckpointStore(node.plugins / EFA, EFA, "node-a").load().claims)
    assert {c["metadata"]["uid"] for c in churn.prepared} == recorded  # no prepared claim lost
    k.close()
