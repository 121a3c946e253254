"""Opaque device configuration, decoded strictly.

The configs of a claim's allocation (`status.allocation.devices.config`) that name this driver apply to
the requests they list (all requests when none): class configs first, then claim configs, the later one
replacing the earlier for the requests it covers. Unknown apiVersions, kinds or fields are an error naming
the config entry and the field, reported on that claim only.

    resource.nvidia.com/v1beta1 GpuConfig:       {sharing: {strategy: TimeSlicing, timeSlicingConfig: {interval: Default|Short|Medium|Long}}}
    resource.nvidia.com/v1beta1 MigDeviceConfig: {sharing: {strategy: TimeSlicing}}  (no effect on a MIG device)
    neuron.aws.com/v1 NeuronConfig:              {logicalNeuronCore: 1|2}
    efa: no configuration

As in the NVIDIA driver, a GpuConfig applies to full GPUs and a MigDeviceConfig to MIG devices: one that names
a request of the other kind is an error, one that names no request skips devices of the other kind. The MPS
strategy is refused until this driver implements it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from eks_dra.devices import names

OPAQUE_PARAMETERS_MAX_BYTES = 10 * 1024  # OpaqueParametersMaxLength of resource.k8s.io/v1
TIME_SLICE_INTERVALS = ("Default", "Short", "Medium", "Long")


class ConfigError(ValueError):
    """A config this driver cannot accept; the message names the entry and field."""


@dataclass(frozen=True)
class DeviceSettings:
    """What a config asks of one device; empty means the device's defaults."""

    time_slice_interval: str | None = None  # GPU TimeSlicing
    logical_neuron_core: int | None = None  # Neuron LNC

    def to_json(self) -> dict:
        return {k: v for k, v in (("timeSliceInterval", self.time_slice_interval),
                                  ("logicalNeuronCore", self.logical_neuron_core)) if v is not None}


def _fields(obj: object, where: str, known: dict[str, type | tuple]) -> dict:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: must be an object, got {type(obj).__name__}")
    for key, value in obj.items():
        if key not in known:
            raise ConfigError(f"{where}.{key}: unknown field; known fields: {', '.join(sorted(known))}")
        if not isinstance(value, known[key]) or (isinstance(value, bool) and known[key] is int):
            expected = known[key].__name__ if isinstance(known[key], type) else "object"
            raise ConfigError(f"{where}.{key}: must be {expected}, got {type(value).__name__}")
    return obj


def _sharing(sharing: object, where: str, time_slicing_config: bool) -> str | None:
    """The TimeSlicing interval a sharing block asks for (None: no interval to set)."""
    known: dict[str, type | tuple] = {"strategy": str, "mpsConfig": dict}
    if time_slicing_config:
        known["timeSlicingConfig"] = dict
    _fields(sharing, f"{where}.sharing", known)
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
    ts = _fields(sharing.get("timeSlicingConfig") or {}, f"{where}.sharing.timeSlicingConfig",  # type: ignore[union-attr]
                 {"interval": str})
    interval = ts.get("interval", "Default")
    if interval not in TIME_SLICE_INTERVALS:
        raise ConfigError(f"{where}.sharing.timeSlicingConfig.interval: {interval!r} is not one of "
                          f"{', '.join(TIME_SLICE_INTERVALS)}")
    return interval


def _gpu_config(params: dict, where: str) -> DeviceSettings:
    _fields(params, where, {"apiVersion": str, "kind": str, "sharing": dict})
    if params.get("sharing") is None:
        return DeviceSettings()
    return DeviceSettings(time_slice_interval=_sharing(params["sharing"], where, time_slicing_config=True))


def _mig_config(params: dict, where: str) -> DeviceSettings:
    _fields(params, where, {"apiVersion": str, "kind": str, "sharing": dict})
    if params.get("sharing") is not None:
        _sharing(params["sharing"], where, time_slicing_config=False)  # TimeSlicing: nothing to set on MIG
    return DeviceSettings()


def _neuron_config(params: dict, where: str) -> DeviceSettings:
    _fields(params, where, {"apiVersion": str, "kind": str, "logicalNeuronCore": int})
    lnc = params.get("logicalNeuronCore")
    if lnc is not None and lnc not in (1, 2):
        raise ConfigError(f"{where}.logicalNeuronCore: {lnc} is not 1 or 2")
    return DeviceSettings(logical_neuron_core=lnc)


