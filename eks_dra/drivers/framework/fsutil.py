"""Crash-safe file replacement shared by the checkpoint and the CDI specs."""

from __future__ import annotations

import os
from pathlib import Path

from . import crashpoints


def atomic_write(path: Path, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Write `data` to `path` so that a reader (or a crash) sees the old or the new file, never a mix.

    A hidden temporary file in the same directory (the kubelet and CDI loaders skip dot-files), fsync,
    rename, then fsync of the directory so that the rename itself survives a power loss.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        os.write(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    crashpoints.reached("write.temporary")
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
