"""Write the CRD schemas `crd_schema.py` reads from the projects' released Go modules.

    python -m eks_dra.planner.crds.generate [--out DIR]     (needs Go; DIR defaults to this folder)

Each module is fetched with `go mod download -json MODULE@VERSION` (GOPROXY and the module cache as Go is set
up; GOTOOLCHAIN=local), and the CRD YAML at the path below in the module's directory is turned into JSON Schema
2020-12. A Source with a `package` has its CRD YAML made the way its project makes it: controller-gen (pinned
with the module in controller-gen/go.mod) over that Go package. Only what the API server itself checks structurally is kept: types, properties, items, required,
enums and the value limits (pattern, lengths, minimum). Descriptions, defaults, formats, examples, CEL rules
(x-kubernetes-validations), list/map markers and `status` are left out. Objects with properties that the CRD
does not mark x-kubernetes-preserve-unknown-fields get `additionalProperties: false`: an unknown field is
refused, as `kubectl apply` does with its default strict field validation. Subschemas over SHARED_MIN_BYTES
that occur more than once (pod templates, containers, affinity) are stored once in common.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).parent
BASE_ID = "https://eks-dra.invalid/crds/"
DRAFT = "https://json-schema.org/draft/2020-12/schema"
# Smaller repeats (a string map, a quantity) cost more as a $ref than inline.
SHARED_MIN_BYTES = 512


@dataclass(frozen=True)
class Source:
    group: str
    kind: str
    version: str  # the CRD version planned (its storage version)
    module: str
    module_version: str
    path: str  # inside the module; with `package`, the file controller-gen writes
    package: str = ""  # the Go package (in the module) whose types controller-gen turns into the CRD

    @property
    def file(self) -> str:
        return f"{self.group}/{self.kind}.json"


_TRAINING = ("github.com/kubeflow/training-operator", "v1.9.0")
_KUBERAY = ("github.com/ray-project/kuberay/ray-operator", "v1.4.2")
_TRAINER = ("github.com/kubeflow/trainer/v2", "v2.0.1")
SOURCES: tuple[Source, ...] = (
    Source("kubeflow.org", "PyTorchJob", "v1", *_TRAINING, "manifests/base/crds/kubeflow.org_pytorchjobs.yaml"),
    Source("kubeflow.org", "TFJob", "v1", *_TRAINING, "manifests/base/crds/kubeflow.org_tfjobs.yaml"),
    Source("kubeflow.org", "XGBoostJob", "v1", *_TRAINING, "manifests/base/crds/kubeflow.org_xgboostjobs.yaml"),
    Source("kubeflow.org", "MPIJob", "v2beta1", "github.com/kubeflow/mpi-operator", "v0.6.0",
           "manifests/base/kubeflow.org_mpijobs.yaml"),
    Source("jobset.x-k8s.io", "JobSet", "v1alpha2", "sigs.k8s.io/jobset", "v0.8.2",
           "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"),
    Source("leaderworkerset.x-k8s.io", "LeaderWorkerSet", "v1", "sigs.k8s.io/lws", "v0.7.0",
           "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml"),
    Source("ray.io", "RayCluster", "v1", *_KUBERAY, "config/crd/bases/ray.io_rayclusters.yaml"),
    Source("ray.io", "RayJob", "v1", *_KUBERAY, "config/crd/bases/ray.io_rayjobs.yaml"),
    # volcano.sh/volcano v1.12.2, whose config/crd/volcano/bases/batch.volcano.sh_jobs.yaml this is, could
    # not be downloaded from the module proxy (403, "not available"); the newest that could, v1.10.0, has a
    # Kubernetes 1.30 pod template without DRA's resourceClaimTemplateName. So the CRD is made as Volcano's
    # Makefile (`manifests`) makes it, from the API module that release builds on.
    Source("batch.volcano.sh", "Job", "v1alpha1", "volcano.sh/apis", "v1.12.2", "batch.volcano.sh_jobs.yaml",
           package="pkg/apis/batch/v1alpha1"),
    Source("trainer.kubeflow.org", "TrainJob", "v1alpha1", *_TRAINER,
           "manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml"),
    Source("trainer.kubeflow.org", "TrainingRuntime", "v1alpha1", *_TRAINER,
           "manifests/base/crds/trainer.kubeflow.org_trainingruntimes.yaml"),
    Source("trainer.kubeflow.org", "ClusterTrainingRuntime", "v1alpha1", *_TRAINER,
           "manifests/base/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml"),
)

CONTROLLER_GEN = HERE / "controller-gen"
# Volcano's Makefile CRD_OPTIONS_EXCLUDE_DESCRIPTION (descriptions are dropped here anyway).
CONTROLLER_GEN_OPTIONS = "crd:crdVersions=v1,generateEmbeddedObjectMeta=true,maxDescLen=0"
# Kept as the CRD states them; everything else (description, default, format, x-kubernetes-*) is dropped.
_VALUE_KEYWORDS = ("enum", "pattern", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
                   "exclusiveMaximum", "minItems", "maxItems", "uniqueItems", "minProperties", "maxProperties")


class GenerateError(Exception):
    """A one-line reason the schemas cannot be generated."""


def _go(args: list[str], cwd: Path | str, mod: str) -> subprocess.CompletedProcess:
    if shutil.which("go") is None:
        raise GenerateError("go not found on PATH; install Go to download the CRDs' modules")
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOWORK": "off", "GOFLAGS": f"-mod={mod}"}
    return subprocess.run(["go", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _reason(run: subprocess.CompletedProcess) -> str:
    """The first line of a failed go command's output that is not download progress."""
    lines = [line for line in (run.stderr + run.stdout).splitlines() if line and not line.startswith("go: downloading")]
    return lines[0] if lines else f"exit status {run.returncode}"