@dataclass(frozen=True)
class _Schema:
    api_version: str
    decoder: Callable[[dict, str], DeviceSettings]
    device_type: str | None  # the `type` attribute of the devices it applies to (None: every device)


# family -> kind -> schema
_SCHEMAS: dict[str, dict[str, _Schema]] = {
    "gpu": {names.GPU_CONFIG_KIND: _Schema(names.GPU_CONFIG_API_VERSION, _gpu_config, "gpu"),
            names.MIG_CONFIG_KIND: _Schema(names.GPU_CONFIG_API_VERSION, _mig_config, "mig")},
    "neuron": {names.NEURON_CONFIG_KIND: _Schema(names.NEURON_CONFIG_API_VERSION, _neuron_config, None)},
}


@dataclass(frozen=True)
class DecodedConfig:
    kind: str
    device_type: str | None
    settings: DeviceSettings


def decode_config(family: str, params: object, where: str) -> DecodedConfig:
    """Decode one opaque config's parameters strictly; ConfigError names `where` and the field."""
    if family not in _SCHEMAS:
        raise ConfigError(f"{where}: the {family} driver takes no configuration; remove this config entry")
    kinds = _SCHEMAS[family]
    api_version = next(iter(kinds.values())).api_version
    kind_names = " or ".join(kinds)
    if not isinstance(params, dict):
        raise ConfigError(f"{where}: must be an object with apiVersion {api_version} and kind {kind_names}")
    size = len(json.dumps(params, separators=(",", ":")))
    if size > OPAQUE_PARAMETERS_MAX_BYTES:
        raise ConfigError(f"{where}: {size} bytes, more than the {OPAQUE_PARAMETERS_MAX_BYTES} allowed")
    if params.get("apiVersion") != api_version:
        raise ConfigError(f"{where}.apiVersion: {params.get('apiVersion')!r} is not {api_version!r}")
    schema = kinds.get(params.get("kind"))  # type: ignore[arg-type]
    if schema is None:
        raise ConfigError(f"{where}.kind: {params.get('kind')!r} is not {kind_names}")
    return DecodedConfig(str(params["kind"]), schema.device_type, schema.decoder(params, where))


def request_matches(config_requests: list[str], request: str) -> bool:
    """A config for request `r` also covers its subrequests `r/s` (prioritized lists)."""
    if not config_requests:
        return True
    return request in config_requests or request.split("/", 1)[0] in config_requests


def settings_per_request(family: str, driver: str, configs: list, requests: list[str],
                         device_types: dict[str, set[str]] | None = None,
                         where_prefix: str = "status.allocation.devices.config") -> dict[str, DeviceSettings]:
    """Settings for each allocated request name, from the allocation's config list (class, then claim).

    `device_types` (request -> `type` attributes of its allocated devices) lets a GpuConfig or MigDeviceConfig
    be checked against the devices it would configure; `where_prefix` names the list in messages (the planner
    passes `spec.devices.config`).
    """
    if not isinstance(configs, list):
        raise ConfigError(f"{where_prefix}: must be a list")
    ordered = sorted(enumerate(configs), key=lambda ic: 0 if isinstance(ic[1], dict)
                     and ic[1].get("source") == "FromClass" else 1)
    out = {r: DeviceSettings() for r in requests}
    for index, entry in ordered:
        where = f"{where_prefix}[{index}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: must be an object")
        opaque = entry.get("opaque")
        if not isinstance(opaque, dict) or opaque.get("driver") != driver:
            continue  # another driver's config, or a non-opaque kind this driver does not interpret
        config_requests = entry.get("requests") or []
        if not isinstance(config_requests, list) or not all(isinstance(r, str) for r in config_requests):
            raise ConfigError(f"{where}.requests: must be a list of request names")
        decoded = decode_config(family, opaque.get("parameters"), f"{where}.opaque.parameters")
        for r in requests:
            if not request_matches(config_requests, r):
                continue
            types = (device_types or {}).get(r, set())
            other = sorted(t for t in types if decoded.device_type is not None and t != decoded.device_type)
            if other and config_requests:
                raise ConfigError(f"{where}: cannot apply {decoded.kind} to the {other[0]} devices of request {r} "
                                  f"(a {decoded.kind} configures {decoded.device_type} devices)")
            if not other:
                out[r] = decoded.settings
    return out
