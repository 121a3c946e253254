"""Check an ML workload object against its CRD's OpenAPI schema, vendored in crds/ (crds/README.md: sources).

The schemas are the CRDs' structural schemas as JSON Schema: descriptions, defaults and CEL rules left out, and
`additionalProperties: false` on every object with properties that the CRD does not mark
x-kubernetes-preserve-unknown-fields. That refuses an unknown field the way `kubectl apply` does (server-side
field validation Strict, its default) instead of the API server pruning it silently. jsonschema is imported
and the files are read only when such an object is in the manifests.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from eks_dra.errors import UserError, shown

CRDS = Path(__file__).parent / "crds"
COMMON_ID = "https://eks-dra.invalid/crds/common.json"


@cache
def _validator(group: str, kind: str) -> Any:
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    common = json.loads((CRDS / "common.json").read_text())
    registry = Registry().with_resource(COMMON_ID, Resource.from_contents(common))
    return Draft202012Validator(json.loads((CRDS / group / f"{kind}.json").read_text()), registry=registry)


def field_path(parts: Any) -> str:
    """spec.replicatedJobs[0].template: the path kubectl's errors use."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def validate(obj: dict, group: str, kind: str, where: str, release: str) -> None:
    """Raise UserError naming the first field the CRD's schema refuses (`release`: whose schema, for the fix)."""
    from jsonschema.exceptions import best_match

    error = best_match(_validator(group, kind).iter_errors(obj))
    if error is None:
        return
    path = field_path(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = set(error.schema.get("properties") or {})
        unknown = sorted(k for k in error.instance if k not in known)
        if unknown:
            field = f"{path}.{unknown[0]}" if error.absolute_path else unknown[0]
            nearest = ", ".join(sorted(known)[:12])
            raise UserError(f"{where}: {field}: unknown field (the {kind} schema of {release} has: {nearest}); "
                            "check its spelling and indentation")
    raise UserError(f"{where}: {path}: {_short(error.message)} (the {kind} schema of {release})")


def _short(message: str) -> str:
    """jsonschema echoes whole sub-objects; one line, cut to the echo limit, is enough to find the field."""
    return shown(message.replace("\n", " "), quoted=False)
