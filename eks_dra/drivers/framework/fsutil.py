"""Whole-or-failed file replacement shared by the checkpoint and the CDI specs."""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

from . import crashpoints

# A random temporary name that is taken already is someone else's entry (a planted link): never reused.
_TEMPORARY_NAME_TRIES = 8


class WriteError(OSError):
    """A file could not be written whole: whatever was at its name before is still there (only a failed fsync of
    the directory, after the rename, leaves the new file in place, not yet safe from a power loss).

    An OSError (errno kept: ENOSPC, EIO, ...) whose text names the file and the cause, fit for a claim's answer.
    """

    def __init__(self, path: Path, cause: OSError | str) -> None:
        reason = (cause.strerror or str(cause)) if isinstance(cause, OSError) else cause
        code = cause.errno if isinstance(cause, OSError) and cause.errno else errno.EIO
        super().__init__(code, f"cannot write {path}: {reason}", str(path))

    def __str__(self) -> str:
        return self.strerror


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data` (os.write may write less than asked: a full disk, a signal) or raise."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:  # no progress and no error: never report the file as written
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def read_all(fd: int) -> bytes:
    """Every byte of the open file `fd`, from its start (pread: whatever its offset)."""
    chunks, offset = [], 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def read_no_follow(path: Path) -> bytes:
    """The bytes of the regular file at `path`; a symlink at that name raises OSError (ELOOP), never followed."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return read_all(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int = 0o644, durable: bool = True) -> os.stat_result:
    """Replace `path` with exactly `data`, or raise WriteError and leave `path` as it was; returns the new file's
    status (its inode tells a caller that the file it opens at `path` is the one written).

    A reader (or a crash) sees the old or the new file, never a mix. The temporary file is a hidden one (the
    kubelet and CDI loaders skip dot-files) with a random name in the same directory, created with
    O_EXCL | O_NOFOLLOW (a link planted at that name is never followed); it is written whole, read back and
    compared, fsynced, then renamed (rename replaces the entry at `path`, it never follows a link there), then
    the directory is fsynced so that the rename survives a power loss. Any failure removes the temporary file.
    """
    path = Path(path)
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise WriteError(path, exc) from exc
    try:
        return _replace_in(dir_fd, path, data, mode, durable)
    finally:
        os.close(dir_fd)


def _replace_in(dir_fd: int, path: Path, data: bytes, mode: int, durable: bool) -> os.stat_result:
    # Every name is relative to the one directory opened: the temporary file and the rename stay in it.
    tmp, fd = _create_temporary(dir_fd, path)
    try:
        try:
            write_all(fd, data)
            if read_all(fd) != data:  # what a reader of the renamed file will get
                raise OSError(errno.EIO, "the bytes read back differ from the bytes written")
            os.fchmod(fd, mode)  # created 0600: the intended mode only once the file is whole
            if durable:
                os.fsync(fd)
            written = os.fstat(fd)
        finally:
            os.close(fd)
        crashpoints.reached("write.temporary")
        os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException as exc:
        _unlink_quietly(dir_fd, tmp)
        if isinstance(exc, OSError):
            raise WriteError(path, exc) from exc
        raise
    if durable:
        try:
            os.fsync(dir_fd)
        except OSError as exc:
            raise WriteError(path, exc) from exc
    return written


def _create_temporary(dir_fd: int, path: Path) -> tuple[str, int]:
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(_TEMPORARY_NAME_TRIES):
        name = f".{path.name}.{secrets.token_hex(8)}.tmp"
        try:
            return name, os.open(name, flags, mode=0o600, dir_fd=dir_fd)
        except FileExistsError:
            continue
        except OSError as exc:
            raise WriteError(path, exc) from exc
    raise WriteError(path, f"{_TEMPORARY_NAME_TRIES} random temporary names in {path.parent} were all taken")


def _unlink_quietly(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass  # already gone; the start-up sweep removes what a failure here leaves


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
