"""The GPU driver's opaque configs, the upstream NVIDIA driver's (resource.nvidia.com/v1beta1):

    GpuConfig:       {sharing: {strategy: TimeSlicing, timeSlicingConfig: {interval: Default|Short|Medium|Long}}}
    MigDeviceConfig: {sharing: {strategy: TimeSlicing}}  (no effect on a MIG device)

As in the NVIDIA driver, a GpuConfig applies to full GPUs and a MigDeviceConfig to MIG devices: one that names
a request of the other kind is an error, one that names no request skips devices of the other kind. The MPS
strategy is refused until this driver implements it.
"""

from __future__ import annotations

from eks_dra.devices import names

from ..framework.configs import ConfigError, ConfigSchema, DeviceSettings, check_fields

TIME_SLICE_INTERVAL = "timeSliceInterval"  # the DeviceSettings key (and the checkpoint's)
TIME_SLICE_INTERVALS = ("Default", "Short", "Medium", "Long")
# The time-slice interval is a property of the physical GPU (nvidia-smi compute-policy), not of one container.
HARDWARE_SETTINGS = frozenset({TIME_SLICE_INTERVAL})


def _sharing(sharing: object, where: str, time_slicing_config: bool) -> str | None:
    """The TimeSlicing interval a sharing block asks for (None: no interval to set)."""
    known: dict[str, type | tuple] = {"strategy": str, "mpsConfig": dict}
    if time_slicing_config:
        known["timeSlicingConfig"] = dict
    check_fields(sharing, f"{where}.sharing", known)
    strategy = sharing.get("strategy")  # type: ignore[union-attr]
    if strategy == "MPS":
        raise ConfigError(f"{where}.sharing.strategy: MPS is not supported by this driver yet; use TimeSlicing, "
                          "or the upstream NVIDIA driver (drivers.gpu: upstream) for MPS")
    if strategy != "TimeSlicing":
        raise ConfigError(f"{where}.sharing.strategy: {strategy!r} is not one of TimeSlicing, MPS")
    if "mpsConfig" in sharing:  # type: ignore[operator]
        raise ConfigError(f"{where}.sharing.mpsConfig: cannot be used with the TimeSlicing strategy")
    if not time_slicing_config:
        return None
    ts = check_fields(sharing.get("timeSlicingConfig") or {}, f"{where}.sharing.timeSlicingConfig",  # type: ignore[union-attr]
                 {"interval": str})
    interval = ts.get("interval", "Default")
    if interval not in TIME_SLICE_INTERVALS:
        raise ConfigError(f"{where}.sharing.timeSlicingConfig.interval: {interval!r} is not one of "
                          f"{', '.join(TIME_SLICE_INTERVALS)}")
    return interval


def _gpu_config(params: dict, where: str) -> DeviceSettings:
    check_fields(params, where, {"apiVersion": str, "kind": str, "sharing": dict})
    if params.get("sharing") is None:
        return DeviceSettings()
    return DeviceSettings.of(**{TIME_SLICE_INTERVAL: _sharing(params["sharing"], where, time_slicing_config=True)})


def _mig_config(params: dict, where: str) -> DeviceSettings:
    check_fields(params, where, {"apiVersion": str, "kind": str, "sharing": dict})
    if params.get("sharing") is not None:
        _sharing(params["sharing"], where, time_slicing_config=False)  # TimeSlicing: nothing to set on MIG
    return DeviceSettings()


GPU_CONFIG_SCHEMAS = {
    names.GPU_CONFIG_KIND: ConfigSchema(names.GPU_CONFIG_API_VERSION, _gpu_config, "gpu"),
    names.MIG_CONFIG_KIND: ConfigSchema(names.GPU_CONFIG_API_VERSION, _mig_config, "mig"),
}
