"""The per-node lock that serializes prepare/unprepare across driver processes.

During a rolling update (`maxSurge: 1`) two plugin pods of one driver run side by side and the kubelet may
call either; `flock` on `<state-dir>/serialize.lock` keeps their checkpoint and CDI writes from interleaving.
A threading lock in front of it serializes this process's own gRPC threads (flock is per open file, and
threads share the file).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE_NAME = "serialize.lock"


class LockTimeout(Exception):
    """The node lock could not be taken in time (another process holds it)."""


class NodeLock:
    def __init__(self, state_dir: Path, timeout_s: float = 30.0) -> None:
        self.path = Path(state_dir) / LOCK_FILE_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.timeout_s = timeout_s
        self._thread_lock = threading.Lock()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    @contextmanager
    def held(self):
        """Hold the node lock; raises LockTimeout (per-claim error, never a hang past the kubelet's 45 s)."""
        deadline = time.monotonic() + self.timeout_s
        if not self._thread_lock.acquire(timeout=self.timeout_s):
            raise LockTimeout(f"{self.path}: busy for {self.timeout_s:.0f}s inside this process")
        try:
            if self._fd < 0:
                raise LockTimeout(f"{self.path}: the driver is shutting down")
            delay = 0.001
            while True:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise LockTimeout(f"{self.path}: held by another driver process for "
                                          f"{self.timeout_s:.0f}s") from None
                    time.sleep(delay)
                    delay = min(delay * 2, 0.05)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()

    def close(self) -> None:
        with self._thread_lock:  # never under a holder's feet
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
