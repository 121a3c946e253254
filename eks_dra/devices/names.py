"""Driver names per device family. Defaults live in eks-dra's own domain; all are configurable."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Family = Literal["gpu", "efa", "neuron"]
FAMILIES: tuple[Family, ...] = ("gpu", "efa", "neuron")


@dataclass(frozen=True)
class DriverNames:
    gpu: str = "gpu.eks-dra.io"
    efa: str = "efa.eks-dra.io"
    neuron: str = "neuron.eks-dra.io"

    def for_family(self, family: Family) -> str:
        return getattr(self, family)


DEFAULT_DRIVER_NAMES = DriverNames()
