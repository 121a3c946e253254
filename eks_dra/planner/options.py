"""Command-line options shared by `eks-dra plan` and `eks-dra slices`."""

from __future__ import annotations

import dataclasses

from eks_dra.devices import DEFAULT_DRIVER_NAMES, FAMILIES, DriverNames
from eks_dra.errors import UserError


def driver_names(overrides: list[str]) -> DriverNames:
    """DriverNames with `FAMILY=NAME` overrides (an environment's configured names, e.g. gpu=gpu.example.com)."""
    changes: dict[str, str] = {}
    for item in overrides:
        family, sep, name = item.partition("=")
        if not sep or family not in FAMILIES or "." not in name:
            raise UserError(f"--driver-name {item!r}: expected FAMILY=NAME with FAMILY one of "
                            f"{', '.join(FAMILIES)} and NAME a DNS subdomain, e.g. gpu=gpu.example.com")
        changes[family] = name
    names = dataclasses.replace(DEFAULT_DRIVER_NAMES, **changes)
    if len({names.gpu, names.efa, names.neuron}) != 3:
        raise UserError("--driver-name: each device family needs its own driver name")
    return names
