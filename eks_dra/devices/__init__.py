"""One device model for the drivers' discovery and the planner (see DESIGN.md).

The names below are loaded from their submodules on first use (PEP 562), so that `from eks_dra.devices import
names` (a driver's start-up, before its sockets serve) does not pay for the catalog and the simulation.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "MAX_DEVICES_PER_SLICE": "model",
    "PCIE_ROOT": "model",
    "AttributeValue": "model",
    "Device": "model",
    "Version": "model",
    "resource_slices": "model",
    "DEFAULT_DRIVER_NAMES": "names",
    "FAMILIES": "names",
    "DriverNames": "names",
    "Family": "names",
    "NodeFacts": "simulate",
    "devices_from_facts": "simulate",
    "node_facts": "simulate",
    "simulate_node": "simulate",
}

__all__ = [
    "AttributeValue",
    "DEFAULT_DRIVER_NAMES",
    "Device",
    "DriverNames",
    "FAMILIES",
    "Family",
    "MAX_DEVICES_PER_SLICE",
    "NodeFacts",
    "PCIE_ROOT",
    "Version",
    "devices_from_facts",
    "node_facts",
    "resource_slices",
    "simulate_node",
]
assert sorted(__all__) == sorted(_EXPORTS)

if TYPE_CHECKING:
    from .model import MAX_DEVICES_PER_SLICE, PCIE_ROOT, AttributeValue, Device, Version, resource_slices
    from .names import DEFAULT_DRIVER_NAMES, FAMILIES, DriverNames, Family
    from .simulate import NodeFacts, devices_from_facts, node_facts, simulate_node


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
