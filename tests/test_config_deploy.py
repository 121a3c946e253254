"""Config keys of the first deploy (API endpoint, retention, samples, IMDS) and the config mistakes that
used to escape as tracebacks or silence; each is one line naming the file and field, and exit code 2."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eks_dra.config import load_environment, load_pipeline

CONFIG = Path(__file__).resolve().parent.parent / "config"
SYSTEM = "  - {name: system, instanceType: m7i.xlarge}\n"
EKS_DRA = Path(sys.executable).parent / "eks-dra"


def write(tmp_path: Path, body: str, name: str = "bad") -> Path:
    (tmp_path / f"{name}.yaml").write_text(textwrap.dedent(body))
    return tmp_path


def cli_error(tmp_path: Path, body: str) -> str:
    """Load the file the way the commands do (`eks-dra plan -c env=...`): exit 2 and one line on stderr."""
    write(tmp_path, body)
    proc = subprocess.run([str(EKS_DRA), "plan", "-c", "env=bad", "--config-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{tmp_path}/bad.yaml" in lines[0]
    return lines[0]


def test_shipped_defaults():
    dev, prod = load_environment("dev", CONFIG), load_environment("prod", CONFIG)
    assert dev.endpoint_public and dev.samples and dev.log_retention_days == 30
    assert prod.protected and not prod.endpoint_public and not prod.samples and prod.log_retention_days == 365
    assert dev.access_warning and "clusterAdminRoleArns" in dev.access_warning and prod.access_warning is None


def test_protected_public_endpoint_needs_cidrs(tmp_path):
    line = cli_error(tmp_path, "region: us-east-2\nprotected: true\napiEndpoint: {public: true}\nnodeGroups:\n" + SYSTEM)
    assert "apiEndpoint:" in line and "publicAccessCidrs" in line
    line = cli_error(tmp_path, "region: us-east-2\nprotected: true\napiEndpoint: {publicAccessCidrs: [0.0.0.0/0]}\n"
                               "nodeGroups:\n" + SYSTEM)
    assert "apiEndpoint:" in line


def test_endpoint_cidrs_and_retention(tmp_path):
    env = load_environment("bad", write(tmp_path, "region: us-east-2\nprotected: true\nlogRetentionDays: 90\n"
                                        "apiEndpoint: {publicAccessCidrs: [203.0.113.0/24]}\nnodeGroups:\n" + SYSTEM))
    assert env.endpoint_public and env.endpoint_public_cidrs == ("203.0.113.0/24",) and env.log_retention_days == 90
    assert "publicAccessCidrs[0]" in cli_error(
        tmp_path, "region: us-east-2\napiEndpoint: {publicAccessCidrs: [203.0.113.0]}\nnodeGroups:\n" + SYSTEM)
    line = cli_error(tmp_path, "region: us-east-2\nlogRetentionDays: 31\nnodeGroups:\n" + SYSTEM)
    assert "logRetentionDays" in line and "closest: 30" in line
    assert "did you mean 'publicAccessCidrs'" in cli_error(
        tmp_path, "region: us-east-2\napiEndpoint: {publicAccessCidr: [203.0.113.0/24]}\nnodeGroups:\n" + SYSTEM)


def test_imds_hop_limit(tmp_path):
    line = cli_error(tmp_path, "region: us-east-2\nnodeGroups:\n  - {name: system, instanceType: m7i.xlarge, "
                               "imdsHopLimit: 3}\n")
    assert "nodeGroups[0].imdsHopLimit" in line


def test_node_group_az_outside_the_vpc(tmp_path):
    """A new VPC without written-down AZs spans two AZs chosen at deploy: a named AZ was a traceback."""
    line = cli_error(tmp_path, "region: us-east-2\nnodeGroups:\n" + SYSTEM +
                     "  - {name: gpu, instanceType: g6e.12xlarge, availabilityZone: us-east-2c}\n")
    assert "nodeGroups[1].availabilityZone" in line and "vpc.availabilityZones" in line
    line = cli_error(tmp_path, "account: '123456789012'\nregion: us-east-2\nnodeGroups:\n" + SYSTEM +
                     "  - {name: gpu, instanceType: g6e.12xlarge, availabilityZone: us-east-2c}\n")
    assert "us-east-2a, us-east-2b" in line


def test_duplicate_yaml_keys(tmp_path):
    line = cli_error(tmp_path, "region: us-east-2\nnodeGroups:\n  - name: system\n    instanceType: m7i.xlarge\n"
                               "    maxSize: 2\n    maxSize: 3\n")
    assert "line 6" in line and "duplicate key 'maxSize' (also on line 5)" in line


def test_min_size_above_max_size_names_min_size(tmp_path):
    line = cli_error(tmp_path, "region: us-east-2\nnodeGroups:\n  - {name: system, instanceType: m7i.xlarge, "
                               "minSize: 3, maxSize: 2}\n")
    assert "nodeGroups[0].minSize" in line and "desiredSize" not in line


def test_pipeline_refuses_environments_out_of_deploy_order(tmp_path):
    for name in ("staging", "prod"):
        (tmp_path / f"{name}.yaml").write_text((CONFIG / f"{name}.yaml").read_text())
    pipeline = (CONFIG / "pipeline.yaml").read_text().replace("[staging, prod]", "[prod, staging]")
    (tmp_path / "pipeline.yaml").write_text(pipeline)
    from eks_dra.errors import UserError

    with pytest.raises(UserError, match=r"pipeline.yaml: environments: prod \(protected\) is listed before staging"):
        load_pipeline(tmp_path)
    assert [e.name for e in load_pipeline(CONFIG).environments] == ["staging", "prod"]


def test_protected_environment_runs_the_driver_image_by_digest(tmp_path):
    """A tag (`:latest`, or any other) can be moved to other content; a protected environment pins the digest."""
    top = "region: us-east-2\nprotected: true\nnodeGroups:\n" + SYSTEM
    for image in ("eks-dra-driver:latest", "123456789012.dkr.ecr.us-east-2.amazonaws.com/eks-dra:0.1.0",
                  "eks-dra-driver@sha256:abc"):
        line = cli_error(tmp_path, f"driverImage: {image}\n" + top)
        assert f"{tmp_path}/bad.yaml: driverImage: '{image}'" in line and "@sha256:" in line
    digest = "123456789012.dkr.ecr.us-east-2.amazonaws.com/eks-dra@sha256:" + "0f" * 32
    assert load_environment("bad", write(tmp_path, f"driverImage: {digest}\n" + top)).driver_image == digest
    # unprotected: a tag is fine (a development loop rebuilds it)
    assert load_environment("bad", write(tmp_path, "driverImage: eks-dra-driver:latest\nregion: us-east-2\n"
                                         "nodeGroups:\n" + SYSTEM)).driver_image == "eks-dra-driver:latest"
