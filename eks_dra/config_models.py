"""The shape of `config/<env>.yaml` and `config/pipeline.yaml` as typed models (pydantic v2, extra="forbid").

The models check what a key may hold (types, choices, no unknown keys); `eks_dra.config` then derives the typed
environment and checks what depends on several keys or on the catalog. A model error becomes today's one line:
file, field path, what is wrong and the fix (with a did-you-mean for a misspelt key or choice). The JSON Schema of
the models is published in `config/schema/` for editors (`make schema` rewrites it; a test keeps it current).
Plain data: imports pydantic and nothing of the app.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from eks_dra.errors import shown

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "config" / "schema"


class _Model(BaseModel):
    # strict: YAML already gives native types; "2" is not a number and 1 is not a string.
    model_config = ConfigDict(extra="forbid", strict=True, alias_generator=to_camel, populate_by_name=False)


class TaintFile(_Model):
    key: str | None = None
    value: str | int | bool | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class NodeGroupFile(_Model):
    name: str | None = None
    instance_type: str | None = None
    min_size: int | None = None
    desired_size: int | None = None
    max_size: int | None = None
    ami_family: Literal["al2023", "bottlerocket"] | None = None
    ami_type: str | None = None
    device_mode: str | dict[str, Any] | None = None
    capacity: str | None = None
    efa: Literal["auto", "on", "off"] | bool | None = None  # YAML 1.1 reads a bare on/off as a boolean
    availability_zone: str | None = None
    labels: dict[str, Any] | None = None
    taints: list[TaintFile] | None = None
    mig_profile: str | None = None
    imds_hop_limit: int | None = None
    local_storage: bool | None = None


class VpcFile(_Model):
    cidr: str | None = None
    vpc_id: str | None = None
    private_subnets: dict[str, Any] | None = None
    availability_zones: list[str] | None = None


class DriverNamesFile(_Model):
    gpu: str | None = None
    efa: str | None = None
    neuron: str | None = None


class DriversFile(_Model):
    gpu: Literal["python", "upstream"] | None = None
    efa: Literal["python", "upstream"] | None = None
    neuron: Literal["python", "upstream"] | None = None
    names: DriverNamesFile | None = None


class ApiEndpointFile(_Model):
    public: bool | None = None
    public_access_cidrs: list[str] | None = None


class EnvironmentFile(_Model):
    account: str | int | None = None
    region: str | None = None
    cluster_name: str | None = None
    kubernetes_version: str | float | int | None = None
    vpc: VpcFile | None = None
    protected: bool | None = None
    node_groups: list[NodeGroupFile] | None = None
    drivers: DriversFile | None = None
    driver_image: str | None = None
    cluster_admin_role_arns: list[Any] | None = None
    api_endpoint: ApiEndpointFile | None = None
    log_retention_days: int | None = None
    samples: bool | None = None
    compute_domains: bool | None = None
    # Refused with the reason (eks-dra never uses dynamic capacity); listed so the message can say why.
    auto_mode: bool | None = None
    karpenter: Any = None


class PipelineSourceFile(_Model):
    repository: str | None = None
    branch: str | None = None
    connection_arn: str | None = None


class PipelineFile(_Model):
    environments: list[str | int] | None = None
    source: PipelineSourceFile | None = None
    account: str | int | None = None
    region: str | None = None


# --- one line per mistake ---------------------------------------------------------------------

_EXPECTED = {"string_type": "a string", "int_type": "an integer", "bool_type": "true or false", "float_type": "a number",
             "dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping",
             "list_type": "a list"}


def validated(model: type[_Model], data: dict, source: Path) -> dict:
    """The file's mapping checked by the model, returned as written (keys as in YAML, unset keys absent).
    Raises ValueError with the one-line message (the caller turns it into a UserError)."""
    try:
        return model.model_validate(data).model_dump(by_alias=True, exclude_unset=True)
    except ValidationError as exc:
        raise ValueError(f"{source}: {_message(model, exc.errors())}") from None


def _is_union_tag(part: Any) -> bool:
    return isinstance(part, str) and (part in ("str", "int", "bool", "float") or part.startswith(
        ("literal[", "dict[", "list[")))


def _message(model: type[_Model], errors: list[dict]) -> str:
    first = errors[0]
    loc = tuple(p for p in first["loc"] if not _is_union_tag(p))
    if loc and loc[-1] == "[key]":
        return f"{_path(loc[:-2])}.{loc[-2]}: the key must be a string"
    group = [e for e in errors if tuple(p for p in e["loc"] if not _is_union_tag(p)) == loc]
    value = first.get("input")
    if first["type"] == "extra_forbidden":
        allowed = _aliases(_model_at(model, loc[:-1]))
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else f"; allowed: {', '.join(allowed)}"
        return f"{_path(loc)}: unknown setting{hint}"
    choice = next((e for e in group if e["type"] == "literal_error"), None)
    if choice is not None and isinstance(value, str):
        choices = re.findall(r"'([^']*)'", choice["ctx"]["expected"])
        close = difflib.get_close_matches(value, choices, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{_path(loc)}: {shown(value)} is not allowed{hint}; use one of: {', '.join(choices)}"
    expected = [_EXPECTED.get(e["type"], "one of " + e.get("ctx", {}).get("expected", "the documented values"))
                for e in group]
    return f"{_path(loc)}: must be {' or '.join(dict.fromkeys(expected))}, got {_kind(value)} {shown(value)}"


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if not isinstance(part, int):  # a key the user wrote: of any length, and quoted if it holds a line break
            part = shown(part, quoted=not str(part).isprintable())
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "nothing"}.get(type(value), type(value).__name__)


def _aliases(model: type[_Model]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _model_at(model: type[_Model], loc: tuple) -> type[_Model]:
    """The model class that holds the mapping at loc (list indexes skipped)."""
    for part in loc:
        if isinstance(part, int):
            continue
        field = next(f for name, f in model.model_fields.items() if (f.alias or name) == part)
        model = next(_models_in(field.annotation))
    return model


def _models_in(annotation: Any):
    if isinstance(annotation, type) and issubclass(annotation, _Model):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _models_in(arg)


# --- the published JSON Schema ------------------------------------------------------------------

SCHEMAS = {"environment.schema.json": EnvironmentFile, "pipeline.schema.json": PipelineFile}


def json_schemas() -> dict[str, str]:
    out = {}
    for name, model in SCHEMAS.items():
        schema = model.model_json_schema(by_alias=True)
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["title"] = "eks-dra " + name.split(".")[0] + " (config/*.yaml)"
        out[name] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return out


def main() -> None:
    """`python -m eks_dra.config_models [DIR]`: write the JSON Schemas (default config/schema/)."""
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else SCHEMA_DIR
    out.mkdir(parents=True, exist_ok=True)
    for name, text in json_schemas().items():
        (out / name).write_text(text)


if __name__ == "__main__":
    main()
