"""The commands a new user and the pipeline run, from a clean copy of the repository in a plain shell.

"Clean copy": the files git tracks or would add (no cdk.out, dist or caches), copied with their timestamps, with
this checkout's built `.venv` and `node_modules` linked in as a warm CodeBuild cache would provide them (`make -q
deps` must hold, so nothing reinstalls into them). "Plain shell": PATH is /usr/local/bin:/usr/bin:/bin, no activated
virtualenv, no node_modules/.bin: `python3` is the system interpreter without aws_cdk, `node` the system one.
Every command stops where AWS credentials would be needed (synth); deploy, diff and destroy need an account.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_stacks import synth_environment

REPO = Path(__file__).resolve().parent.parent
PLAIN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8",
             "CDK_DISABLE_VERSION_CHECK": "1"}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    if not (REPO / ".venv" / ".installed").exists() or not (REPO / "node_modules" / ".installed").exists():
        pytest.skip("needs `make deps` in the checkout (the built .venv and node_modules are linked into the copy)")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    root = tmp_path_factory.mktemp("clone") / "eks-dra"
    for name in filter(None, files):
        source = REPO / name
        if source.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    for built in (".venv", "node_modules"):
        (root / built).symlink_to(REPO / built)
    up_to_date = subprocess.run(["make", "-q", "deps"], cwd=root, env=PLAIN_ENV, capture_output=True)
    assert up_to_date.returncode == 0, "`make deps` is not up to date in the checkout; run it first"
    assert subprocess.run(["python3", "-c", "import aws_cdk"], env=PLAIN_ENV, capture_output=True).returncode != 0, \
        "the plain shell's python3 must not have aws_cdk (else this test proves nothing)"
    return root


def run(clone: Path, command: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=clone, env=PLAIN_ENV, capture_output=True, text=True,
                          timeout=timeout)


def test_readme_deploy_path_up_to_synth(clone):
    proc = run(clone, "make synth ENV=dev")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = [line for line in proc.stdout.splitlines() if line.startswith("eks-dra: synthesized dev:")]
    assert summary and "cdk.out/EksDra-dev.template.json" in summary[0] and "dist/dev/" in summary[0]
    assert (clone / "dist/dev/samples").is_dir() and (clone / "cdk.out/EksDra-dev.template.json").is_file()
    # What the README's `npx cdk deploy -c env=dev` runs first: cdk.json's app, from a plain shell.
    proc = run(clone, "npx cdk synth -c env=dev --quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "feature flag" not in proc.stderr.lower() and "unconfigured" not in proc.stderr.lower(), proc.stderr


def test_failed_synth_keeps_the_last_good_output(clone):
    template = clone / "cdk.out/EksDra-dev.template.json"
    if not template.exists():
        assert run(clone, "make synth ENV=dev").returncode == 0
    before = template.stat().st_mtime_ns, sorted(p.name for p in (clone / "dist/dev").iterdir())
    config = clone / "config/dev.yaml"
    good = config.read_text()
    config.write_text(good + "nodeGroup: []\n")
    try:
        proc = run(clone, "make synth ENV=dev")
    finally:
        config.write_text(good)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("eks-dra: error:")]
    assert errors == ["eks-dra: error: config/dev.yaml: nodeGroup: unknown setting; did you mean 'nodeGroups'?"]
    assert (template.stat().st_mtime_ns, sorted(p.name for p in (clone / "dist/dev").iterdir())) == before


def test_pipeline_buildspec_runs_in_a_plain_shell(clone):
    """Exactly the commands of the synthesized synth step, in order, as CodeBuild runs them (each must pass)."""
    template = synth_environment("pipeline").templates["EksDraPipeline.template.json"]
    project = next(r for k, r in template["Resources"].items()
                   if r["Type"] == "AWS::CodeBuild::Project" and "Synth" in k)
    buildspec = json.loads(project["Properties"]["Source"]["BuildSpec"])
    assert "install" not in buildspec["phases"]  # everything comes from the repository's own Makefile
    commands = buildspec["phases"]["build"]["commands"]
    assert commands[:-1] == ["make synth ENV=staging", "make synth ENV=prod"]
    for command in commands:
        proc = run(clone, command)
        assert proc.returncode == 0, f"{command}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert (clone / buildspec["artifacts"]["base-directory"] / "EksDraPipeline.template.json").is_file()
    assert (clone / "dist/prod").is_dir() and not (clone / "dist/prod/samples").exists()  # prod: samples off
