"""Reading synthesized manifests back, and evaluating node affinity against node-group labels."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import yaml


def load_documents(paths: list[Path]) -> list[dict]:
    docs: list[dict] = []
    for path in paths:
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def _requirement_holds(req: dict, node_labels: dict[str, str]) -> bool:
    key, op, values = req["key"], req["operator"], req.get("values", [])
    if op == "In":
        return node_labels.get(key) in values
    if op == "NotIn":
        return node_labels.get(key) not in values
    if op == "Exists":
        return key in node_labels
    if op == "DoesNotExist":
        return key not in node_labels
    raise ValueError(f"operator {op} not handled")


def pod_fits_labels(pod_spec: dict, node_labels: dict[str, str]) -> bool:
    """nodeSelector and required node affinity (terms ORed, expressions ANDed) against a node's labels."""
    if any(node_labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return True
    return any(all(_requirement_holds(r, node_labels) for r in term.get("matchExpressions", []))
               for term in required["nodeSelectorTerms"])


def tolerates(pod_spec: dict, key: str, effect: str, value: str | None = None) -> bool:
    """Whether a toleration matches the taint (an Equal toleration must match `value` when one is given)."""
    for t in pod_spec.get("tolerations") or []:
        if t.get("effect") not in (None, "", effect):
            continue
        if t.get("operator") == "Exists" and t.get("key") in (None, key):
            return True
        if t.get("key") == key and (value is None or t.get("value", "") == value):
            return True
    return False


def selectors_of_claim(spec: dict) -> Iterator[tuple[str, str, list[str], bool]]:
    """(request name, device class, CEL selectors, is a prioritized alternative) for each (sub)request."""
    for req in spec["devices"].get("requests", []):
        if "exactly" in req:
            ex = req["exactly"]
            yield req["name"], ex["deviceClassName"], [s["cel"]["expression"] for s in ex.get("selectors", [])], False
        for sub in req.get("firstAvailable", []):
            yield (f"{req['name']}/{sub['name']}", sub["deviceClassName"],
                   [s["cel"]["expression"] for s in sub.get("selectors", [])], True)
