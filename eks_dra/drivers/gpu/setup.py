"""GPU settings at prepare time: time-slicing, a property of the physical GPU, set with
`nvidia-smi compute-policy --set-timeslice=<0..3> -i <uuid>` run from the driver root by explicit path
(`host.GpuHost.run_nvidia_smi`). A request that cannot be applied (no usable nvidia-smi, or it fails) is the
claim's prepare error, naming the path. A runner of None only records the setting: a test double, never
chosen by `for_node`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

from eks_dra.devices import gpu as gpu_attrs

from ..framework.configs import DeviceSettings
from ..framework.device_setup import DeviceSetup, SetupError
from .configs import TIME_SLICE_INTERVAL
from .host import GpuHost, GpuToolError

log = logging.getLogger(__name__)
TIME_SLICE_CODES = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}  # nvidia-smi compute-policy values

Runner = Callable[[list[str]], None]


class GpuSetup(DeviceSetup):
    """Applies GPU settings through `runner` (an nvidia-smi argv runner). `runner` None: record only (tests)."""

    def __init__(self, runner: Runner | None = None) -> None:
        self.runner = runner

    @classmethod
    def for_node(cls, gpu_host: GpuHost | None = None) -> GpuSetup:
        """The node's setup: GPU settings through the driver root's nvidia-smi (gpu_host, default `/`)."""
        return cls((gpu_host or GpuHost.for_node(Path("/"))).run_nvidia_smi)

    def changes_hardware(self, settings: Iterable[DeviceSettings]) -> bool:
        return self.runner is not None and any(s.get(TIME_SLICE_INTERVAL) is not None for s in settings)

    @property
    def mode(self) -> str:  # type: ignore[override]
        return "nvidia-smi" if self.runner else "recorded"

    def apply(self, devices: list[tuple[object, DeviceSettings]]) -> tuple[dict[str, str], dict]:
        out: dict = {}
        for device, settings in devices:
            interval = settings.get(TIME_SLICE_INTERVAL)
            if interval is None:
                continue
            # MIG devices share their parent's scheduler: the policy goes on the parent GPU.
            uuid = device.attributes.get(gpu_attrs.PARENT_UUID) or device.attributes.get(gpu_attrs.UUID)
            if self.runner:
                self._set_timeslice(str(uuid), str(interval))
            out[device.name] = {"timeSliceInterval": interval, "uuid": uuid}
        return {}, ({"mode": self.mode, "devices": out} if out else {})

    def revert(self, applied: dict, keep: Collection[str] = frozenset()) -> dict[str, dict]:
        """Back to the Default interval, as the NVIDIA driver's unprepare does (cmd/gpu-kubelet-plugin/
        device_state.go, unprepareDevices), on every device not in `keep`."""
        kept = {}
        for name, entry in applied.get("devices", {}).items():
            if name in keep:
                kept[name] = {"mode": applied.get("mode", self.mode), "devices": {name: entry}}
            elif self.runner and entry.get("timeSliceInterval", "Default") != "Default" and entry.get("uuid"):
                self._set_timeslice(entry["uuid"], "Default")
        return kept

    def _set_timeslice(self, uuid: str, interval: str) -> None:
        assert self.runner is not None
        try:
            self.runner(["nvidia-smi", "compute-policy", f"--set-timeslice={TIME_SLICE_CODES[interval]}", "-i",
                         uuid])
        except GpuToolError as exc:
            raise SetupError(f"timeSliceInterval {interval} for GPU {uuid} not applied: {exc}") from None
