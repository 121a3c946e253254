"""Opaque device configuration, decoded strictly.

The configs of a claim's allocation (`status.allocation.devices.config`) that name this driver apply to
the requests they list (all requests when none): class configs first, then claim configs, the later one
replacing the earlier for the requests it covers. Unknown apiVersions, kinds or fields are an error naming
the config entry and the field, reported on that claim only. Each device family gives its kinds
(`DeviceFamily.config_schemas`: kind -> ConfigSchema, family.py); a family without kinds takes no configuration.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

OPAQUE_PARAMETERS_MAX_BYTES = 10 * 1024  # OpaqueParametersMaxLength of resource.k8s.io/v1


class ConfigError(ValueError):
    """A config this driver cannot accept; the message names the entry and field."""


@dataclass(frozen=True)
class DeviceSettings:
    """What a config asks of one device, keyed as the checkpoint stores it (the family's camelCase names, e.g.
    timeSliceInterval); empty means the device's defaults."""

    values: tuple[tuple[str, object], ...] = ()

    @classmethod
    def of(cls, **values: object) -> DeviceSettings:
        """Settings from keyword values; None values are left out (the device's default)."""
        return cls(tuple(sorted((k, v) for k, v in values.items() if v is not None)))

    @classmethod
    def from_json(cls, obj: dict) -> DeviceSettings:
        return cls.of(**obj)

    def get(self, key: str, default: object = None) -> object:
        return dict(self.values).get(key, default)

    def to_json(self) -> dict:
        return dict(self.values)


def check_fields(obj: object, where: str, known: dict[str, type | tuple]) -> dict:
    """`obj` as a dict whose keys are all in `known` with values of the types given; ConfigError otherwise."""
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: must be an object, got {type(obj).__name__}")
    for key, value in obj.items():
        if key not in known:
            raise ConfigError(f"{where}.{key}: unknown field; known fields: {', '.join(sorted(known))}")
        if not isinstance(value, known[key]) or (isinstance(value, bool) and known[key] is int):
            expected = known[key].__name__ if isinstance(known[key], type) else "object"
            raise ConfigError(f"{where}.{key}: must be {expected}, got {type(value).__name__}")
    return obj


@dataclass(frozen=True)
class ConfigSchema:
    api_version: str
    decoder: Callable[[dict, str], DeviceSettings]
    device_type: str | None  # the `type` attribute of the devices it applies to (None: every device)


class ConfigurableFamily(Protocol):
    """What decoding needs of a DeviceFamily (family.py), without importing it."""

    name: str
    config_schemas: dict[str, ConfigSchema]


@dataclass(frozen=True)
class DecodedConfig:
    kind: str
    device_type: str | None
    settings: DeviceSettings


def decode_config(family: ConfigurableFamily, params: object, where: str) -> DecodedConfig:
    """Decode one opaque config's parameters strictly; ConfigError names `where` and the field."""
    kinds = family.config_schemas
    if not kinds:
        raise ConfigError(f"{where}: the {family.name} driver takes no configuration; remove this config entry")
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


def settings_per_request(family: ConfigurableFamily, driver: str, configs: list, requests: list[str],
                         device_types: dict[str, set[str]] | None = None,
                         where_prefix: str = "status.allocation.devices.config") -> dict[str, DeviceSettings]:
    """Settings for each allocated request name, from the allocation's config list (class, then claim).

    `device_types` (request -> `type` attributes of its allocated devices) lets a config kind with a
    device_type (GPU: GpuConfig, MigDeviceConfig) be checked against the devices it would configure;
    `where_prefix` names the list in messages (the planner passes `spec.devices.config`).
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
