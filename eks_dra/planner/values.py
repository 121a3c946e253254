"""Kubernetes quantities and semantic versions, parsed and compared as the 1.34 CEL libraries do.

Kubernetes' CEL environment has two opaque types, Quantity (capacities, `quantity("1Gi")`) and Semver
(`version` attributes, `semver("1.2.3")`). The CEL library we use cannot declare new types, so both travel
through CEL as one-key maps (`{"@quantity": "1073741824"}`, `{"@semver": "1.2.3"}`) holding a canonical
form: equal values compare equal with `==`, and the library functions below order them.
"""

from __future__ import annotations

import re
from fractions import Fraction

from eks_dra.devices.model import parse_quantity

QUANTITY_KEY = "@quantity"
SEMVER_KEY = "@semver"

def quantity_value(text: str) -> dict[str, str]:
    return {QUANTITY_KEY: str(parse_quantity(text))}


def quantity_of(value: object) -> Fraction | None:
    if isinstance(value, dict) and len(value) == 1 and QUANTITY_KEY in value:
        return Fraction(value[QUANTITY_KEY])
    return None


_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)
_LOOSE_CORE = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(.*)$")


def parse_semver(text: str, normalize: bool = False) -> tuple[int, int, int, tuple[str, ...]]:
    """(major, minor, patch, prerelease identifiers) of a semver 2.0 string; build metadata is dropped.

    `normalize` accepts what Kubernetes' `semver(s, true)` accepts: a leading "v", missing minor or patch
    and leading zeros.
    """
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not a string")
    if normalize:
        m = _LOOSE_CORE.match(text)
        if m:
            major, minor, patch, rest = m.group(1), m.group(2) or "0", m.group(3) or "0", m.group(4)
            text = f"{int(major)}.{int(minor)}.{int(patch)}{rest}"
    m = _SEMVER.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a semantic version (semver 2.0, e.g. 1.2.3)")
    pre = tuple(m.group(4).split(".")) if m.group(4) else ()
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), pre


def semver_text(parts: tuple[int, int, int, tuple[str, ...]]) -> str:
    core = f"{parts[0]}.{parts[1]}.{parts[2]}"
    return f"{core}-{'.'.join(parts[3])}" if parts[3] else core


def semver_value(text: str, normalize: bool = False) -> dict[str, str]:
    return {SEMVER_KEY: semver_text(parse_semver(text, normalize))}


def semver_of(value: object) -> tuple[int, int, int, tuple[str, ...]] | None:
    if isinstance(value, dict) and len(value) == 1 and SEMVER_KEY in value:
        return parse_semver(value[SEMVER_KEY])
    return None


def compare_semver(a: tuple[int, int, int, tuple[str, ...]], b: tuple[int, int, int, tuple[str, ...]]) -> int:
    """Semver 2.0 precedence: a release outranks its prereleases; numeric identifiers sort below others."""
    if a[:3] != b[:3]:
        return -1 if a[:3] < b[:3] else 1
    pa, pb = a[3], b[3]
    if not pa or not pb:
        return (not pa) - (not pb)
    for x, y in zip(pa, pb, strict=False):
        if x == y:
            continue
        xn, yn = x.isdigit(), y.isdigit()
        if xn and yn:
            return -1 if int(x) < int(y) else 1
        if xn != yn:
            return -1 if xn else 1
        return -1 if x < y else 1
    return (len(pa) > len(pb)) - (len(pa) < len(pb))
