"""A CEL environment for DRA device selectors, over the `common-expression-language` package.

Declares the `device` variable of resource.k8s.io/v1 selectors (driver, attributes, capacity) from an
`eks_dra.devices.Device`. Kubernetes semantics the library lacks are emulated: an attribute domain the
device does not have is an empty map (only a missing attribute name is an error); versions are strings.
"""

from __future__ import annotations

import re

import cel

from eks_dra.devices import Device, Version
from eks_dra.devices.model import qualify

_DOMAIN = re.compile(r"""device\.(attributes|capacity)\[\s*['"]([^'"]+)['"]\s*\]""")


def device_variable(driver: str, device: Device, domains: set[str]) -> dict:
    attributes: dict[str, dict] = {d: {} for d in domains}
    for key, value in device.attributes.items():
        domain, ident = qualify(driver, key)
        attributes.setdefault(domain, {})[ident] = value.value if isinstance(value, Version) else value
    capacity: dict[str, dict] = {d: {} for d in domains}
    for key, value in device.capacity.items():
        domain, ident = qualify(driver, key)
        capacity.setdefault(domain, {})[ident] = value
    return {"driver": driver, "attributes": attributes, "capacity": capacity}


class Selector:
    """One compiled CEL selector; `matches` raises when evaluation fails, as the allocator would."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.program = cel.compile(expression)  # raises ValueError on a syntax error
        self.domains = {m.group(2) for m in _DOMAIN.finditer(expression)}

    def matches(self, driver: str, device: Device) -> bool:
        result = self.program.execute({"device": device_variable(driver, device, self.domains)})
        if not isinstance(result, bool):
            raise TypeError(f"{self.expression!r} returned {result!r}, not a bool")
        return result
