"""Restarts, reboots, corrupt and foreign-version checkpoints, orphans: the state always comes back right."""

from __future__ import annotations

import json

import pytest
from drivers.harness import DRIVERS, Sandbox, kubelet_for, make_claim, prepare_claim, wait_for

from eks_dra.drivers import fixture
from eks_dra.drivers.framework.checkpoint import (
    CURRENT_VERSION,
    Checkpoint,
    CheckpointCorrupt,
    CheckpointStore,
    CheckpointTooNew,
    decode,
    encode,
)
from eks_dra.drivers.framework.driver import FatalError

GPU, EFA = DRIVERS["gpu"], DRIVERS["efa"]


@pytest.fixture
def node_env():
    box = Sandbox()
    node = box.node(directory="a")
    yield box.kube, node, lambda family="gpu", **kw: box.start(node, family, **kw)
    box.close()


def spec_path(node, driver, uid):
    return node.cdi / f"k8s.{driver}-claim_{uid}.json"


def test_reboot_rewrites_specs_and_reapplies_settings(node_env):
    kube, node, start = node_env
    d = start()
    ts = {"source": "FromClaim", "requests": [], "opaque": {"driver": GPU, "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}}}
    claims = [prepare_claim(kube, node, "gpu", [f"gpu-{i}"], configs=[ts]) for i in range(3)]
    d.stop(0.5)
    # reboot: new boot id, /var/run/cdi is a tmpfs
    old_boot = json.loads(d.store.path.read_text())["data"]["bootId"]
    new_boot = fixture.set_boot_id(node.host)
    assert new_boot != old_boot
    for p in node.cdi.iterdir():
        p.unlink()
    d2 = start()
    wait_for(lambda: all(spec_path(node, GPU, c["metadata"]["uid"]).exists() for c in claims), timeout=60,
             what="specs rewritten")
    cp = d2.store.load()
    assert cp.boot_id == new_boot
    for c in claims:
        rec = cp.claims[c["metadata"]["uid"]]
        assert rec.settings["applied"]["devices"][rec.devices[0].device_name]["timeSliceInterval"] == "Long"
    assert any(r == "BootChanged" for _, r, _ in d2.events.sent)


def test_reboot_with_cdi_dir_kept_still_reapplies(node_env):
    kube, node, start = node_env
    d = start()
    claim = prepare_claim(kube, node, "gpu", ["gpu-0"])
    d.stop(0.5)
    path = spec_path(node, GPU, claim["metadata"]["uid"])
    path.write_text(json.dumps({"stale": True}))  # a spec from before the reboot is never trusted
    fixture.set_boot_id(node.host)
    start()
    wait_for(lambda: "devices" in json.loads(path.read_text()), what="spec rewritten")


def test_corrupt_checkpoint_moved_aside_event_and_rebuilt(node_env):
    kube, node, start = node_env
    d = start()
    kept = prepare_claim(kube, node, "gpu", ["gpu-1"])
    gone = prepare_claim(kube, node, "gpu", ["gpu-2"])
    unprepared_spec_lost = prepare_claim(kube, node, "gpu", ["gpu-3"])
    d.stop(0.5)
    raw = d.store.path.read_bytes()
    d.store.path.write_bytes(raw[: len(raw) // 2])  # truncated
    kube.delete_claim("default", gone["metadata"]["name"])  # deleted while the plugin was down
    spec_path(node, GPU, unprepared_spec_lost["metadata"]["uid"]).unlink()  # and a lost spec
    d2 = start()
    aside = list(d.store.path.parent.glob("checkpoint.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == raw[: len(raw) // 2]
    assert any(t == "Warning" and r == "CheckpointCorrupt" for t, r, _ in d2.events.sent)
    d2.events.flush()
    assert any(e["reason"] == "CheckpointCorrupt" and e["involvedObject"]["kind"] == "Node" for e in kube.events)
    assert d2.metrics.value("eks_dra_checkpoint_corrupt_total") == 1
    wait_for(lambda: set(d2.store.load().claims) == {kept["metadata"]["uid"], unprepared_spec_lost["metadata"]["uid"]}
             and all(r.namespace for r in d2.store.load().claims.values()), timeout=30, what="rebuilt")
    assert not spec_path(node, GPU, gone["metadata"]["uid"]).exists()
    # a claim without spec is only reserved (the kubelet may have released it); its retried prepare prepares it
    lost = d2.store.load().claims[unprepared_spec_lost["metadata"]["uid"]]
    assert not lost.completed and [x.device_name for x in lost.devices] == ["gpu-3"]
    assert not spec_path(node, GPU, unprepared_spec_lost["metadata"]["uid"]).exists()
    # ready: new claims prepare, the rebuilt ones still block their devices
    prepare_claim(kube, node, "gpu", ["gpu-2"])
    k = kubelet_for(node, "gpu")
    for held in ("gpu-1", "gpu-3"):
        forged = kube.put_claim(make_claim(GPU, "node-a", [held]))
        assert "already prepared" in k.prepare([forged])[forged["metadata"]["uid"]].error
    assert k.prepare([unprepared_spec_lost])[unprepared_spec_lost["metadata"]["uid"]].error == ""  # kubelet retry
    assert spec_path(node, GPU, unprepared_spec_lost["metadata"]["uid"]).exists()
    assert k.unprepare([kept])[kept["metadata"]["uid"]].error == ""
    k.close()


def test_version_one_checkpoint_is_upgraded(node_env):
    kube, node, start = node_env
    d = start()
    claim = prepare_claim(kube, node, "gpu", ["gpu-4"])
    d.stop(0.5)
    cp = d.store.load()
    d.store.path.write_bytes(encode(cp, GPU, "node-a", version=1))  # what the N-1 driver wrote
    assert json.loads(d.store.path.read_text())["version"] == 1
    d2 = start()
    wait_for(lambda: json.loads(d2.store.path.read_text())["version"] == CURRENT_VERSION, what="upgraded")
    assert claim["metadata"]["uid"] in d2.store.load().claims
    k = kubelet_for(node, "gpu")
    assert k.unprepare([claim])[claim["metadata"]["uid"]].error == ""
    k.close()
    assert not spec_path(node, GPU, claim["metadata"]["uid"]).exists()


def test_older_reader_refuses_newer_checkpoint_clearly(tmp_path):
    store = CheckpointStore(tmp_path, GPU, "node-a")
    store.save(Checkpoint(boot_id="b"))
    with pytest.raises(CheckpointTooNew) as err:  # the N-1 reader
        CheckpointStore(tmp_path, GPU, "node-a", reader_version=CURRENT_VERSION - 1).load()
    assert "newer driver" in str(err.value) and "left untouched" in str(err.value)
    assert (tmp_path / "checkpoint.json").exists()
    doc = json.loads(encode(Checkpoint(), GPU, "n"))
    doc["version"] = doc["minReaderVersion"] = CURRENT_VERSION + 1
    with pytest.raises(CheckpointTooNew):
        decode(json.dumps(doc).encode(), "x")


def test_driver_refuses_to_start_on_a_newer_checkpoint(node_env):
    kube, node, start = node_env
    d = start()
    d.stop(0.5)
    doc = json.loads(d.store.path.read_text())
    doc["version"] = doc["minReaderVersion"] = CURRENT_VERSION + 1
    d.store.path.write_text(json.dumps(doc))
    with pytest.raises(FatalError, match="newer driver"):
        start()
    assert json.loads(d.store.path.read_text())["version"] == CURRENT_VERSION + 1  # untouched


@pytest.mark.parametrize("damage", ["garbage", "checksum", "empty", "bad state", "not object"])
def test_corruption_kinds_detected(tmp_path, damage):
    raw = encode(Checkpoint(boot_id="b"), GPU, "n")
    doc = json.loads(raw)
    if damage == "garbage":
        data = b"\x00\xffnot json"
    elif damage == "checksum":
        doc["data"]["bootId"] = "tampered"
        data = json.dumps(doc).encode()
    elif damage == "empty":
        data = b""
    elif damage == "bad state":
        doc["data"]["claims"] = {"u": {"state": "Weird"}}
        data = json.dumps(doc).encode()
    else:
        data = b"[1, 2]"
    with pytest.raises(CheckpointCorrupt):
        decode(data, "f")


def test_orphan_cleaned_within_one_interval(node_env):
    kube, node, start = node_env
    d = start(reconcile_interval_s=1.0)
    claim = prepare_claim(kube, node, "gpu", ["gpu-5"])
    stray = spec_path(node, GPU, "0b0b0b0b-0000-4000-8000-000000000000")
    stray.write_text(spec_path(node, GPU, claim["metadata"]["uid"]).read_text())
    kube.delete_claim("default", claim["metadata"]["name"])  # force-deleted pod and claim
    # the pass removes, then counts and reports: wait for the counts too, or a look in between sees 0
    wait_for(lambda: claim["metadata"]["uid"] not in d.store.load().claims and not stray.exists()
             and d.metrics.value("eks_dra_orphans_cleaned_total", kind="cdi_spec") >= 1
             and sum(1 for _, r, _ in d.events.sent if r == "OrphanCleaned") >= 2, timeout=2.5,
             what="orphans cleaned, counted and reported")
    assert not spec_path(node, GPU, claim["metadata"]["uid"]).exists()
    assert d.metrics.value("eks_dra_orphans_cleaned_total", kind="claim") == 1
    assert d.metrics.value("eks_dra_orphans_cleaned_total", kind="cdi_spec") == 1
    assert sum(1 for _, r, _ in d.events.sent if r == "OrphanCleaned") == 2
    prepare_claim(kube, node, "gpu", ["gpu-5"])  # the device is reusable


def test_wiped_cdi_dir_repaired_by_reconciler(node_env):
    kube, node, start = node_env
    d = start(reconcile_interval_s=0.5)
    claim = prepare_claim(kube, node, "gpu", ["gpu-6"])
    path = spec_path(node, GPU, claim["metadata"]["uid"])
    path.unlink()
    wait_for(lambda: path.exists() and d.metrics.value("eks_dra_cdi_specs_rewritten_total") >= 1, timeout=3,
             what="spec rewritten by the reconciler")


def test_checkpoint_corrupted_while_running(node_env):
    kube, node, start = node_env
    d = start()
    kept = prepare_claim(kube, node, "gpu", ["gpu-0"])
    d.store.path.write_text("{ this is not json")  # an editor, a disk error
    claim = kube.put_claim(make_claim(GPU, "node-a", ["gpu-1"]))
    k = kubelet_for(node, "gpu")
    first = k.prepare([claim])[claim["metadata"]["uid"]]
    assert "moved aside and rebuilt" in first.error
    wait_for(lambda: k.prepare([claim])[claim["metadata"]["uid"]].error == "", timeout=10, what="retry succeeds")
    assert len(list(d.store.path.parent.glob("checkpoint.json.corrupt-*"))) == 1
    assert any(r == "CheckpointCorrupt" for _, r, _ in d.events.sent)
    forged = kube.put_claim(make_claim(GPU, "node-a", ["gpu-0"]))
    assert "already prepared" in k.prepare([forged])[forged["metadata"]["uid"]].error  # rebuilt from CDI
    assert k.unprepare([kept, claim])[kept["metadata"]["uid"]].error == ""
    k.close()
