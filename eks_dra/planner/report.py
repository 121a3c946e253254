"""The plan as a table for people and as JSON for tools (the shape DESIGN.md fixes)."""

from __future__ import annotations

import re

from .model import AllocatedDevice, PlanClaim
from .plan import PlanResult

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple:
    """neurondevice2 before neurondevice10: digit runs compare as numbers."""
    return tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(name))


def shown_devices(claim: PlanClaim) -> list[AllocatedDevice]:
    """A claim's devices grouped by request (in request order), each group in natural name order."""
    order = {r: i for i, r in enumerate(dict.fromkeys(d.request for d in claim.devices))}
    return sorted(claim.devices, key=lambda d: (order[d.request], d.driver, natural_key(d.device)))


def to_json(result: PlanResult) -> dict:
    return {
        "claims": [
            {
                "name": c.name,
                "namespace": c.namespace,
                "allocated": c.allocated,
                "node": c.node,
                "devices": [
                    {"request": d.request, "driver": d.driver, "pool": d.pool, "device": d.device,
                     "attributes": d.attributes}
                    for d in shown_devices(c)
                ],
                "reason": c.reason,
            }
            for c in result.claims
        ]
    }


def _attributes(device: AllocatedDevice) -> str:
    parts = []
    for name, value in device.attributes.items():
        # The driver's own domain is implied by the device; other domains stay qualified.
        short = name.split("/", 1)[1] if name.startswith(device.driver + "/") else name
        shown = str(value).lower() if isinstance(value, bool) else str(value)
        parts.append(f"{short}={shown}")
    return " ".join(parts)


def to_table(result: PlanResult) -> str:
    header = ("CLAIM", "NODE", "REQUEST", "DEVICE", "ATTRIBUTES")
    rows: list[tuple[str, ...]] = []
    for claim in result.claims:
        name = f"{claim.namespace}/{claim.name}"
        if not claim.allocated:
            rows.append((name, "-", "-", "NOT ALLOCATED", claim.reason or ""))
            continue
        if not claim.devices:
            rows.append((name, claim.node or "-", "-", "(no devices requested)", ""))
        for i, d in enumerate(shown_devices(claim)):
            rows.append((name if i == 0 else "", claim.node or "" if i == 0 else "", d.request,
                         f"{d.driver}/{d.device}", _attributes(d)))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = []
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    allocated = sum(c.allocated for c in result.claims)
    used = len({c.node for c in result.claims if c.allocated})
    lines.append("")
    lines.append(f"{allocated} of {len(result.claims)} claims allocated, on {used} of {len(result.nodes)} nodes")
    for warning in result.warnings:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)
