"""Every file the driver writes is whole or the operation fails: a full disk, a planted link, a torn spec.

The full disks are real: small tmpfs file systems mounted (as root) at the CDI root or the state directory of a
driver process, so that os.write really stops short at the last free page and then fails with ENOSPC, as on a
node whose disk is full. Where mounting is not allowed the tests that need it are skipped, saying so.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest
from drivers.harness import Sandbox, connect, make_claim, wait_for

from eks_dra.devices.names import DEFAULT_DRIVER_NAMES
from eks_dra.drivers.framework import fsutil
from eks_dra.drivers.framework.checkpoint import (
    PREPARE_COMPLETED,
    Checkpoint,
    CheckpointStore,
    ClaimRecord,
    PreparedDevice,
    encode,
)

GPU = DEFAULT_DRIVER_NAMES.gpu
PAGE = 4096  # tmpfs hands out space in pages
NO_SPACE = os.strerror(errno.ENOSPC)


def mount_tmpfs(path: Path, size: int, mounted: list[Path]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a {size}-byte tmpfs at {path} ({done.stderr.strip()}): these tests need root "
                    "on a machine that allows mounts")
    mounted.append(path)
    return path


def unmount_all(mounted: list[Path]) -> None:
    for path in reversed(mounted):
        subprocess.run(["umount", "--lazy", str(path)], check=False)  # lazy: a killed driver may hold a file


@pytest.fixture
def small_fs(tmp_path):
    """mount(size) -> a fresh tmpfs of `size` bytes under tmp_path, unmounted at the end."""
    mounted: list[Path] = []
    yield lambda size: mount_tmpfs(tmp_path / f"fs{len(mounted)}", size, mounted)
    unmount_all(mounted)


@pytest.fixture
def box():
    box = Sandbox()
    box.node_a = box.node(directory="a")
    box.mounted = []
    yield box
    unmount_all(box.mounted)  # first: the sandbox then removes the whole tree
    box.close()


def fill_leaving(directory: Path, free_bytes: int) -> Path:
    """A file that takes all the free space of `directory`'s file system but `free_bytes`."""
    st = os.statvfs(directory)
    filler = directory / "filler"
    with open(filler, "xb") as f:  # a buffered file writes on after a short write
        f.write(b"\0" * (st.f_bavail * st.f_frsize - free_bytes))
    assert os.statvfs(directory).f_bavail * st.f_frsize == free_bytes
    return filler


def spec_path(node, uid: str) -> Path:
    return node.cdi / f"k8s.{GPU}-claim_{uid}.json"


def uid(claim: dict) -> str:
    return claim["metadata"]["uid"]


def recorded(node) -> dict[str, ClaimRecord]:
    """The claims in the checkpoint file on disk (a store of our own: never the driver's cache)."""
    return CheckpointStore(node.plugins / GPU, GPU, node.name).load().claims


# ----- atomic_write itself


def test_a_write_the_disk_cannot_hold_raises_and_leaves_the_old_file(small_fs):
    target = small_fs(2 * PAGE) / "k8s.spec.json"
    target.write_bytes(b'{"old": true}')  # one page; one page left
    data = json.dumps({"blob": "x" * 6700}).encode()  # two pages: os.write stops at 4096, the next one fails
    with pytest.raises(OSError) as raised:
        fsutil.atomic_write(target, data, 0o644, durable=True)
    assert raised.value.errno == errno.ENOSPC
    assert str(raised.value) == f"cannot write {target}: {NO_SPACE}"
    assert target.read_bytes() == b'{"old": true}'
    assert os.listdir(target.parent) == [target.name]  # the temporary file is gone


def test_short_writes_are_continued_and_a_write_without_progress_raises(tmp_path, monkeypatch):
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:1000])))  # a signal, a pipe
    target = tmp_path / "spec.json"
    data = bytes(range(256)) * 30
    fsutil.atomic_write(target, data, 0o644)
    assert target.read_bytes() == data
    monkeypatch.setattr(os, "write", lambda fd, data: 0)
    with pytest.raises(OSError, match=f"cannot write {target}: "):
        fsutil.atomic_write(target, b"new" * 100, 0o644)
    assert target.read_bytes() == data
    assert os.listdir(tmp_path) == [target.name]


