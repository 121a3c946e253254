"""The NVIDIA driver's user-space files under a driver root, found with nvcdi's rules.

A driver root is the directory the NVIDIA driver is installed under on the node: `/` on the AL2023
NVIDIA AMI and on Bottlerocket (the upstream chart's `nvidiaDriverRoot`, default `/`), `/run/nvidia/driver`
with the GPU Operator's driver container. The plugin reads it at `path` (the host's root mount joined
with the driver root, or `/driver-root` where the chart mounts it) and names files in CDI specs by their
host path (`host_path` joined with the path inside the root) and their path in the container (the path
inside the root), as the upstream driver's `transformroot` does.

The search rules are nvidia-container-toolkit v1.20's (`internal/lookup/root`, `pkg/lookup`,
`pkg/nvcdi/driver-nvml.go`), restated:
- Library lookup: first the fixed directories `/`, `/usr/lib64`, `/usr/lib/{x86_64,aarch64}-linux-gnu`,
  `.../nvidia/current`, `/lib64`, `/lib/{x86_64,aarch64}-linux-gnu`, `.../nvidia/current` under the root
  (glob, symlinks resolved); only when nothing matches there, the 64-bit entries of the root's
  `/etc/ld.so.cache` (each entry with its symlink chain, matched by file name, then resolved).
- Driver version: the suffix of the first `libcuda.so.*.*`, else `libnvidia-ml.so.*.*`.
- Driver library directories: the directories of every `lib*.so.<version>` found by the lookup.
- Driver libraries: `*.so.<version>` in those directories and their `vdpau/` subdirectories, plus
  `libnvidia-nvvm70.so.*` (the legacy NVVM), symlinks resolved, each once.
- Binaries: `nvidia-smi`, `nvidia-debugdump`, `nvidia-persistenced`, `nvidia-cuda-mps-control`,
  `nvidia-cuda-mps-server`, `nvidia-imex`, `nvidia-imex-ctl`: the first executable file of that name in
  `/usr/local/sbin`, `/usr/local/bin`, `/usr/sbin`, `/usr/bin`, `/sbin`, `/bin` under the root. (nvcdi also
  searches its own process's PATH and the un-rooted directories; a plugin container's own files are no
  driver files, so those are left out.)
- Firmware: `nvidia/<version>/gsp*.bin` and `ucodes*.bin` under the kernel's firmware search path
  (`/sys/module/firmware_class/parameters/path` when set, `/lib/firmware/updates/<uname -r>`,
  `/lib/firmware/updates`, `/lib/firmware/<uname -r>`, `/lib/firmware`), every match.
- IPC: `/nvidia-persistenced/socket` and `/nvidia-fabricmanager/socket` under `/run` then `/var/run`
  (first match each). (nvcdi also asks for `/tmp/nvidia-mps` but its file locator rejects directories, so
  the MPS pipe directory never appears in its specs; neither does it here.)
Symlinks are resolved inside the root (an absolute link target is taken relative to the root), so a
driver root mounted anywhere resolves to its own files.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from . import ldcache

LIBRARY_SEARCH_PATHS = (
    "/", "/usr/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current", "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/lib64", "/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu/nvidia/current", "/lib/aarch64-linux-gnu/nvidia/current",
)
BINARY_SEARCH_PATHS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
DRIVER_BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
                   "nvidia-cuda-mps-server", "nvidia-imex", "nvidia-imex-ctl")
IPC_SOCKETS = ("/nvidia-persistenced/socket", "/nvidia-fabricmanager/socket")
FIRMWARE_CLASS_PATH = Path("sys/module/firmware_class/parameters/path")
NVML_LIBRARY = "libnvidia-ml.so.1"
_MAX_LINKS = 40


class DriverRootError(RuntimeError):
    """The driver root lacks what the GPU driver needs; the message names the root and what is missing."""


@dataclass(frozen=True)
class DriverFile:
    """One file to mount: where the plugin reads it and where it sits inside the driver root."""

    local: Path  # as the plugin sees it
    path: str  # absolute path inside the driver root (= the container path)


def resolve_in_root(root: Path, path: str) -> str | None:
    """`path` (inside `root`) with every symlink resolved inside `root`; None if it does not exist."""
    parts = [p for p in path.split("/") if p]
    done: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        local = root.joinpath(*done, part)
        if local.is_symlink():
            hops += 1
            if hops > _MAX_LINKS:
                return None
            target = os.readlink(local)
            if target.startswith("/"):
                done = []
            parts = [p for p in target.split("/") if p] + parts
            continue
        if not local.exists() and not local.is_symlink():
            return None
        done.append(part)
    return "/" + "/".join(done)


def symlink_chain(root: Path, path: str) -> list[str]:
    """`path`, then each link target in turn (inside `root`), ending at a non-link, as nvcdi's ResolveChain."""
    chain = [path]
    current = path
    for _ in range(_MAX_LINKS):
        local = root / current.lstrip("/")
        if not local.is_symlink():
            break
        target = os.readlink(local)
        current = os.path.normpath(target if target.startswith("/") else os.path.join(os.path.dirname(current),
                                                                                       target))
        chain.append(current)
    return chain


