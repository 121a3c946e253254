"""One device model for the drivers' discovery and the planner (see DESIGN.md).

The names below are loaded from their submodules on first use (PEP 562), so that `from eks_dra.devices import
names` (a driver's start-up, before its sockets serve) does not pay for the catalog and the simulation.
"""

from __future__ import annotations

import importlib

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

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
