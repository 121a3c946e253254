"""The device model shared by the drivers' discovery and the planner's simulation.

A `Device` is what a driver publishes in a `resource.k8s.io/v1` ResourceSlice: a name, typed attributes
and capacities. Attribute keys without a domain belong to the driver's own domain (Kubernetes rule), so
`productName` on driver `gpu.nvidia.com` is read in CEL as `device.attributes["gpu.nvidia.com"].productName`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction

MAX_DEVICES_PER_SLICE = 128  # ResourceSliceMaxDevices in resource.k8s.io/v1
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"  # the only standard attribute in 1.34
DEVICE_GROUP = "resource.aws.com/devicegroup{size}_id"
DEVICE_GROUP_SIZES = (1, 4, 8, 16)

_SEMVER_CORE = re.compile(r"^(\d+)(?:\.(\d+))?(?:\.(\d+))?")


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
            "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
            "P": Fraction(10**15), "E": Fraction(10**18)}
# <signedNumber><suffix>, suffix one of the binary SI, decimal SI or a decimal exponent (e3, E-2).
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")


def parse_quantity(text: str) -> Fraction:
    """The exact value of a Kubernetes quantity string; ValueError when it is not one."""
    m = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 80Gi, 500m, 1e3)")
    number, suffix = Fraction(m.group(1)), m.group(2) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number * Fraction(10) ** int(suffix[1:])


@dataclass(frozen=True)
class Version:
    """A semver 2.0 attribute value (published as `{"version": ...}`)."""

    value: str

    @classmethod
    def from_loose(cls, text: str) -> Version:
        """Turn "9.0" or "580.95.05" into semver ("9.0.0", "580.95.5"): semver forbids leading zeros."""
        m = _SEMVER_CORE.match(text.strip())
        if not m:
            raise ValueError(f"not a version: {text!r}")
        major, minor, patch = (int(g) if g else 0 for g in m.groups())
        return cls(f"{major}.{minor}.{patch}")


AttributeValue = bool | int | str | Version


def attribute_to_api(value: AttributeValue) -> dict:
    # bool before int: bool is an int subclass in Python.
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, Version):
        return {"version": value.value}
    return {"string": value}


def attribute_from_api(value: dict) -> AttributeValue:
    if "bool" in value:
        return bool(value["bool"])
    if "int" in value:
        return int(value["int"])
    if "version" in value:
        return Version(value["version"])
    return str(value["string"])


@dataclass
class Device:
    name: str
    attributes: dict[str, AttributeValue] = field(default_factory=dict)
    capacity: dict[str, str] = field(default_factory=dict)  # Kubernetes quantities, e.g. "81920Mi"
    taints: list[dict] = field(default_factory=list)  # {key, value, effect} (DRADeviceTaints, 1.36+)

    def to_api(self) -> dict:
        out: dict = {"name": self.name}
        if self.attributes:
            out["attributes"] = {k: attribute_to_api(v) for k, v in sorted(self.attributes.items())}
        if self.capacity:
            out["capacity"] = {k: {"value": v} for k, v in sorted(self.capacity.items())}
        if self.taints:
            out["taints"] = [dict(t) for t in self.taints]
        return out

    @classmethod
    def from_api(cls, obj: dict) -> Device:
        return cls(
            name=obj["name"],
            attributes={k: attribute_from_api(v) for k, v in (obj.get("attributes") or {}).items()},
            capacity={k: str(v["value"]) for k, v in (obj.get("capacity") or {}).items()},
            taints=[{k: t[k] for k in ("key", "value", "effect") if k in t} for t in obj.get("taints") or []],
        )


def qualify(driver: str, key: str) -> tuple[str, str]:
    """Split an attribute key into (domain, identifier); unqualified keys belong to the driver."""
    if "/" in key:
        domain, ident = key.split("/", 1)
        return domain, ident
    return driver, key


def chunk_devices(devices: list[Device], size: int = MAX_DEVICES_PER_SLICE) -> list[list[Device]]:
    """Split a pool's devices into slices of at most `size` (an empty pool still gets one empty slice)."""
    ordered = sorted(devices, key=lambda d: d.name)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)] or [[]]


def resource_slices(
    driver: str,
    node_name: str,
    devices: list[Device],
    generation: int = 1,
    node_uid: str | None = None,
) -> list[dict]:
    """Render the ResourceSlices of one node's pool (pool name = node name) as API objects."""
    chunks = chunk_devices(devices)
    slices = []
    for i, chunk in enumerate(chunks):
        meta: dict = {"name": slice_name(node_name, driver, i)}
        if node_uid:
            meta["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid, "controller": True}
            ]
        slices.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": meta,
                "spec": {
                    "driver": driver,
                    "nodeName": node_name,
                    "pool": {"name": node_name, "generation": generation, "resourceSliceCount": len(chunks)},
                    "devices": [d.to_api() for d in chunk],
                },
            }
        )
    return slices


def slice_name(node_name: str, driver: str, index: int) -> str:
    """Deterministic slice names keep re-publication idempotent (253-char DNS subdomain limit)."""
    base = f"{node_name}-{driver}".lower()
    base = re.sub(r"[^a-z0-9.-]", "-", base)[:240].strip("-.")
    return f"{base}-{index}"