def module_dir(module: str, version: str) -> Path:
    """The module's directory in the Go module cache, downloading it through GOPROXY if needed."""
    # Outside any go.mod (an empty folder), so no main module's go.sum or vendor folder is read or written.
    with tempfile.TemporaryDirectory(prefix="eks-dra-crds-") as cwd:
        run = _go(["mod", "download", "-json", f"{module}@{version}"], cwd, "mod")
    try:
        info = json.loads(run.stdout)
    except json.JSONDecodeError:
        raise GenerateError(f"go mod download {module}@{version}: {_reason(run)}") from None
    if info.get("Error") or not info.get("Dir"):
        first = str(info.get("Error") or "no Dir in its answer").splitlines()[0]
        raise GenerateError(f"go mod download {module}@{version}: {first}")
    return Path(info["Dir"])


def controller_gen(source: Source, out: Path) -> Path:
    """Run controller-gen over `source.package`; the folder it wrote the CRD YAML to."""
    pinned = _go(["list", "-m", "-json", source.module], CONTROLLER_GEN, "readonly")
    if pinned.returncode != 0:
        raise GenerateError(f"{CONTROLLER_GEN / 'go.mod'}: go list -m {source.module}: {_reason(pinned)}")
    version = json.loads(pinned.stdout).get("Version")
    if version != source.module_version:
        raise GenerateError(f"{CONTROLLER_GEN / 'go.mod'}: requires {source.module} {version}, SOURCES says "
                            f"{source.module_version}; make them agree (then `go mod tidy` there)")
    run = _go(["run", "sigs.k8s.io/controller-tools/cmd/controller-gen", CONTROLLER_GEN_OPTIONS,
               f"paths={source.module}/{source.package}", f"output:crd:artifacts:config={out}"],
              CONTROLLER_GEN, "readonly")
    if run.returncode != 0:
        raise GenerateError(f"controller-gen {source.module}/{source.package}: {_reason(run)}")
    return out


