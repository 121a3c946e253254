"""NVML behind a small interface: what GPU discovery and GPU health need, as plain records.

The real backend (`Nvml`) wraps `pynvml` (the nvidia-ml-py package) and loads libnvidia-ml.so.1 from the
host's driver root by explicit path (the plugin image has no NVIDIA library on its search path). Tests inject any object with the same methods (`NvmlBackend`); the fake lives in tests only.
pynvml is imported lazily so that a node or a test machine without it still imports this module.
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

# NVML architecture enum -> the names the catalog and the NVIDIA DRA driver publish.
ARCHITECTURES = {
    2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere",
    8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell", 13: "Rubin",
}
NO_GPU_INSTANCE = 0xFFFFFFFF  # nvmlEventData_t.gpuInstanceId of an event not tied to one MIG instance


class NvmlUnavailable(RuntimeError):
    """libnvidia-ml or pynvml is missing, or nvmlInit failed (driver not loaded)."""


@dataclass(frozen=True)
class NvmlMig:
    uuid: str
    profile: str  # "1g.10gb"
    gpu_instance_id: int
    compute_instance_id: int
    placement_start: int  # first memory slice of the GPU instance: orders instances on their GPU
    memory_mib: int
    multiprocessors: int


@dataclass(frozen=True)
class NvmlGpu:
    minor: int
    uuid: str
    name: str
    architecture: str
    cuda_compute_capability: str  # "9.0"
    pci_address: str  # "0000:53:00.0" (4-digit domain, lower case, like sysfs)
    pci_device_id: int
    memory_mib: int
    multiprocessors: int | None  # NVML reports it for MIG-capable GPUs only; None: use the catalog
    mig_enabled: bool
    migs: tuple[NvmlMig, ...] = ()


@dataclass(frozen=True)
class NvmlEvent:
    """One XID or double-bit ECC event. gpu_instance_id is None unless NVML tied it to one MIG instance."""

    uuid: str
    xid: int  # 0 for an ECC event without XID
    kind: str  # "xid" | "ecc"
    gpu_instance_id: int | None = None


@dataclass(frozen=True)
class NvmlHealth:
    """Level signals of one GPU; None where the GPU does not support the query."""

    uncorrected_ecc_volatile: int | None = None
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    error: str = ""  # non-empty when NVML cannot reach the GPU (e.g. "GPU is lost")


class NvmlBackend(Protocol):
    def driver_version(self) -> str: ...
    def gpus(self) -> list[NvmlGpu]: ...
    def poll_events(self) -> list[NvmlEvent]: ...
    def health(self, uuid: str) -> NvmlHealth: ...


def normalize_bus_id(bus_id: str) -> str:
    """NVML's "00000000:53:00.0" -> sysfs's "0000:53:00.0"."""
    domain, rest = bus_id.strip().lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Nvml:
    """The real NVML through pynvml. Call `open()`; one instance per process is enough (see `shared_nvml`)."""

    def __init__(self, library: Path | None = None) -> None:
        """library: libnvidia-ml.so.1 by explicit path (the driver root's), else the loader's search path."""
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailable("the nvidia-ml-py package (pynvml) is not installed") from exc
        self._n = pynvml
        where = str(library) if library is not None else "libnvidia-ml.so.1 (loader search path)"
        if library is not None and pynvml.nvmlLib is None:
            # pynvml dlopens "libnvidia-ml.so.1" by name unless its module-level handle is already set.
            try:
                pynvml.nvmlLib = ctypes.CDLL(str(library))
            except OSError as exc:
                raise NvmlUnavailable(f"cannot load {library}: {exc}") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"nvmlInit failed ({where}): {exc} (is the NVIDIA kernel driver loaded?)") \
                from exc
        self._lock = threading.Lock()
        self._event_set = None
        self._handles: dict[str, object] = {}

    def close(self) -> None:
        self._n.nvmlShutdown()

    def driver_version(self) -> str:
        return _text(self._n.nvmlSystemGetDriverVersion())

    def _handle(self, uuid: str):
        if uuid not in self._handles:
            self._handles[uuid] = self._n.nvmlDeviceGetHandleByUUID(uuid)
        return self._handles[uuid]

    def gpus(self) -> list[NvmlGpu]:
        n = self._n
        out = []
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(n.nvmlDeviceGetUUID(h))
            self._handles[uuid] = h
            pci = n.nvmlDeviceGetPciInfo(h)
            major, minor_cc = n.nvmlDeviceGetCudaComputeCapability(h)
            mig_enabled = False
            try:
                mig_enabled = n.nvmlDeviceGetMigMode(h)[0] == n.NVML_DEVICE_MIG_ENABLE
            except n.NVMLError:  # not MIG-capable
                pass
            profiles = self._gi_profiles(h)
            out.append(NvmlGpu(
                minor=n.nvmlDeviceGetMinorNumber(h),
                uuid=uuid,
                name=_text(n.nvmlDeviceGetName(h)),
                architecture=ARCHITECTURES.get(n.nvmlDeviceGetArchitecture(h), "unknown"),
                cuda_compute_capability=f"{major}.{minor_cc}",
                pci_address=normalize_bus_id(_text(pci.busId)),
                pci_device_id=pci.pciDeviceId >> 16,
                memory_mib=n.nvmlDeviceGetMemoryInfo(h).total // (1 << 20),
                # The full-GPU profile's SM count is the GPU's (NVML has no SM count for a whole GPU).
                multiprocessors=max((p[1] for p in profiles.values()), default=None),
                mig_enabled=mig_enabled,
                migs=tuple(self._migs(h, profiles)) if mig_enabled else (),
            ))
        return out

    def _gi_profiles(self, h) -> dict[tuple[int, int], tuple[str, int]]:
        """(slice count, memory MiB) -> (profile name, multiprocessors) for every GPU-instance profile."""
        n = self._n
        out: dict[tuple[int, int], tuple[str, int]] = {}
        for p in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = n.nvmlDeviceGetGpuInstanceProfileInfo(h, p)
            except n.NVMLError:
                continue
            name = _text(info.name).removeprefix("MIG ").strip()
            key = (info.sliceCount, info.memorySizeMB)
            # Media-extension variants ("1g.10gb+me") share slices and memory; the plain profile wins.
            if key not in out or "+" in out[key][0]:
                out[key] = (name, info.multiprocessorCount)
        return out

    def _migs(self, h, profiles: dict[tuple[int, int], tuple[str, int]]) -> list[NvmlMig]:
        n = self._n
        out = []
        for i in range(n.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except n.NVMLError:  # holes in the index space are normal
                continue
            attrs = n.nvmlDeviceGetAttributes(m)
            gi = n.nvmlDeviceGetGpuInstanceId(m)
            name = profiles.get((attrs.gpuInstanceSliceCount, attrs.memorySizeMB), (None, 0))[0]
            if name is None:
                name = f"{attrs.gpuInstanceSliceCount}g.{round(attrs.memorySizeMB / 1024)}gb"
            try:
                start = n.nvmlGpuInstanceGetInfo(n.nvmlDeviceGetGpuInstanceById(h, gi)).placement.start
            except n.NVMLError:  # needs privileges on some drivers; the GI id orders instances as well
                start = gi
            out.append(NvmlMig(
                uuid=_text(n.nvmlDeviceGetUUID(m)),
                profile=name,
                gpu_instance_id=gi,
                compute_instance_id=n.nvmlDeviceGetComputeInstanceId(m),
                placement_start=start,
                memory_mib=attrs.memorySizeMB,
                multiprocessors=attrs.multiprocessorCount,
            ))
        return out

    def poll_events(self) -> list[NvmlEvent]:
        """Drain pending XID / double-bit ECC events without blocking."""
        n = self._n
        with self._lock:
            if self._event_set is None:
                self._event_set = n.nvmlEventSetCreate()
                wanted = n.nvmlEventTypeXidCriticalError | n.nvmlEventTypeDoubleBitEccError
                for i in range(n.nvmlDeviceGetCount()):
                    h = n.nvmlDeviceGetHandleByIndex(i)
                    try:
                        supported = n.nvmlDeviceGetSupportedEventTypes(h) & wanted
                        if supported:
                            n.nvmlDeviceRegisterEvents(h, supported, self._event_set)
                    except n.NVMLError:
                        continue
            events = []
            while True:
                try:
                    data = n.nvmlEventSetWait_v2(self._event_set, 0)
                except n.NVMLError_Timeout:
                    return events
                gi = data.gpuInstanceId if data.gpuInstanceId != NO_GPU_INSTANCE else None
                kind = "xid" if data.eventType & n.nvmlEventTypeXidCriticalError else "ecc"
                events.append(NvmlEvent(_text(n.nvmlDeviceGetUUID(data.device)), int(data.eventData), kind, gi))

    def health(self, uuid: str) -> NvmlHealth:
        n = self._n
        try:
            h = self._handle(uuid)
            ecc = None
            try:
                ecc = n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)
            except n.NVMLError_NotSupported:
                pass
            pending = failure = None
            try:
                _, _, pending_i, failure_i = n.nvmlDeviceGetRemappedRows(h)
                pending, failure = bool(pending_i), bool(failure_i)
            except n.NVMLError_NotSupported:
                pass
            return NvmlHealth(ecc, pending, failure)
        except n.NVMLError as exc:  # GPU lost, reset in progress, ...
            self._handles.pop(uuid, None)
            return NvmlHealth(error=str(exc))


RETRY_AFTER_S = 10.0  # a plugin may start before the driver: try nvmlInit again, but not on every call

_shared: Nvml | None = None
_shared_error = ""
_shared_failed_at = 0.0
_shared_failed_for: Path | None = None  # the library the last failure was for: another one is tried at once
_shared_lock = threading.Lock()


def shared_nvml(library: Path | None = None) -> tuple[Nvml | None, str]:
    """The process's NVML (initialised once, from `library` when given), or (None, why not)."""
    global _shared, _shared_error, _shared_failed_at, _shared_failed_for
    with _shared_lock:
        retry = (not _shared_error or library != _shared_failed_for
                 or time.monotonic() - _shared_failed_at >= RETRY_AFTER_S)
        if _shared is None and retry:
            try:
                _shared = Nvml(library)
                _shared_error = ""
            except NvmlUnavailable as exc:
                _shared_error, _shared_failed_at, _shared_failed_for = str(exc), time.monotonic(), library
        return _shared, _shared_error