def test_a_link_planted_at_the_temporary_name_is_not_followed(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's file")
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    target = cdi / "k8s.spec.json"
    planted: list[str] = []
    real_open = os.open

    def open_racing_a_planter(path, flags, mode=0o777, *, dir_fd=None):
        if str(path).endswith(".tmp") and not planted:  # someone plants a link at the name just before us
            os.symlink(victim, path, dir_fd=dir_fd)
            planted.append(os.path.join(cdi, path))
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", open_racing_a_planter)
    fsutil.atomic_write(target, b'{"new": true}', 0o644)
    assert planted
    assert victim.read_bytes() == b"root's file"
    assert not target.is_symlink() and target.read_bytes() == b'{"new": true}'
    assert target.stat().st_mode & 0o777 == 0o644
    os.symlink(victim, cdi / "planted-at-the-final-name")
    os.replace(cdi / "planted-at-the-final-name", target)
    fsutil.atomic_write(target, b'{"newer": true}', 0o644)  # the link's entry is replaced, not followed
    assert victim.read_bytes() == b"root's file"
    assert not target.is_symlink() and target.read_bytes() == b'{"newer": true}'


def test_a_checkpoint_the_disk_cannot_hold_is_an_error_and_the_old_one_stays(small_fs):
    state = small_fs(2 * PAGE)
    store = CheckpointStore(state, GPU, "node-a")
    store.save(Checkpoint(boot_id="b"))  # one page; one page left
    cp = store.load()
    for i in range(24):
        name = f"c{i}"
        cp.claims[name] = ClaimRecord(name, "default", name, PREPARE_COMPLETED,
                                      [PreparedDevice(["req"], "node-a", f"gpu-{i}", [f"k8s.{GPU}/claim={name}"])])
    assert PAGE < len(encode(cp, GPU, "node-a")) <= 2 * PAGE  # the premise: os.write stops at 4096 bytes
    with pytest.raises(OSError) as raised:
        store.save(cp)
    assert raised.value.errno == errno.ENOSPC and str(raised.value) == f"cannot write {store.path}: {NO_SPACE}"
    assert store.load().claims == {}  # the cache was not updated with what never reached the disk
    assert CheckpointStore(state, GPU, "node-a").load().claims == {}  # the old file, whole
    assert sorted(os.listdir(state)) == ["checkpoint.json"]


# ----- a driver process on a full disk


def test_full_cdi_disk_fails_that_claim_only_and_leaves_no_torn_spec(box):
    node = box.node_a
    mount_tmpfs(node.cdi, 3 * PAGE, box.mounted)  # one two-page spec and one page
    box.spawn(node, "gpu")
    k = connect(node, "gpu", timeout=30)
    fits, cut = (box.kube.put_claim(make_claim(GPU, node.name, [d])) for d in ("gpu-0", "gpu-1"))
    # one call each: a call's claims are prepared in parallel, and which of two concurrent writes the last page
    # takes is a race (both may fail, each as its own claim's error)
    answers = {**k.prepare([fits]), **k.prepare([cut])}
    assert answers[uid(fits)].error == ""
    assert PAGE < len(spec_path(node, uid(fits)).read_bytes()) <= 2 * PAGE  # the premise: one spec, two pages
    error = answers[uid(cut)].error
    assert error == (f"{GPU}: claim default/{cut['metadata']['name']} ({uid(cut)}): cannot write "
                     f"{spec_path(node, uid(cut))}: {NO_SPACE}")
    assert not answers[uid(cut)].devices
    assert os.listdir(node.cdi) == [spec_path(node, uid(fits)).name]  # no torn spec, no temporary file
    assert json.loads(spec_path(node, uid(fits)).read_bytes())["devices"][0]["name"] == f"{uid(fits)}-gpu-0"
    claims = recorded(node)
    assert claims[uid(fits)].completed and not (uid(cut) in claims and claims[uid(cut)].completed)

    subprocess.run(["mount", "-o", f"remount,size={16 * PAGE}", str(node.cdi)], check=True)  # space again
    retry = k.prepare([cut])[uid(cut)]
    assert retry.error == "" and [d.device_name for d in retry.devices] == ["gpu-1"]
    assert json.loads(spec_path(node, uid(cut)).read_bytes())["devices"][0]["name"] == f"{uid(cut)}-gpu-1"
    assert recorded(node)[uid(cut)].completed
    k.close()


def test_full_state_disk_fails_the_prepare_instead_of_answering_a_truncated_checkpoint(box):
    node = box.node_a
    state = mount_tmpfs(node.plugins / GPU, 32 * PAGE, box.mounted)
    box.spawn(node, "gpu")
    k = connect(node, "gpu", timeout=30)
    everything = [f"gpu-{i}" for i in range(8)]
    prepared = []
    while not prepared or (state / "checkpoint.json").stat().st_size <= PAGE:  # admin access: any number
        claim = box.kube.put_claim(make_claim(GPU, node.name, everything, admin_access=True))
        assert k.prepare([claim])[uid(claim)].error == ""
        prepared.append(uid(claim))
    before = (state / "checkpoint.json").read_bytes()
    filler = fill_leaving(state, PAGE)  # the next checkpoint (> one page) stops short at 4096 bytes
    late = box.kube.put_claim(make_claim(GPU, node.name, everything, admin_access=True))
    answer = k.prepare([late])[uid(late)]
    assert answer.error == (f"{GPU}: claim default/{late['metadata']['name']} ({uid(late)}): cannot write "
                            f"{state / 'checkpoint.json'}: {NO_SPACE}")
    assert not answer.devices
    assert (state / "checkpoint.json").read_bytes() == before
    assert sorted(recorded(node)) == sorted(prepared)
    assert not list(state.glob(".checkpoint.json.*.tmp"))

    filler.unlink()
    retry = k.prepare([late])[uid(late)]
    assert retry.error == "" and len(retry.devices) == 8
    assert recorded(node)[uid(late)].completed
    k.close()


# ----- the reconciler repairs what a disk or a person tore


def torn(path: Path) -> None:
    raw = path.read_bytes()
    with open(path, "r+b") as f:  # in place, as a crash of a non-atomic writer or a disk error leaves it
        f.truncate(len(raw) // 2)


def other_devices(path: Path) -> None:
    spec = json.loads(path.read_bytes())
    spec["devices"] = [{**d, "name": d["name"].replace("gpu-0", "gpu-7")} for d in spec["devices"]]
    path.write_text(json.dumps(spec))


@pytest.mark.parametrize("damage", [torn, other_devices])
def test_reconciler_rewrites_a_damaged_spec_of_a_prepared_claim(box, damage):
    node = box.node_a
    box.spawn(node, "gpu", "--reconcile-interval", "0.5")
    k = connect(node, "gpu", timeout=30)
    claim = box.kube.put_claim(make_claim(GPU, node.name, ["gpu-0"]))
    assert k.prepare([claim])[uid(claim)].error == ""
    path = spec_path(node, uid(claim))
    whole = path.read_bytes()
    damage(path)
    assert path.read_bytes() != whole
    wait_for(lambda: path.read_bytes() == whole, timeout=15, what="the spec rewritten whole")
    rewritten = wait_for(lambda: [e["message"] for e in box.kube.events if e["reason"] == "CDISpecRewritten"],
                         timeout=10, what="a CDISpecRewritten Event")
    problem = {torn: f"not valid JSON ({len(whole) // 2} bytes: torn or overwritten)",
               other_devices: f"naming devices {uid(claim)}-gpu-7 instead of {uid(claim)}-gpu-0"}[damage]
    assert rewritten == [f"{GPU}: CDI spec of prepared claim default/{claim['metadata']['name']} ({uid(claim)}) "
                         f"was {problem} and has been rewritten"]
    k.close()
