"""A crash during checkpoint recovery loses nothing, and a rebuilt record answers exactly as before.

One test per hole the issue found (each fails on the code before the fix): a rebuilt record's answer, a crash
between any two steps of the recovery (test-only crash points, eks_dra/drivers/framework/crashpoints.py), stale
temporaries, a claim released by the kubelet but still reserved, and the reconciler's first pass.
"""

from __future__ import annotations

import signal

import pytest
from drivers.harness import Sandbox, connect, kubelet_for, make_claim, wait_for

from eks_dra.devices.names import DEFAULT_DRIVER_NAMES
from eks_dra.devices.names import GPU_CONFIG_API_VERSION as GPU_API_VERSION
from eks_dra.drivers.framework.hosttree import read_boot_id

GPU = DEFAULT_DRIVER_NAMES.gpu
RECOVERY_POINTS = ("recovery.preserved", "recovery.replaced", "recovery.completed", "recovery.reserved",
                   "write.temporary")


@pytest.fixture
def box():
    box = Sandbox()
    box.node_a = box.node(directory="a")
    yield box
    box.close()


def time_sliced(interval: str, requests: list[str]) -> dict:
    return {"source": "FromClaim", "requests": requests, "opaque": {"driver": GPU, "parameters": {
        "apiVersion": GPU_API_VERSION, "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}}}}


def two_request_claim(box, devices=("gpu-0", "gpu-1")) -> dict:
    """Two requests, one of them time-sliced: request names and settings both matter to the answer."""
    return box.kube.put_claim(make_claim(GPU, box.node_a.name, list(devices), requests=["gpu", "other"],
                                         configs=[time_sliced("Long", ["gpu"])]))


def answer(k, claim) -> bytes:
    entry = k.prepare([claim])[claim["metadata"]["uid"]]
    assert entry.error == "", entry.error
    return entry.SerializeToString(deterministic=True)


def corrupt(path) -> bytes:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    return raw[: len(raw) // 2]


def spec(node, uid):
    return node.cdi / f"k8s.{GPU}-claim_{uid}.json"


def test_rebuilt_record_answers_byte_identical_with_request_names_and_settings(box):
    d = box.start(box.node_a)
    claim = two_request_claim(box)
    k = kubelet_for(box.node_a, "gpu")
    first = answer(k, claim)
    before = d.store.load().claims[claim["metadata"]["uid"]].to_json()
    k.close()
    d.stop(0.5)
    corrupt(d.store.path)
    d2 = box.start(box.node_a)
    k = kubelet_for(box.node_a, "gpu")
    assert answer(k, claim) == first  # request names "gpu" and "other", same devices, same CDI ids
    assert d2.store.load().claims[claim["metadata"]["uid"]].to_json() == before  # settings: time-slice revert
    k.close()


def test_prepare_of_an_incomplete_record_completes_it_first(box):
    d = box.start(box.node_a, reconcile_interval_s=3600)
    claim = two_request_claim(box)
    k = kubelet_for(box.node_a, "gpu")
    first = answer(k, claim)
    before = d.store.load().claims[claim["metadata"]["uid"]].to_json()
    with d.lock.held():  # the state a crash right after the rebuild leaves (records from CDI specs only)
        d.store.save(d._rebuild_from_cdi(read_boot_id(box.node_a.host)))
    assert d.store.load().claims[claim["metadata"]["uid"]].incomplete
    assert answer(k, claim) == first
    assert d.store.load().claims[claim["metadata"]["uid"]].to_json() == before
    k.close()


def test_missing_checkpoint_with_claim_specs_is_a_rebuild_not_a_first_start(box):
    """What a crash between moving the corrupt file aside and writing the rebuilt one used to leave."""
    d = box.start(box.node_a)
    held = box.kube.put_claim(make_claim(GPU, box.node_a.name, ["gpu-2"]))
    k = kubelet_for(box.node_a, "gpu")
    answer(k, held)
    k.close()
    d.stop(0.5)
    d.store.path.unlink()
    d2 = box.start(box.node_a, reconcile_interval_s=0.3)
    assert any(r == "CheckpointLost" for _, r, _ in d2.events.sent)
    k = kubelet_for(box.node_a, "gpu")
    forged = box.kube.put_claim(make_claim(GPU, box.node_a.name, ["gpu-2"]))
    assert "already prepared" in k.prepare([forged])[forged["metadata"]["uid"]].error
    wait_for(lambda: d2.reconciler.passes >= 2, timeout=5, what="two reconcile passes")
    assert spec(box.node_a, held["metadata"]["uid"]).exists()  # not deleted as an orphan
    k.close()


@pytest.mark.parametrize("point", RECOVERY_POINTS)
def test_kill_at_every_step_of_recovery_loses_nothing(box, point):
    node = box.node_a
    d = box.start(node)
    claims = [two_request_claim(box, ("gpu-0", "gpu-1")), two_request_claim(box, ("gpu-2", "gpu-3"))]
    k = kubelet_for(node, "gpu")
    first = [answer(k, c) for c in claims]
    k.close()
    d.stop(0.5)
    # allocated here and in use, but no spec: the recovery reserves its device ("recovery.reserved")
    box.kube.put_claim(make_claim(GPU, node.name, ["gpu-4"]))
    broken = corrupt(d.store.path)
    proc = box.spawn(node, "gpu", env={"EKS_DRA_CRASH_POINT": point})
    assert proc.proc.wait(30) == -signal.SIGKILL, f"never reached {point}"
    assert d.store.path.exists()  # at every instant the old or the new file
    kept = [p for p in d.store.path.parent.glob("checkpoint.json.corrupt-*") if p.read_bytes() == broken]
    assert len(kept) == 1
    box.spawn(node, "gpu")
    k = connect(node, "gpu", timeout=30)  # (the killed process left its socket files behind)
    wait_for(lambda: k.prepare([claims[0]])[claims[0]["metadata"]["uid"]].error == "", timeout=30, what="serving")
    assert [answer(k, c) for c in claims] == first
    for device in ("gpu-1", "gpu-3", "gpu-4"):
        forged = box.kube.put_claim(make_claim(GPU, node.name, [device]))
        assert "already prepared" in k.prepare([forged])[forged["metadata"]["uid"]].error, device
    assert len([p for p in d.store.path.parent.glob("checkpoint.json.corrupt-*") if p.read_bytes() == broken]) == 1
    assert not list(d.store.path.parent.glob(".checkpoint.json.*.tmp"))
    k.close()


def test_stale_checkpoint_temporaries_removed_at_start(box):
    d = box.start(box.node_a)
    d.stop(0.5)
    stale = d.store.path.parent / f".{d.store.path.name}.4242.tmp"
    stale.write_bytes(b'{"kind": "EksDraCheckpoint", "partial')
    box.start(box.node_a)
    assert not stale.exists()


def test_claim_released_by_the_kubelet_but_still_reserved_is_not_prepared_again(box):
    d = box.start(box.node_a, reconcile_interval_s=3600)
    keep = box.kube.put_claim(make_claim(GPU, box.node_a.name, ["gpu-0"]))
    released = box.kube.put_claim(make_claim(GPU, box.node_a.name, ["gpu-5"]))  # reservedFor: a pod
    k = kubelet_for(box.node_a, "gpu")
    answer(k, keep)
    answer(k, released)
    assert k.unprepare([released])[released["metadata"]["uid"]].error == ""  # its pod ended
    k.close()
    d.stop(0.5)
    corrupt(d.store.path)
    d2 = box.start(box.node_a, reconcile_interval_s=0.3)
    uid = released["metadata"]["uid"]
    assert not spec(box.node_a, uid).exists()  # nothing written for it, no setting applied
    rec = d2.store.load().claims[uid]
    assert not rec.completed and rec.settings == {}
    box.kube.delete_claim("default", released["metadata"]["name"])  # the claim controller catches up
    wait_for(lambda: uid not in d2.store.load().claims, timeout=5, what="reservation released")


def test_reconciler_first_pass_soon_after_start(box):
    d = box.start(box.node_a, reconcile_interval_s=3600)
    claim = box.kube.put_claim(make_claim(GPU, box.node_a.name, ["gpu-6"]))
    k = kubelet_for(box.node_a, "gpu")
    answer(k, claim)
    k.close()
    d.stop(0.5)
    box.kube.delete_claim("default", claim["metadata"]["name"])  # force-deleted while the plugin was down
    d2 = box.start(box.node_a, reconcile_interval_s=3600)
    wait_for(lambda: claim["metadata"]["uid"] not in d2.store.load().claims, timeout=5,
             what="orphan released by the first pass")
    assert not spec(box.node_a, claim["metadata"]["uid"]).exists()
