"""Every shipped environment (and the pipeline) passes cfn-lint for its region and cdk-nag AwsSolutions.

cfn-lint runs on the real templates with the environment's region (its per-region instance-type data rejects
trn2 in us-east-1/us-west-2); cdk-nag runs as app.py attaches it, and any unacknowledged finding fails synth.
"""

from __future__ import annotations

import pytest
from cfnlint.api import ManualArgs, lint_file
from test_stacks import CONFIG, SHIPPED, synth_environment

from eks_dra.config import load_environment, load_pipeline

APPS = (*SHIPPED, "pipeline")


def _regions(name: str) -> list[str]:
    if name == "pipeline":
        return [load_pipeline(CONFIG).region or "us-east-2"]
    return [load_environment(name, CONFIG).region or "us-east-2"]


@pytest.mark.parametrize("name", APPS)
def test_cdk_nag_has_no_unacknowledged_findings(name):
    synthesized = synth_environment(name)
    findings = []
    for report in (synthesized.nag_report or {}).get("pluginReports", []):
        for violation in report.get("violations", []):
            for resource in violation.get("violatingResources", []):
                findings.append(f"{violation['ruleName']} at {resource.get('locations') or resource}")
    assert synthesized.synth_error is None and not findings, "\n".join(findings) or synthesized.synth_error


@pytest.mark.parametrize("name", APPS)
def test_cfn_lint_has_no_errors(name):
    synthesized = synth_environment(name)
    assert synthesized.templates
    regions = _regions(name)
    for file_name in synthesized.templates:
        matches = _lint(synthesized.outdir / file_name, regions)
        errors = [m for m in matches if m.rule.id.startswith("E")]
        assert not errors, f"{file_name}:\n" + "\n".join(str(m) for m in errors)


def _lint(path, regions):
    return lint_file(path, config=ManualArgs(regions=regions))


def test_cfn_lint_catches_trn2_outside_supported_regions():
    """The lint is not vacuous: the same dev template fails for a region without trn2."""
    synthesized = synth_environment("dev")
    matches = _lint(synthesized.outdir / "EksDra-dev.template.json", ["us-west-2"])
    assert any(m.rule.id.startswith("E") and "trn2.48xlarge" in str(m) for m in matches)
