"""Neuron settings at prepare time: the logical-core setting is the Neuron runtime's environment
(`NEURON_LOGICAL_NC_CONFIG`, `NEURON_RT_VISIBLE_CORES`), carried in the claim's CDI spec.

Nothing here changes the device: each container's runtime reads its own environment, so a NeuronConfig never
touches another claim holding the same device (NeuronFamily.hardware_settings stays empty, and an adminAccess
claim may carry one). Nothing is reverted at unprepare."""

from __future__ import annotations

from eks_dra.devices import neuron as neuron_attrs

from ..framework.configs import DeviceSettings
from ..framework.device_setup import DeviceSetup, SetupError
from .configs import LOGICAL_NEURON_CORE


class NeuronSetup(DeviceSetup):
    mode = "environment"

    def apply(self, devices: list[tuple[object, DeviceSettings]]) -> tuple[dict[str, str], dict]:
        lncs = {s.get(LOGICAL_NEURON_CORE) for _, s in devices if s.get(LOGICAL_NEURON_CORE) is not None}
        if len(lncs) > 1:
            raise SetupError("devices of one claim ask for different logicalNeuronCore values; one container "
                             "runtime can use only one")
        instance = str(devices[0][0].attributes.get(neuron_attrs.INSTANCE_TYPE, ""))
        default_lnc = neuron_attrs.default_logical_core_size(instance)
        lnc = lncs.pop() if lncs else default_lnc
        if lnc == 2 and not instance.startswith(neuron_attrs.LNC2_INSTANCE_PREFIXES):
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
