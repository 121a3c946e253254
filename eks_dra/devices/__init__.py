"""One device model for the drivers' discovery and the planner (see DESIGN.md)."""

from .model import (
    MAX_DEVICES_PER_SLICE,
    PCIE_ROOT,
    AttributeValue,
    Device,
    Version,
    resource_slices,
)
from .names import DEFAULT_DRIVER_NAMES, FAMILIES, DriverNames, Family
from .simulate import NodeFacts, devices_from_facts, node_facts, simulate_node

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
