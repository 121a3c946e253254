"""The prepare hot path reads the checkpoint only when it changed on disk, writes the same bytes as
before, and the kubelet sockets serve before the driver has loaded its state."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import time

from drivers.harness import Sandbox, kubelet_for, make_claim, short_tmp
from drivers.kubelet import Kubelet

from eks_dra.devices.names import DEFAULT_DRIVER_NAMES
from eks_dra.drivers.framework.checkpoint import (
    KIND,
    PREPARE_COMPLETED,
    Checkpoint,
    CheckpointStore,
    ClaimRecord,
    PreparedDevice,
    decode,
    encode,
)
from eks_dra.drivers.framework.plugin import PluginServers

GPU = DEFAULT_DRIVER_NAMES.gpu


def test_encoded_checkpoint_is_the_canonical_document_byte_for_byte():
    cp = Checkpoint(boot_id="b", claims={"u": ClaimRecord("u", "ns", "n", PREPARE_COMPLETED,
                                                          [PreparedDevice(["r"], "p", "gpu-0", ["x"])], "f",
                                                          {"requested": {"gpu-0": {}}})})
    for version in (1, 2):
        raw = encode(cp, GPU, "node", version)
        data = json.loads(raw)["data"]
        checksum = "sha256:" + hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
                                              ).hexdigest()
        doc = {"kind": KIND, "version": version, "minReaderVersion": version, "checksum": checksum, "data": data}
        assert raw == json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        assert decode(raw, "x").claims["u"].devices[0].device_name == "gpu-0"


def test_checkpoint_read_only_when_the_file_changed(tmp_path):
    ours, other = CheckpointStore(tmp_path, GPU, "n"), CheckpointStore(tmp_path, GPU, "n")
    ours.save(Checkpoint(boot_id="b"))
    for _ in range(50):
        ours.load()
    assert ours.reads == 0  # our own write is cached, never read back
    cp = other.load()
    cp.claims["u"] = ClaimRecord("u", "ns", "n", PREPARE_COMPLETED, [PreparedDevice(["r"], "n", "gpu-1", [])])
    other.save(cp)  # another process (a rolling update's second pod) replaced the file
    assert "u" in ours.load().claims and ours.reads == 1
    ours.load()
    assert ours.reads == 1
    raw = ours.path.read_bytes()
    with open(ours.path, "r+b") as f:  # an in-place edit (an editor, a disk error): size and mtime change
        f.write(raw[: len(raw) // 2])
        f.truncate()
    try:
        ours.load()
        raise AssertionError("an in-place truncation was not noticed")
    except Exception as exc:  # noqa: BLE001
        assert "not JSON" in str(exc)


def test_prepare_never_reads_back_its_own_checkpoint_writes():
    box = Sandbox()
    try:
        node = box.node(directory="a")
        d = box.start(node)
        k = kubelet_for(node, "gpu")
        before = d.store.reads
        for i in range(20):
            claim = box.kube.put_claim(make_claim(GPU, node.name, [f"gpu-{i % 8}"]))
            assert k.prepare([claim])[claim["metadata"]["uid"]].error == ""
            assert k.unprepare([claim])[claim["metadata"]["uid"]].error == ""
        assert d.store.reads == before  # 40 calls: every load served from the cache of our own writes
        k.close()
    finally:
        box.close()


def test_sockets_serve_before_the_state_is_attached():
    base = short_tmp()
    servers = PluginServers(driver=GPU, registry_dir=base / "reg", plugins_dir=base / "plugins", pod_uid=None)
    servers.start()
    try:
        k = Kubelet(servers.reg_path, timeout=10)
        assert k.info.name == GPU  # registration answers with no DeviceState at all
        answered = threading.Event()
        threading.Thread(target=lambda: (k.prepare([]), answered.set()), daemon=True).start()
        time.sleep(0.3)
        assert not answered.is_set()  # a DRA call waits for the driver to be ready ...

        class Ready:
            def prepare(self, refs, deadline):
                return {}

        servers.attach(Ready())
        assert answered.wait(5)  # ... and is answered as soon as it is
        k.close()
    finally:
        servers.stop(0)
        shutil.rmtree(base, ignore_errors=True)


def test_a_burst_of_concurrent_prepares_is_group_committed():
    """40 claims at once (a Job): every one prepared, recorded on disk before its answer, fewer writes."""
    box = Sandbox()
    try:
        node = box.node(directory="a")
        d = box.start(node, family="efa")
        claims = [box.kube.put_claim(make_claim(DEFAULT_DRIVER_NAMES.efa, node.name, [name]))
                  for name in sorted(d.inventory.snapshot())]
        assert len(claims) == 32
        writes = d.store.writes
        errors: list[str] = []
        go = threading.Event()

        def one(claim):
            k = kubelet_for(node, "efa")
            go.wait()
            error = k.prepare([claim])[claim["metadata"]["uid"]].error
            on_disk = CheckpointStore(d.store.path.parent, DEFAULT_DRIVER_NAMES.efa, node.name).load()
            rec = on_disk.claims.get(claim["metadata"]["uid"])
            errors.append(error or ("" if rec is not None and rec.completed else "answered before it was recorded"))
            k.close()

        threads = [threading.Thread(target=one, args=(c,)) for c in claims]
        for t in threads:
            t.start()
        go.set()
        for t in threads:
            t.join()
        assert errors == [""] * 32
        assert d.store.writes - writes < 32  # at least two claims shared a checkpoint write
        assert len(d.store.load().claims) == 32
    finally:
        box.close()
