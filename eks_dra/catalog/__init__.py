"""Accelerator instance catalog: plain data, imports nothing of the rest of eks-dra."""

from __future__ import annotations

import difflib

from .instances import GPU_MODELS, INSTANCE_TYPES, NEURON_MODELS, SYSTEM_INSTANCE_TYPES
from .model import (
    Accelerator,
    EfaInterface,
    GpuModel,
    InstanceType,
    MigProfile,
    NeuronModel,
    PciLocation,
)

__all__ = [
    "Accelerator",
    "EfaInterface",
    "GPU_MODELS",
    "GpuModel",
    "INSTANCE_TYPES",
    "InstanceType",
    "MigProfile",
    "NEURON_MODELS",
    "NeuronModel",
    "PciLocation",
    "SYSTEM_INSTANCE_TYPES",
    "UnknownInstanceType",
    "closest_instance_types",
    "get_instance_type",
]


class UnknownInstanceType(KeyError):
    """An accelerator instance type the catalog does not know; the message names the closest ones."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def closest_instance_types(name: str, n: int = 3) -> list[str]:
    return difflib.get_close_matches(name, list(INSTANCE_TYPES), n=n, cutoff=0.4)


def get_instance_type(name: str) -> InstanceType:
    """Return the catalog entry for an accelerator instance type, or raise naming the closest ones."""
    try:
        return INSTANCE_TYPES[name]
    except KeyError:
        close = closest_instance_types(name)
        hint = f"; closest: {', '.join(close)}" if close else ""
        raise UnknownInstanceType(
            f"instance type {name!r} is not in the eks-dra accelerator catalog{hint}"
        ) from None
