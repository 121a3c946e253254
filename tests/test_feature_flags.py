"""cdk.json sets the feature flags the pinned aws-cdk-lib recommends (what `cdk init` writes), so synth reports no
unconfigured flags and the templates the tests read are the ones `cdk synth` writes."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import aws_cdk

REPO = Path(__file__).resolve().parent.parent


def recommended_flags() -> dict:
    """recommended-feature-flags.json of the installed aws-cdk-lib (inside its jsii assembly tarball)."""
    tarball = next((Path(aws_cdk.__file__).parent / "_jsii").glob("aws-cdk-lib@*.jsii.tgz"))
    with tarfile.open(tarball) as tar:
        return json.load(tar.extractfile("package/recommended-feature-flags.json"))


def test_cdk_json_sets_every_recommended_flag():
    context = json.loads((REPO / "cdk.json").read_text())["context"]
    flags = recommended_flags()
    assert len(flags) > 50
    missing = {k: v for k, v in flags.items() if context.get(k) != v}
    assert not missing, f"cdk.json lacks the recommended values of {sorted(missing)}"


def test_cdk_json_runs_the_projects_interpreter():
    """`npx cdk ...` from a plain shell: the system python3 has no aws_cdk."""
    app = json.loads((REPO / "cdk.json").read_text())["app"]
    assert app.split()[0] == ".venv/bin/python"
