"""The CRD schemas in eks_dra/planner/crds/ are exactly what its generator writes from the projects' Go modules,
and the planner names the releases they come from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eks_dra.errors import UserError
from eks_dra.planner import crd_schema
from eks_dra.planner.crds import generate
from eks_dra.planner.workloads import RUNTIME_KINDS, WORKLOADS

CRDS = Path(generate.__file__).parent


def _committed() -> dict[str, str]:
    names = [CRDS / "README.md", CRDS / "common.json", *CRDS.glob("*/*.json")]
    return {str(p.relative_to(CRDS)): p.read_text() for p in names}


def test_committed_schemas_are_the_generators_output(tmp_path):
    # The module proxy as GOPROXY names it, the module and build caches as Go keeps them (warm: a few seconds;
    # cold: the modules and a controller-gen build, a few minutes).
    if shutil.which("go") is None:
        pytest.skip("CRD schema generator: Go not found on PATH; install Go to download the CRDs' modules "
                    "(python -m eks_dra.planner.crds.generate)")
    assert generate.main(["--out", str(tmp_path)]) == 0
    made = {str(p.relative_to(tmp_path)): p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    committed = _committed()
    assert sorted(made) == sorted(committed)
    stale = [name for name in made if made[name] != committed[name]]
    assert not stale, f"{stale} differ from the generator's output: run python -m eks_dra.planner.crds.generate"


def test_every_planned_kind_has_its_source_and_release():
    sources = {(s.group, s.kind): s for s in generate.SOURCES}
    assert set(sources) == set(WORKLOADS) | RUNTIME_KINDS
    for (group, kind), workload in WORKLOADS.items():
        source = sources[group, kind]
        assert workload.version == f"{group}/{source.version}"
        assert source.module_version in workload.release, (kind, workload.release)


def _node(properties: dict) -> dict:
    return {"type": "object", "properties": properties}


def test_structural_keeps_types_and_limits_and_closes_objects():
    crd = _node({
        "replicas": {"type": "integer", "format": "int32", "default": 1, "minimum": 0, "description": "n"},
        "port": {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]},
        "when": {"type": "string", "nullable": True, "format": "date-time"},
        "config": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {"a": {
            "type": "string", "enum": ["x"], "x-kubernetes-validations": [{"rule": "self != ''"}]}}},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    })
    assert generate.structural(crd) == {"type": "object", "additionalProperties": False, "properties": {
        "replicas": {"type": "integer", "minimum": 0},
        "port": {"type": ["integer", "string"], "anyOf": [{"type": "integer"}, {"type": "string"}]},
        "when": {"type": ["string", "null"]},
        "config": {"type": "object", "properties": {"a": {"type": "string", "enum": ["x"]}}},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    }}


def _expand(node, common: dict):
    if isinstance(node, dict):
        if "$ref" in node:
            return _expand(common["$defs"][node["$ref"].rsplit("/", 1)[1]], common)
        return {k: _expand(v, common) for k, v in node.items()}
    return [_expand(v, common) for v in node] if isinstance(node, list) else node


def test_dedup_shares_repeats_once_and_expands_back():
    # `inner` repeats only inside `outer`, so it stays inline; `outer` repeats across files and moves out.
    inner = _node({f"field{i}": {"type": "string", "enum": [f"value-{i}"] * 8} for i in range(12)})
    outer = _node({"left": inner, "right": inner})
    roots = {"a/A.json": _node({"spec": outer}), "b/B.json": _node({"spec": _node({"template": outer})})}
    files, common = generate.dedup(roots)
    assert len(common["$defs"]) == 2  # outer, and inner (twice in outer's body)
    assert files["a/A.json"]["properties"]["spec"]["$ref"].startswith("../common.json#/$defs/s")
    for name, root in roots.items():
        relinked = json.loads(json.dumps(files[name]).replace("../common.json#", "#"))
        assert _expand(relinked, common) == root
    single = {"a/A.json": _node({"spec": inner})}
    assert generate.dedup(single)[1]["$defs"] == {}


def test_volcano_job_accepts_dra_pod_claims():
    # The pod template of Kubernetes >= 1.31: resourceClaimTemplateName at the top of a pod's resourceClaims,
    # and a container claim naming one request (Volcano v1.10.0's CRD has neither).
    pod = {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}],
           "containers": [{"name": "w", "image": "x", "resources": {"claims": [{"name": "gpus", "request": "g"}]}}]}
    job = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "j"},
           "spec": {"tasks": [{"name": "w", "replicas": 2, "template": {"spec": pod}}]}}
    crd_schema.validate(job, "batch.volcano.sh", "Job", "job.yaml", "volcano.sh/apis v1.12.2")
    pod["resourceClaims"][0]["resourceClaimTemplate"] = "eight-gpus"
    with pytest.raises(UserError, match="resourceClaims\\[0\\].resourceClaimTemplate: unknown field"):
        crd_schema.validate(job, "batch.volcano.sh", "Job", "job.yaml", "volcano.sh/apis v1.12.2")
