"""The driver's crash-safe record of prepared claims: `<state-dir>/checkpoint.json`.

Format (JSON, our own: the Go checkpoint's spew-based checksum cannot be reproduced in Python):

    {"kind": "EksDraCheckpoint", "version": 2, "minReaderVersion": 2,
     "checksum": "sha256:<hex of the canonical JSON of data>",
     "data": {"driver": ..., "nodeName": ..., "bootId": ...,
              "claims": {<uid>: {"namespace", "name", "state": "PrepareStarted"|"PrepareCompleted",
                                 "devices": [{"requestNames", "poolName", "deviceName", "cdiDeviceIds"}],
                                 "cdiSpec": <file name>, "settings": {...}}}}}

Version history: 1 had no bootId and no settings; 2 adds both (a reboot empties /var/run/cdi and resets
device settings, so a claim recorded under another boot must be re-applied, never trusted).
A reader of version R reads every file with minReaderVersion <= R (missing fields get defaults), and refuses a
newer file with CheckpointTooNew, which is not corruption: the file is left untouched for the newer driver.
A file that does not parse or whose checksum does not match is CheckpointCorrupt; the caller moves it aside.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import crashpoints
from .fsutil import WriteError, atomic_write, fsync_dir, read_all

CHECKPOINT_FILE_NAME = "checkpoint.json"
CURRENT_VERSION = 2
KIND = "EksDraCheckpoint"
PREPARE_STARTED = "PrepareStarted"
PREPARE_COMPLETED = "PrepareCompleted"


class CheckpointError(Exception):
    pass


class CheckpointCorrupt(CheckpointError):
    """The file is unreadable, truncated or fails its checksum."""


class CheckpointTooNew(CheckpointError):
    """The file was written by a newer driver whose format this one cannot read (a downgrade)."""


@dataclass
class PreparedDevice:
    request_names: list[str]
    pool_name: str
    device_name: str
    cdi_device_ids: list[str]

    def to_json(self) -> dict:
        return {"requestNames": self.request_names, "poolName": self.pool_name,
                "deviceName": self.device_name, "cdiDeviceIds": self.cdi_device_ids}

    @classmethod
    def from_json(cls, obj: dict) -> PreparedDevice:
        return cls(list(obj.get("requestNames") or []), str(obj["poolName"]), str(obj["deviceName"]),
                   list(obj.get("cdiDeviceIds") or []))


@dataclass
class ClaimRecord:
    uid: str
    namespace: str
    name: str
    state: str
    devices: list[PreparedDevice] = field(default_factory=list)
    cdi_spec: str = ""
    settings: dict = field(default_factory=dict)  # device settings applied (time-slicing, Neuron LNC, ...)
    # Rebuilt from a CDI spec after a corrupt checkpoint: devices and CDI ids known, request names, settings,
    # namespace and name not yet filled in from the API claim. Never answered to the kubelet in this state.
    incomplete: bool = False

    @property
    def completed(self) -> bool:
        return self.state == PREPARE_COMPLETED

    def to_json(self) -> dict:
        out = {"namespace": self.namespace, "name": self.name, "state": self.state,
               "devices": [d.to_json() for d in self.devices], "cdiSpec": self.cdi_spec, "settings": self.settings}
        if self.incomplete:  # only then: a complete record stays byte-identical to what version 2 always wrote
            out["incomplete"] = True
        return out

    @classmethod
    def from_json(cls, uid: str, obj: dict) -> ClaimRecord:
        state = obj.get("state")
        if state not in (PREPARE_STARTED, PREPARE_COMPLETED):
            raise ValueError(f"claim {uid}: unknown state {state!r}")
        return cls(uid, str(obj.get("namespace", "")), str(obj.get("name", "")), state,
                   [PreparedDevice.from_json(d) for d in obj.get("devices") or []],
                   str(obj.get("cdiSpec", "")), dict(obj.get("settings") or {}), obj.get("incomplete") is True)

    def ref(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass
class Checkpoint:
    boot_id: str | None = None
    claims: dict[str, ClaimRecord] = field(default_factory=dict)
    version_read: int = CURRENT_VERSION  # the version of the file it came from (0: no file)

    def device_holders(self, device_name: str, except_uid: str = "") -> list[ClaimRecord]:
        """The claims (started or completed) holding a device, other than `except_uid`: one, or more where
        adminAccess claims share it."""
        return [rec for rec in self.claims.values()
                if rec.uid != except_uid and any(d.device_name == device_name for d in rec.devices)]


def _canonical(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def _checksum(data: dict) -> str:
    return "sha256:" + hashlib.sha256(_canonical(data)).hexdigest()


def encode(cp: Checkpoint, driver: str, node_name: str, version: int = CURRENT_VERSION) -> bytes:
    data: dict = {"driver": driver, "nodeName": node_name,
                  "claims": {uid: rec.to_json() for uid, rec in cp.claims.items()}}
    if version >= 2:
        data["bootId"] = cp.boot_id
    else:  # the version-1 schema, kept to test upgrades from it
        for rec in data["claims"].values():
            del rec["settings"]
    # The document is the canonical JSON of {checksum, data, kind, minReaderVersion, version} (keys sorted):
    # assembled around the one serialization of `data` that the checksum needs, byte for byte the same.
    canonical = _canonical(data)
    checksum = "sha256:" + hashlib.sha256(canonical).hexdigest()
    return b"".join((b'{"checksum":', json.dumps(checksum).encode(), b',"data":', canonical, b',"kind":',
                     json.dumps(KIND).encode(), b',"minReaderVersion":%d,"version":%d}' % (version, version)))


def decode(raw: bytes, source: str, reader_version: int = CURRENT_VERSION) -> Checkpoint:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointCorrupt(f"{source}: not JSON ({exc}); truncated or overwritten") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND or not isinstance(doc.get("data"), dict):
        raise CheckpointCorrupt(f"{source}: not an {KIND} document")
    version, min_reader = doc.get("version"), doc.get("minReaderVersion", doc.get("version"))
    if not isinstance(version, int) or not isinstance(min_reader, int) or version < 1:
        raise CheckpointCorrupt(f"{source}: version field missing or not an integer")
    if min_reader > reader_version:
        raise CheckpointTooNew(
            f"{source}: checkpoint format version {version} was written by a newer driver and needs a reader of "
            f"version >= {min_reader}; this driver reads versions <= {reader_version}. Downgrading the driver "
            f"with claims prepared is not supported: roll the newer version back out, or drain the node, then "
            f"remove the file. The file was left untouched.")
    data = doc["data"]
    if doc.get("checksum") != _checksum(data):
        raise CheckpointCorrupt(f"{source}: checksum mismatch (the file was modified or partly written)")
    try:
        claims = {uid: ClaimRecord.from_json(uid, obj) for uid, obj in (data.get("claims") or {}).items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointCorrupt(f"{source}: malformed claim record: {exc}") from None
    return Checkpoint(boot_id=data.get("bootId"), claims=claims, version_read=version)


class CheckpointStore:
    """Loads and saves the checkpoint; re-reads the file only when it changed on disk (another process).

    The cache is keyed by (device, inode, size, mtime) of the file it came from, and holds that file open:
    the file is only ever replaced by rename, and an inode number cannot be reused while a descriptor keeps
    it alive, so an unchanged key means unchanged bytes (an in-place edit changes size or mtime; the
    checksum catches a torn one on the next read).
    """

    def __init__(self, state_dir: Path, driver: str, node_name: str, reader_version: int = CURRENT_VERSION,
                 durable: bool = True) -> None:
        self.path = Path(state_dir) / CHECKPOINT_FILE_NAME
        self.driver, self.node_name = driver, node_name
        self.reader_version = reader_version
        self.durable = durable
        self._cache: tuple[tuple | None, Checkpoint, int] | None = None  # (file key, checkpoint, pinning fd)
        self._swap_lock = threading.Lock()
        self.reads = self.writes = 0  # file reads + decodes, file writes (tests and the benchmark count them)

    def _set_cache(self, entry: tuple[tuple | None, Checkpoint, int] | None) -> None:
        with self._swap_lock:
            old, self._cache = self._cache, entry
        if old is not None and old[2] >= 0:
            os.close(old[2])

    def load(self) -> Checkpoint:
        """The current checkpoint (an empty one when there is no file). Raises CheckpointError."""
        try:
            st = os.stat(self.path)
            key: tuple | None = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            key = None
        cache = self._cache
        if cache is not None and cache[0] == key:
            return cache[1]
        if key is None:
            cp = Checkpoint(version_read=0)
            self._set_cache((None, cp, -1))
            return cp
        fd, key, raw = self._open_and_read()
        try:
            cp = decode(raw, str(self.path), self.reader_version)
        except BaseException:
            os.close(fd)
            raise
        self.reads += 1
        self._set_cache((key, cp, fd))
        return cp

    def _open_and_read(self) -> tuple[int, tuple, bytes]:
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            raw = read_all(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), raw

    def save(self, cp: Checkpoint, version: int = CURRENT_VERSION, durable: bool = True) -> None:
        """Atomically replace the file; `durable` also fsyncs it (needed only for what must survive power loss:
        a process crash keeps the page cache).

        Whole or failed: raises WriteError (naming the file and the cause) unless the file now at the path is the
        one written and read back; only then does the cache hold `cp` (callers mutate the cached object, so a
        failed write also drops the cache: the next load reads what is really on disk).
        """
        raw = encode(cp, self.driver, self.node_name, version)
        try:
            written = atomic_write(self.path, raw, 0o600, self.durable and durable)
            self.writes += 1
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            self._set_cache(None)
            raise
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino, st.st_size) != (written.st_dev, written.st_ino, len(raw)):
            # The caller holds the node lock: nothing else may replace the file between the rename and this open.
            os.close(fd)
            self._set_cache(None)
            raise WriteError(self.path, "replaced by another writer while the node lock was held")
        self._set_cache(((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), cp, fd))

    def replace_corrupt(self, rebuilt: Checkpoint) -> Path:
        """Keep the corrupt file for inspection and replace it with `rebuilt`, crash-safely (caller holds the lock).

        The corrupt bytes get a second name (a hard link, or a copy where links are refused) before the rebuilt
        checkpoint is renamed over the original name: at every instant `checkpoint.json` is the old file or the
        new one, never missing, so a crash in between repeats the recovery instead of looking like a first start.
        """
        target = self._preserve()
        crashpoints.reached("recovery.preserved")
        self.save(rebuilt)
        return target

    def _preserve(self) -> Path:
        st = os.stat(self.path)
        for existing in self.path.parent.glob(f"{self.path.name}.corrupt-*"):
            other = os.stat(existing)
            if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                return existing  # a recovery that crashed after this step: the bytes are already kept
        target = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        try:
            os.link(self.path, target)
            fsync_dir(self.path.parent)
        except OSError:  # a file system without hard links: a durable copy
            atomic_write(target, self.path.read_bytes(), 0o600)
        return target

    def remove_stale_temporaries(self) -> int:
        """Temporary files of a checkpoint write that a crash interrupted (caller holds the lock)."""
        removed = 0
        for path in self.path.parent.glob(f".{self.path.name}.*.tmp"):
            path.unlink(missing_ok=True)
            removed += 1
        return removed
