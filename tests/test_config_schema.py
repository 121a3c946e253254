"""The typed config models: the published JSON Schema is current, accepts the shipped files and refuses what the
loader refuses structurally; model errors are today's one-line messages."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from eks_dra.config import load_environment
from eks_dra.config_models import SCHEMA_DIR, json_schemas
from eks_dra.errors import UserError

CONFIG = Path(__file__).resolve().parent.parent / "config"


def test_published_schema_is_current():
    for name, text in json_schemas().items():
        assert (SCHEMA_DIR / name).read_text() == text, f"config/schema/{name} is stale: run `make schema`"


@pytest.mark.parametrize("name", ["dev", "staging", "prod", "pipeline"])
def test_shipped_files_match_the_schema_their_first_line_names(name):
    text = (CONFIG / f"{name}.yaml").read_text()
    first = text.splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema=schema/")
    schema = json.loads((CONFIG / first.split("$schema=")[1]).read_text())
    jsonschema.validate(yaml.safe_load(text), schema)


def test_schema_refuses_a_misspelt_key_and_a_wrong_choice():
    schema = json.loads((SCHEMA_DIR / "environment.schema.json").read_text())
    for bad in ({"clusterNmae": "x"}, {"nodeGroups": [{"name": "a", "amiFamily": "bottlerock"}]},
                {"nodeGroups": [{"name": "a", "maxSize": "many"}]}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


@pytest.mark.parametrize(("body", "message"), [
    ("account: [1]\n", "account: must be a string or an integer, got a list [1]"),
    ("vpc: [10.0.0.0/16]\n", "vpc: must be a mapping, got a list ['10.0.0.0/16']"),
    ("drivers: {gpu: pyhton}\n", "drivers.gpu: 'pyhton' is not allowed (did you mean 'python'?); use one of: python, "
                                 "upstream"),
    ("nodeGroups:\n  - {name: a, instanceType: m7i.xlarge, efa: maybe}\n",
     "nodeGroups[0].efa: 'maybe' is not allowed; use one of: auto, on, off"),
    ("nodeGroups:\n  - {name: a, instanceType: m7i.xlarge, taints: [{key: k, efect: NoSchedule}]}\n",
     "nodeGroups[0].taints[0].efect: unknown setting; did you mean 'effect'?"),
    ("apiEndpoint: {public: yes please}\n", "apiEndpoint.public: must be true or false, got a string 'yes please'"),
])
def test_model_errors_are_one_line_with_field_and_fix(tmp_path, body, message):
    (tmp_path / "bad.yaml").write_text("region: us-east-2\n" + body)
    with pytest.raises(UserError) as exc:
        load_environment("bad", tmp_path)
    assert str(exc.value) == f"{tmp_path}/bad.yaml: {message}"
