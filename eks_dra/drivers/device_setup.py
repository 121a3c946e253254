"""Applying per-device settings at prepare time (and undoing them at unprepare).

GPU time-slicing is a property of the physical GPU, set with
`nvidia-smi compute-policy --set-timeslice=<0..3> -i <uuid>` run from the driver root by explicit path
(`gpu.host.GpuHost.run_nvidia_smi`). A request that cannot be applied (no usable nvidia-smi, or it fails)
is the claim's prepare error, naming the path. What was applied is returned, stored in the checkpoint and
re-applied after a reboot (the GPU forgets it). A runner of None only records the setting: a test double,
never chosen by `for_node`. Neuron's logical-core setting is the Neuron runtime's environment
(`NEURON_LOGICAL_NC_CONFIG`, `NEURON_RT_VISIBLE_CORES`), carried in the claim's CDI spec.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from eks_dra.devices import gpu as gpu_attrs
from eks_dra.devices import neuron as neuron_attrs

from .configs import DeviceSettings
from .gpu.host import GpuHost, GpuToolError

log = logging.getLogger(__name__)
TIME_SLICE_CODES = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}  # nvidia-smi compute-policy values
# Trainium2 runs two physical NeuronCores as one logical core by default; earlier chips have no LNC=2.
LNC2_INSTANCE_PREFIXES = ("trn2", "trn3")

Runner = Callable[[list[str]], None]


class SetupError(RuntimeError):
    pass


class DeviceSetup:
    """Applies settings for one driver family. `runner` None: record only (tests)."""

    def __init__(self, family: str, runner: Runner | None = None) -> None:
        self.family = family
        self.runner = runner

    @classmethod
    def for_node(cls, family: str, gpu_host: GpuHost | None = None) -> DeviceSetup:
        """The node's setup: GPU settings through the driver root's nvidia-smi (gpu_host, default `/`)."""
        if family != "gpu":
            return cls(family)
        return cls(family, (gpu_host or GpuHost.for_node(Path("/"))).run_nvidia_smi)

    def changes_hardware(self, settings) -> bool:
        """Whether apply() would change device state that must be reverted (not just recorded)."""
        return self.runner is not None and any(s.time_slice_interval is not None for s in settings)

    @property
    def mode(self) -> str:
        return "nvidia-smi" if self.runner else "recorded"

    def apply(self, devices: list[tuple[object, DeviceSettings]]) -> tuple[dict[str, str], dict]:
        """Apply settings to (published Device, settings) pairs; returns (claim env, applied settings)."""
        if self.family == "gpu":
            return {}, self._apply_gpu(devices)
        if self.family == "neuron":
            return self._neuron_env(devices)
        return {}, {}

    def revert(self, applied: dict) -> None:
        """Undo what apply() did for a claim that is being unprepared."""
        if self.family != "gpu" or not self.runner:
            return
        for entry in applied.get("devices", {}).values():
            if entry.get("timeSliceInterval", "Default") != "Default" and entry.get("uuid"):
                self._set_timeslice(entry["uuid"], "Default")

    def _set_timeslice(self, uuid: str, interval: str) -> None:
        assert self.runner is not None
        try:
            self.runner(["nvidia-smi", "compute-policy", f"--set-timeslice={TIME_SLICE_CODES[interval]}", "-i",
                         uuid])
        except GpuToolError as exc:
            raise SetupError(f"timeSliceInterval {interval} for GPU {uuid} not applied: {exc}") from None

    def _apply_gpu(self, devices: list[tuple[object, DeviceSettings]]) -> dict:
        out: dict = {}
        for device, settings in devices:
            if settings.time_slice_interval is None:
                continue
            # MIG devices share their parent's scheduler: the policy goes on the parent GPU.
            uuid = device.attributes.get(gpu_attrs.PARENT_UUID) or device.attributes.get(gpu_attrs.UUID)
            if self.runner:
                self._set_timeslice(str(uuid), settings.time_slice_interval)
            out[device.name] = {"timeSliceInterval": settings.time_slice_interval, "uuid": uuid}
        return {"mode": self.mode, "devices": out} if out else {}

    def _neuron_env(self, devices: list[tuple[object, DeviceSettings]]) -> tuple[dict[str, str], dict]:
        lncs = {s.logical_neuron_core for _, s in devices if s.logical_neuron_core is not None}
        if len(lncs) > 1:
            raise SetupError("devices of one claim ask for different logicalNeuronCore values; one container "
                             "runtime can use only one")
        instance = str(devices[0][0].attributes.get(neuron_attrs.INSTANCE_TYPE, ""))
        default_lnc = 2 if instance.startswith(LNC2_INSTANCE_PREFIXES) else 1
        lnc = lncs.pop() if lncs else default_lnc
        if lnc == 2 and not instance.startswith(LNC2_INSTANCE_PREFIXES):
            raise SetupError(f"logicalNeuronCore 2 needs Trainium2 or later; this node is {instance or 'unknown'}")
        cores: list[int] = []
        for device, _ in sorted(devices, key=lambda ds: int(ds[0].attributes[neuron_attrs.DEVICE_ID])):
            per_device = int(device.attributes[neuron_attrs.CORE_COUNT]) // lnc
            first = int(device.attributes[neuron_attrs.DEVICE_ID]) * per_device
            cores.extend(range(first, first + per_device))
        env = {"NEURON_LOGICAL_NC_CONFIG": str(lnc), "NEURON_RT_VISIBLE_CORES": _ranges(cores)}
        return env, {"mode": "environment", "logicalNeuronCore": lnc, "visibleCores": env["NEURON_RT_VISIBLE_CORES"]}


def _ranges(values: list[int]) -> str:
    """[0,1,2,3,8,9] -> "0-3,8-9" (the Neuron runtime's format)."""
    parts, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            parts.append(f"{start}-{v}" if v != start else str(v))
            start = None
    return ",".join(parts)
