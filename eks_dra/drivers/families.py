"""The device families this package drives, by name: the one place that names the family packages.

`get_family("gpu")` is the GpuFamily of eks_dra.drivers.gpu (imported on first use, so a process imports only
its own family). `discover` and `health_monitor` are shorthands for tools and tests.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from eks_dra.devices import FAMILIES

from .framework.family import DeviceFamily, HealthMonitor
from .framework.inventory import Inventory

FAMILY_PACKAGES = {"gpu": "eks_dra.drivers.gpu", "efa": "eks_dra.drivers.efa", "neuron": "eks_dra.drivers.neuron"}
assert set(FAMILY_PACKAGES) == set(FAMILIES), "every device family of eks_dra.devices has a driver package"


def get_family(name: str) -> DeviceFamily:
    if name not in FAMILY_PACKAGES:
        raise ValueError(f"unknown device family {name!r}; expected one of {', '.join(FAMILY_PACKAGES)}")
    return importlib.import_module(f"{FAMILY_PACKAGES[name]}.family").FAMILY


def discover(family: str, host_root: Path, node_name: str = "", **options) -> Inventory:
    """One family's devices in a host tree (DeviceFamily.discover); options that are None are left out.
    node_name is accepted for symmetry with the planner: devices carry what the host reports."""
    del node_name
    return get_family(family).discover(Path(host_root), **{k: v for k, v in options.items() if v is not None})


def health_monitor(family: str, host_root: Path, **options) -> HealthMonitor:
    return get_family(family).health_monitor(Path(host_root), **{k: v for k, v in options.items() if v is not None})