class DriverRoot:
    """The driver's files under one driver root. Cheap to build; each query reads the tree afresh."""

    def __init__(self, path: Path | str, host_path: str = "/", *, kernel_release: str | None = None,
                 firmware_class_path: str | None = None) -> None:
        self.path = Path(path)
        self.host_path = "/" + str(host_path).strip("/") if str(host_path).strip("/") else "/"
        self.kernel_release = kernel_release if kernel_release is not None else os.uname().release
        self.firmware_class_path = firmware_class_path
        self._version: str | None = None
        self._lib_dirs: list[str] | None = None

    # --- paths ---------------------------------------------------------------------------------

    def local(self, path: str) -> Path:
        return self.path / path.lstrip("/")

    def host(self, path: str) -> str:
        """The node's path of a file inside the driver root (what a CDI spec's hostPath names)."""
        return os.path.join(self.host_path, path.lstrip("/")) if self.host_path != "/" else path

    def _file(self, path: str) -> DriverFile:
        return DriverFile(self.local(path), path)

    def _glob(self, directory: str, pattern: str) -> list[str]:
        base = self.local(directory)
        found = sorted(glob.glob(glob.escape(str(base)) + "/" + pattern))
        return ["/" + os.path.relpath(f, self.path) for f in found if os.path.isfile(f)]

    # --- libraries -------------------------------------------------------------------------------

    def _search_paths_locate(self, pattern: str, dirs: tuple[str, ...] | list[str]) -> list[str]:
        out: list[str] = []
        for d in dirs:
            for found in self._glob(d, pattern):
                resolved = resolve_in_root(self.path, found)
                if resolved is not None and resolved not in out:
                    out.append(resolved)
        return out

    def cache_entries(self) -> list[str]:
        """The root's ld cache: 64-bit library paths with their symlink chains, each once, in cache order."""
        cache = self.local("/" + str(ldcache.CACHE_PATH))
        try:
            entries = ldcache.read(cache)
        except FileNotFoundError:
            return []
        except (OSError, ldcache.LdCacheError) as exc:
            raise DriverRootError(f"{cache}: unreadable ld cache ({exc})") from None
        out: list[str] = []
        for e in entries:
            if e.bits != 64:
                continue
            for p in symlink_chain(self.path, e.path):
                if p not in out:
                    out.append(p)
        return out

    def locate_library(self, pattern: str) -> list[str]:
        """nvcdi's library lookup: the fixed search paths, else the ld cache (by file name)."""
        found = self._search_paths_locate(pattern, LIBRARY_SEARCH_PATHS)
        if found:
            return found
        out: list[str] = []
        for p in self.cache_entries():
            if fnmatchcase(os.path.basename(p), pattern):
                resolved = resolve_in_root(self.path, p)
                if resolved is not None and resolved not in out:
                    out.append(resolved)
        return out

    def version(self) -> str:
        """The driver version from libcuda's (else libnvidia-ml's) file name. Raises DriverRootError."""
        if self._version is None:
            for prefix in ("libcuda.so.", "libnvidia-ml.so."):
                found = self.locate_library(prefix + "*.*")
                if found:
                    self._version = os.path.basename(found[0])[len(prefix):]
                    break
            else:
                raise DriverRootError(
                    f"driver root {self.path}: no libcuda.so.*.* or libnvidia-ml.so.*.* in "
                    f"{', '.join(LIBRARY_SEARCH_PATHS[1:3])}, ... or in its /{ldcache.CACHE_PATH}; is the NVIDIA "
                    "driver installed there (--driver-root)?")
        return self._version

    def library_dirs(self) -> list[str]:
        """Directories (inside the root) holding the versioned driver libraries, in lookup order."""
        if self._lib_dirs is None:
            dirs: list[str] = []
            for p in self.locate_library("lib*.so." + self.version()):
                if os.path.dirname(p) not in dirs:
                    dirs.append(os.path.dirname(p))
            self._lib_dirs = dirs
        return self._lib_dirs

    def libraries(self) -> list[DriverFile]:
        """The driver's user-space libraries, resolved, each once."""
        dirs = self.library_dirs()
        with_vdpau = [*dirs, *(os.path.join(d, "vdpau") for d in dirs)]
        found = self._search_paths_locate("*.so." + self.version(), with_vdpau)
        for p in self._search_paths_locate("libnvidia-nvvm70.so.*", dirs):
            if p not in found:
                found.append(p)
        return [self._file(p) for p in found]

    def nvml_library(self) -> Path:
        """libnvidia-ml.so.1 in the driver's library directory (what the plugin dlopens by explicit path)."""
        for d in self.library_dirs():
            candidate = self.local(os.path.join(d, NVML_LIBRARY))
            if candidate.exists():
                return candidate
        raise DriverRootError(f"driver root {self.path}: no {NVML_LIBRARY} in the driver library directories "
                              f"{', '.join(self.library_dirs()) or '(none)'}")

    # --- binaries, firmware, IPC -------------------------------------------------------------------

    def binary(self, name: str) -> DriverFile | None:
        for d in BINARY_SEARCH_PATHS:
            path = f"{d}/{name}"
            local = self.local(path)
            if local.is_file() and os.access(local, os.X_OK):
                return self._file(path)
        return None

    def binaries(self) -> list[DriverFile]:
        return [f for f in (self.binary(n) for n in DRIVER_BINARIES) if f is not None]

    def firmware_search_paths(self) -> list[str]:
        custom = self.firmware_class_path
        if custom is None:
            try:
                custom = (self.path / FIRMWARE_CLASS_PATH).read_text().strip()
            except OSError:
                custom = ""
        release = self.kernel_release
        standard = [f"/lib/firmware/updates/{release}", "/lib/firmware/updates", f"/lib/firmware/{release}",
                    "/lib/firmware"]
        return ([custom] if custom else []) + standard

    def firmware(self) -> list[DriverFile]:
        out: list[str] = []
        version = self.version()
        for pattern in (f"nvidia/{version}/gsp*.bin", f"nvidia/{version}/ucodes*.bin"):
            for d in dict.fromkeys(self.firmware_search_paths()):
                for p in self._glob(d, pattern):
                    if p not in out:
                        out.append(p)
        return [self._file(p) for p in out]

    def ipc(self) -> list[DriverFile]:
        out: list[DriverFile] = []
        for socket in IPC_SOCKETS:
            for d in ("/run", "/var/run"):
                local = self.local(d + socket)
                if local.exists() and not local.is_dir():
                    out.append(self._file(d + socket))
                    break
        return out
