"""The one reader of the YAML and JSON files a user hands eks-dra (manifests for `eks-dra plan`, config/<env>.yaml).

Every file has a budget, checked before anything is built from it: at most `max_bytes` bytes, UTF-8, nested at
most `MAX_DEPTH` collections deep, and (YAML) no anchors or aliases, which let a few hundred bytes stand for
billions of nodes. Each refusal is one UserError naming the file and, where there is one, the line.
Plain data: this module imports only PyYAML and the error type (the planner must stay light).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from eks_dra.errors import UserError, shown

# The Kubernetes API server takes request bodies up to 3 MiB (apiserver MaxRequestBodyBytes); a manifest file
# may hold many objects, so it gets a few times that. An environment file is a page of settings.
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
MAX_CONFIG_BYTES = 1024 * 1024
# Real manifests nest about 20 deep (a CRD schema about 60); the readers and validators behind this recurse.
MAX_DEPTH = 100

_CLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available: 10x faster
_JSON_NESTING = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')
ALIAS_FIX = "YAML aliases/anchors are not accepted; write the value out"
DEPTH_FIX = f"nested more than {MAX_DEPTH} levels deep; flatten the file"


def at(path: Path | str, line: int | None) -> str:
    """Where in a file: `path: line N` (lines count from 1), or the path alone."""
    return f"{path}: line {line}" if line is not None else str(path)


class _Loader(_CLoader):  # type: ignore[misc, valid-type]
    """A safe loader that may refuse a key given twice in one mapping (PyYAML keeps the last one silently)."""

    unique_keys = False

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if self.unique_keys:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                try:
                    line = seen.get(key)
                except TypeError:  # an unhashable key: the constructor below says so
                    break
                if line is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {shown(key)} (also on line {line + 1})", key_node.start_mark)
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


class _UniqueKeyLoader(_Loader):
    unique_keys = True


def read_text(path: Path, max_bytes: int) -> str:
    """The file's text: at most `max_bytes` bytes of UTF-8 (a byte order mark is dropped)."""
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return _decoded(path, data, max_bytes)


def _decoded(path: Path | str, data: bytes, max_bytes: int) -> str:
    if len(data) > max_bytes:
        raise UserError(f"{path}: larger than {max_bytes // (1024 * 1024)} MiB, the limit for this file; "
                        "split it into smaller files")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise UserError(f"{at(path, line)}: not UTF-8 (byte {exc.start} is 0x{data[exc.start]:02x}); "
                        "save the file as UTF-8") from None


def _check_yaml_events(path: Path | str, text: str) -> None:
    """Refuse anchors, aliases and deep nesting from the event stream, before any node is built."""
    depth = 0
    for event in yaml.parse(text, Loader=_CLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise UserError(f"{at(path, event.start_mark.line + 1)}: {ALIAS_FIX}")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise UserError(f"{at(path, event.start_mark.line + 1)}: {DEPTH_FIX}")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _yaml_documents(path: Path | str, text: str, unique_keys: bool) -> list[Any]:
    try:
        _check_yaml_events(path, text)
        return list(yaml.load_all(text, Loader=_UniqueKeyLoader if unique_keys else _Loader))  # noqa: S506 - safe
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        where = at(path, mark.line + 1 if mark is not None else None)
        if "maximum nesting depth" in problem:  # libyaml's own limit, met while it reads ahead
            raise UserError(f"{where}: {DEPTH_FIX}") from None
        if problem.startswith("duplicate key"):
            raise UserError(f"{where}: {problem}: YAML would keep only the last one; remove one") from None
        raise UserError(f"{where}: not valid YAML ({problem}); fix the syntax") from None
    except (ValueError, OverflowError) as exc:  # a scalar the constructor cannot convert (a date, a huge int)
        raise UserError(f"{path}: a value cannot be read: {shown(str(exc))}; quote it to keep it a string") from None


def _json_document(path: Path, text: str) -> Any:
    depth = 0
    for token in _JSON_NESTING.finditer(text):
        char = token.group()
        if char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                line = text.count("\n", 0, token.start()) + 1
                raise UserError(f"{at(path, line)}: {DEPTH_FIX}")
        elif char in "]}":
            depth -= 1
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{at(path, exc.lineno)}: not valid JSON: {exc.msg}") from None
    except ValueError as exc:  # an integer over Python's conversion limit
        raise UserError(f"{path}: not valid JSON: {shown(str(exc))}") from None


def load_documents(path: Path, max_bytes: int = MAX_MANIFEST_BYTES, unique_keys: bool = False) -> list[Any]:
    """Every document of a YAML file (a `.json` file: its one value), within the budgets above."""
    text = read_text(path, max_bytes)
    if path.suffix == ".json":
        return [_json_document(path, text)]
    return _yaml_documents(path, text, unique_keys)


def load_stream(stream: BinaryIO, name: str, max_bytes: int = MAX_MANIFEST_BYTES) -> list[Any]:
    """Every YAML document of a stream (`--claims -`: stdin; JSON is read as YAML), named `name` in messages,
    within the same budgets as a file."""
    try:
        data = stream.read(max_bytes + 1)
    except OSError as exc:
        raise UserError(f"{name}: cannot read: {exc.strerror or exc}") from None
    return _yaml_documents(name, _decoded(name, data, max_bytes), unique_keys=False)