def crd_schema(source: Source, crd_file: Path) -> dict:
    """The openAPIV3Schema of `source.version` in the CRD file, checked to be the kind it is meant to be."""
    where = f"{source.module}@{source.module_version} {source.path}"
    try:
        crd = yaml.load(crd_file.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except FileNotFoundError:
        raise GenerateError(f"{where}: no such file in the module; correct its path in SOURCES") from None
    spec = crd.get("spec") if isinstance(crd, dict) and crd.get("kind") == "CustomResourceDefinition" else None
    if not spec or spec.get("group") != source.group or spec.get("names", {}).get("kind") != source.kind:
        raise GenerateError(f"{where}: not the CustomResourceDefinition of {source.group} {source.kind}")
    versions = {v.get("name"): v for v in spec.get("versions") or []}
    if source.version not in versions:
        raise GenerateError(f"{where}: no version {source.version} (it has {', '.join(sorted(versions))})")
    return versions[source.version]["schema"]["openAPIV3Schema"]


def structural(node: dict) -> dict:
    """One CRD schema node as JSON Schema: structure, types and value limits only."""
    out: dict[str, Any] = {k: node[k] for k in _VALUE_KEYWORDS if k in node}
    kind = node.get("type")
    if node.get("x-kubernetes-int-or-string"):
        kind = ["integer", "string"]
    if kind is not None and node.get("nullable"):
        kind = [*(kind if isinstance(kind, list) else [kind]), "null"]
    if kind is not None:
        out["type"] = kind
    if "anyOf" in node:
        out["anyOf"] = [structural(choice) for choice in node["anyOf"]]
    if "items" in node:
        out["items"] = structural(node["items"])
    if "properties" in node:
        out["properties"] = {name: structural(sub) for name, sub in node["properties"].items()}
    if "required" in node:
        out["required"] = list(node["required"])
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        out["additionalProperties"] = structural(extra)
    elif isinstance(extra, bool):
        out["additionalProperties"] = extra
    elif "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def object_schema(source: Source, schema: dict) -> dict:
    """The whole object: its spec as the CRD has it, metadata as any object (the API server checks it), no status."""
    root = structural(schema)
    properties = {k: v for k, v in root.get("properties", {}).items() if k != "status"}
    properties["metadata"] = {"type": "object"}
    return {**root, "properties": properties, "$id": f"{BASE_ID}{source.file}", "$schema": DRAFT}


def _canonical(node: Any) -> str:
    return json.dumps(node, sort_keys=True, separators=(",", ":"))


def _subschemas(node: Any):
    """Every schema below `node` (not `node` itself)."""
    if not isinstance(node, dict):
        return
    children = [*node.get("properties", {}).values(), *node.get("anyOf", [])]
    children += [node[k] for k in ("items", "additionalProperties") if isinstance(node.get(k), dict)]
    for child in children:
        yield child
        yield from _subschemas(child)


def _def_name(canonical: str) -> str:
    return "s" + hashlib.sha256(canonical.encode()).hexdigest()[:12]


def dedup(roots: dict[str, dict]) -> tuple[dict[str, dict], dict]:
    """Move subschemas that occur more than once into common.json's $defs.

    Candidates are subschemas of at least SHARED_MIN_BYTES seen twice or more anywhere; each file and each
    def then refers to the outermost candidates below it. A candidate that ends up referred to from only one
    place (it is only ever inside one larger shared part) is put back inline.
    """
    seen: dict[str, int] = {}
    for root in roots.values():
        for sub in _subschemas(root):
            text = _canonical(sub)
            if len(text) >= SHARED_MIN_BYTES:
                seen[text] = seen.get(text, 0) + 1
    shared = {text for text, count in seen.items() if count > 1}

    while True:
        refs: dict[str, int] = {}
        bodies = {text: _replace(json.loads(text), shared, refs, top=True) for text in shared}
        files = {name: _replace(root, shared, refs, top=True) for name, root in roots.items()}
        once = {text for text in shared if refs.get(text, 0) < 2}
        if not once:
            break
        shared -= once
    defs = {_def_name(text): _relink(body, "#/$defs/") for text, body in bodies.items()}
    out = {name: _relink(schema, "../common.json#/$defs/") for name, schema in files.items()}
    common = {"$defs": defs, "$id": f"{BASE_ID}common.json", "$schema": DRAFT}
    return out, common


def _replace(node: dict, shared: set[str], refs: dict[str, int], top: bool = False) -> dict:
    """`node` with each shared subschema below it (or itself, unless `top`) as a placeholder reference."""
    text = _canonical(node)
    if not top and text in shared:
        refs[text] = refs.get(text, 0) + 1
        return {"$ref": text}
    out = dict(node)
    if "properties" in node:
        out["properties"] = {k: _replace(v, shared, refs) for k, v in node["properties"].items()}
    if "anyOf" in node:
        out["anyOf"] = [_replace(v, shared, refs) for v in node["anyOf"]]
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            out[key] = _replace(node[key], shared, refs)
    return out


def _relink(node: Any, prefix: str) -> Any:
    """Placeholder references (the canonical text) turned into `prefix` + the def's name."""
    if isinstance(node, dict):
        if set(node) == {"$ref"}:
            return {"$ref": prefix + _def_name(node["$ref"])}
        return {k: _relink(v, prefix) for k, v in node.items()}
    if isinstance(node, list):
        return [_relink(v, prefix) for v in node]
    return node


def readme() -> str:
    rows = "\n".join(f"| {s.file} | {s.version} | {s.module}@{s.module_version} | "
                     + (f"{s.package} (controller-gen `{CONTROLLER_GEN_OPTIONS}`) |" if s.package else f"{s.path} |")
                     for s in SOURCES)
    return f"""# CRD schemas for `eks-dra plan`

Generated by `python -m eks_dra.planner.crds.generate` (needs Go; do not edit these files by hand): the
`openAPIV3Schema` of one version of each CRD below, read from the project's released Go module (Apache-2.0) as
`go mod download` fetches it, turned into JSON Schema 2020-12 for `crd_schema.py`. Kept: types, properties,
items, required, enums and value limits; left out: descriptions, defaults, formats, CEL rules
(x-kubernetes-validations) and `status`. `x-kubernetes-int-or-string` is integer-or-string, `nullable` a null
type, and every object with properties that is not x-kubernetes-preserve-unknown-fields has
`additionalProperties: false` (unknown fields are refused, as with kubectl's strict field validation).
Subschemas of at least {SHARED_MIN_BYTES} bytes that occur more than once (pod templates, containers, affinity)
are stored once in `common.json` and referenced as `../common.json#/$defs/s<sha256 prefix of the subschema>`.
A row whose path is a Go package had its CRD YAML made by controller-gen, at the version and with the module
pinned in `controller-gen/go.mod`, over that package (as the project's Makefile makes its release's CRD).

| file | version | Go module | path or package in the module |
| --- | --- | --- | --- |
{rows}
"""


def generate() -> dict[str, str]:
    """Every file of the schema folder, relative path -> text."""
    dirs: dict[tuple[str, str], Path] = {}
    roots = {}
    with tempfile.TemporaryDirectory(prefix="eks-dra-crds-") as made:
        for source in SOURCES:
            key = (source.module, source.module_version, source.package)
            if key not in dirs:
                dirs[key] = (controller_gen(source, Path(made) / source.package) if source.package
                             else module_dir(source.module, source.module_version))
            roots[source.file] = object_schema(source, crd_schema(source, dirs[key] / source.path))
    files, common = dedup(roots)
    texts = {name: _canonical(schema) + "\n" for name, schema in files.items()}
    texts["common.json"] = _canonical(common) + "\n"
    texts["README.md"] = readme()
    return texts


def write(out: Path, texts: dict[str, str]) -> None:
    """Replace the generated files in `out`: a schema of the groups in SOURCES no longer generated is removed."""
    for group in {source.group for source in SOURCES}:
        for old in (out / group).glob("*.json"):
            old.unlink()
    for name, text in texts.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eks_dra.planner.crds.generate",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        texts = generate()
    except GenerateError as exc:
        print(f"generate: {exc}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    write(args.out, texts)
    print(f"generate: wrote {len(texts)} files to {args.out} ({sum(map(len, texts.values()))} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
