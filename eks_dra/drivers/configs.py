"""Opaque device configuration, decoded strictly.

The configs of a claim's allocation (`status.allocation.devices.config`) that name this driver apply to
the requests they list (all requests when none): class configs first, then claim configs, the later one
replacing the earlier for the requests it covers. Unknown apiVersions, kinds or fields are an error naming
the config entry and the field, reported on that claim only.

    resource.nvidia.com/v1beta1 GpuConfig: {sharing: {strategy: TimeSlicing, timeSlicingConfig: {interval: Default|Short|Medium|Long}}}
    neuron.aws.com/v1 NeuronConfig:        {logicalNeuronCore: 1|2}
    efa: no configuration
"""

from __future__ import annotations

import json
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


def _gpu_config(params: dict, where: str) -> DeviceSettings:
    _fields(params, where, {"apiVersion": str, "kind": str, "sharing": dict})
    sharing = params.get("sharing")
    if sharing is None:
        return DeviceSettings()
    _fields(sharing, f"{where}.sharing", {"strategy": str, "timeSlicingConfig": dict})
    strategy = sharing.get("strategy")
    if strategy != "TimeSlicing":
        raise ConfigError(f"{where}.sharing.strategy: {strategy!r} is not supported; use TimeSlicing")
    ts = _fields(sharing.get("timeSlicingConfig") or {}, f"{where}.sharing.timeSlicingConfig", {"interval": str})
    interval = ts.get("interval", "Default")
    if interval not in TIME_SLICE_INTERVALS:
        raise ConfigError(f"{where}.sharing.timeSlicingConfig.interval: {interval!r} is not one of "
                          f"{', '.join(TIME_SLICE_INTERVALS)}")
    return DeviceSettings(time_slice_interval=interval)


def _neuron_config(params: dict, where: str) -> DeviceSettings:
    _fields(params, where, {"apiVersion": str, "kind": str, "logicalNeuronCore": int})
    lnc = params.get("logicalNeuronCore")
    if lnc is not None and lnc not in (1, 2):
        raise ConfigError(f"{where}.logicalNeuronCore: {lnc} is not 1 or 2")
    return DeviceSettings(logical_neuron_core=lnc)


# family -> (apiVersion, kind, decoder)
_SCHEMAS = {
    "gpu": (names.GPU_CONFIG_API_VERSION, names.GPU_CONFIG_KIND, _gpu_config),
    "neuron": (names.NEURON_CONFIG_API_VERSION, names.NEURON_CONFIG_KIND, _neuron_config),
}


def decode_parameters(family: str, params: object, where: str) -> DeviceSettings:
    if family not in _SCHEMAS:
        raise ConfigError(f"{where}: the {family} driver takes no configuration; remove this config entry")
    api_version, kind, decoder = _SCHEMAS[family]
    if not isinstance(params, dict):
        raise ConfigError(f"{where}: must be an object with apiVersion {api_version} and kind {kind}")
    size = len(json.dumps(params, separators=(",", ":")))
    if size > OPAQUE_PARAMETERS_MAX_BYTES:
        raise ConfigError(f"{where}: {size} bytes, more than the {OPAQUE_PARAMETERS_MAX_BYTES} allowed")
    if params.get("apiVersion") != api_version:
        raise ConfigError(f"{where}.apiVersion: {params.get('apiVersion')!r} is not {api_version!r}")
    if params.get("kind") != kind:
        raise ConfigError(f"{where}.kind: {params.get('kind')!r} is not {kind!r}")
    return decoder(params, where)


def request_matches(config_requests: list[str], request: str) -> bool:
    """A config for request `r` also covers its subrequests `r/s` (prioritized lists)."""
    if not config_requests:
        return True
    return request in config_requests or request.split("/", 1)[0] in config_requests


def settings_per_request(family: str, driver: str, configs: list, requests: list[str]) -> dict[str, DeviceSettings]:
    """Settings for each allocated request name, from the allocation's config list (class, then claim)."""
    if not isinstance(configs, list):
        raise ConfigError("status.allocation.devices.config: must be a list")
    ordered = sorted(enumerate(configs), key=lambda ic: 0 if isinstance(ic[1], dict)
                     and ic[1].get("source") == "FromClass" else 1)
    out = {r: DeviceSettings() for r in requests}
    for index, entry in ordered:
        where = f"status.allocation.devices.config[{index}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: must be an object")
        opaque = entry.get("opaque")
        if not isinstance(opaque, dict) or opaque.get("driver") != driver:
            continue  # another driver's config, or a non-opaque kind this driver does not interpret
        config_requests = entry.get("requests") or []
        if not isinstance(config_requests, list) or not all(isinstance(r, str) for r in config_requests):
            raise ConfigError(f"{where}.requests: must be a list of request names")
        settings = decode_parameters(family, opaque.get("parameters"), f"{where}.opaque.parameters")
        for r in requests:
            if request_matches(config_requests, r):
                out[r] = settings
    return out
