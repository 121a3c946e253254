"""One node's NVIDIA user space as the GPU plugin uses it: driver root, CDI hook, NVML, nvidia-smi.

Every NVIDIA file is taken from the driver root by explicit path, never from the plugin image's search
paths: libnvidia-ml.so.1 for NVML, nvidia-smi (run with LD_LIBRARY_PATH set to the driver's library
directories) for time-slicing. The CDI hook binary is the node's own nvidia-container-toolkit
`nvidia-cdi-hook`, found on the host (not in the driver root, which may be a driver container's).
When a tool cannot be used, the first failure is logged with the path tried and passed to
`on_unavailable(tool, message)` (the driver turns it into an Event and a metric); later failures of the
same tool stay quiet until it works again.
"""

from __future__ import annotations

import copy
import logging
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from . import cdi_edits, ldcache
from .driver_root import DriverRoot, DriverRootError

log = logging.getLogger(__name__)
HOOK_SEARCH_PATHS = ("/usr/bin/nvidia-cdi-hook", "/usr/local/bin/nvidia-cdi-hook",
                     "/usr/local/nvidia/toolkit/nvidia-cdi-hook")
SMI_TIMEOUT_S = 20
COMMON_EDITS_TTL_S = 60.0


class GpuToolError(RuntimeError):
    """nvidia-smi is missing or failed; the message names the path."""


class GpuHost:
    def __init__(self, host_root: Path, driver_root: DriverRoot, hook_path: str | None = None) -> None:
        self.host_root = Path(host_root)
        self.driver_root = driver_root
        self.hook_path = hook_path
        self.on_unavailable: Callable[[str, str], None] | None = None
        self._reported: set[str] = set()
        self.nvml_error = ""  # why the last NVML load failed, with the path tried
        self._edits: tuple[tuple, float, dict] | None = None  # (key, computed at, common edits)

    @classmethod
    def for_node(cls, host_root: Path, driver_root: str = "/", container_driver_root: Path | None = None,
                 hook_path: str | None = None) -> GpuHost:
        """driver_root: the host's path; container_driver_root: where this process sees it (default: through
        host_root)."""
        local = container_driver_root or Path(host_root) / driver_root.lstrip("/")
        return cls(Path(host_root), DriverRoot(local, driver_root), hook_path)

    # --- reporting ------------------------------------------------------------------------------

    def unavailable(self, tool: str, message: str) -> None:
        if tool in self._reported:
            return
        self._reported.add(tool)
        log.warning("%s unavailable: %s", tool, message)
        if self.on_unavailable is not None:
            self.on_unavailable(tool, message)

    def available(self, tool: str) -> None:
        self._reported.discard(tool)

    # --- CDI ------------------------------------------------------------------------------------

    def hook(self) -> str:
        """The host path of nvidia-cdi-hook. Raises DriverRootError naming the paths tried."""
        candidates = (self.hook_path,) if self.hook_path else HOOK_SEARCH_PATHS
        for path in candidates:
            local = self.host_root / path.lstrip("/")
            if local.is_file() and os.access(local, os.X_OK):
                return path
        raise DriverRootError(f"no executable nvidia-cdi-hook at {', '.join(candidates)} on the host (under "
                              f"{self.host_root}); install nvidia-container-toolkit or pass --nvidia-cdi-hook-path")

    def common_edits(self, control_nodes: list[str]) -> dict:
        """The spec-level edits, recomputed at most every COMMON_EDITS_TTL_S (the upstream driver caches them
        for 5 minutes) or when the control nodes, the hook or the driver root's ld cache change."""
        hook = self.hook()
        cache = self.driver_root.local("/" + str(ldcache.CACHE_PATH))
        try:
            stamp = cache.stat().st_mtime_ns
        except OSError:
            stamp = None
        key = (tuple(control_nodes), hook, stamp)
        now = time.monotonic()
        if self._edits is None or self._edits[0] != key or now - self._edits[1] > COMMON_EDITS_TTL_S:
            self._edits = (key, now, cdi_edits.common_edits(self.driver_root, hook, control_nodes))
        return copy.deepcopy(self._edits[2])

    def device_hooks(self, uuid: str) -> list[dict]:
        return cdi_edits.device_hooks(self.hook(), self.driver_root.host_path, uuid)

    # --- NVML -----------------------------------------------------------------------------------

    def nvml(self):
        """The process's NVML loaded from the driver root, or None (reported once, with the path)."""
        from .nvml import shared_nvml

        try:
            backend, why = shared_nvml(self.driver_root.nvml_library())
        except DriverRootError as exc:
            backend, why = None, str(exc)
        self.nvml_error = why
        if backend is None:
            self.unavailable("nvml", why)
        else:
            self.available("nvml")
        return backend

    # --- nvidia-smi -----------------------------------------------------------------------------

    def run_nvidia_smi(self, argv: list[str]) -> None:
        """Run `nvidia-smi argv[1:]` from the driver root. Raises GpuToolError naming the path."""
        try:
            smi = self.driver_root.binary("nvidia-smi")
            lib_dirs = [str(self.driver_root.local(d)) for d in self.driver_root.library_dirs()]
        except DriverRootError as exc:
            self._smi_failed(f"nvidia-smi cannot run: {exc}")
        if smi is None:
            tried = ", ".join(str(self.driver_root.local(f"{d}/nvidia-smi")) for d in ("/usr/bin", "/usr/sbin"))
            self._smi_failed(f"no executable nvidia-smi in driver root {self.driver_root.path} (tried {tried}, ...)")
        env = {**os.environ, "LD_LIBRARY_PATH": ":".join(lib_dirs)}
        cmd = [str(smi.local), *argv[1:]]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False, env=env)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self._smi_failed(f"{smi.local}: {exc}")
        if proc.returncode != 0:
            raise GpuToolError(f"{' '.join(cmd)}: exit {proc.returncode}: "
                               f"{(proc.stderr or proc.stdout).strip()[:300]}")
        self.available("nvidia-smi")

    def _smi_failed(self, message: str) -> NoReturn:
        self.unavailable("nvidia-smi", message)
        raise GpuToolError(message)
