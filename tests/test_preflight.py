"""`eks-dra preflight`: EC2 offerings and the caller's account from moto; capacity reservations and Service
Quotas through botocore's Stubber (moto implements neither DescribeCapacityReservations nor EC2 quotas)."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from eks_dra.config import load_environment
from eks_dra.preflight import (
    FAIL,
    OK,
    WARN,
    Clients,
    check_offerings,
    check_quotas,
    check_reservations,
    format_table,
    run_checks,
    vcpus_needed,
)

REGION = "us-east-2"


@pytest.fixture(autouse=True)
def fake_credentials(monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def env_from(tmp_path, body: str):
    (tmp_path / "t.yaml").write_text(textwrap.dedent(body))
    return load_environment("t", tmp_path)


BODY = """\
    account: "123456789012"
    region: us-east-2
    vpc: {availabilityZones: [us-east-2a, us-east-2b, us-east-2c]}
    nodeGroups:
      - {name: system, instanceType: m7i.xlarge, minSize: 2, desiredSize: 2, maxSize: 4}
      - {name: p5, instanceType: p5.48xlarge, availabilityZone: us-east-2a, maxSize: 2}
      - {name: trn2, instanceType: trn2.48xlarge, maxSize: 1}
      - {name: cb, instanceType: p5.48xlarge, availabilityZone: us-east-2b, maxSize: 2,
         capacity: 'capacity-block:cr-0123456789abcdef0'}
      - {name: odcr, instanceType: g6e.12xlarge, availabilityZone: us-east-2c, maxSize: 4,
         capacity: 'odcr:cr-0aaaaaaaaaaaaaaa1'}
"""


def quota_stub(client, values: dict[str, int]) -> Stubber:
    stubber = Stubber(client)
    for code, value in values.items():
        stubber.add_response("get_service_quota", {"Quota": {"QuotaCode": code, "QuotaName": f"quota {code}",
                                                            "Value": float(value)}},
                             {"ServiceCode": "ec2", "QuotaCode": code})
    return stubber


def reservation(rid, instance_type, az, kind="default", state="active", total=2):
    return {"CapacityReservationId": rid, "InstanceType": instance_type, "AvailabilityZone": az,
            "ReservationType": kind, "State": state, "TotalInstanceCount": total,
            "StartDate": datetime(2026, 12, 1, tzinfo=UTC)}


def test_vcpus_needed_skips_capacity_blocks(tmp_path):
    env = env_from(tmp_path, BODY)
    assert vcpus_needed(env.node_groups) == {"Standard": 16, "P": 384, "Trn": 192, "G": 192}


@mock_aws
def test_offerings_from_moto(tmp_path):
    env = env_from(tmp_path, BODY)
    results = check_offerings(boto3.client("ec2", region_name=REGION), env.node_groups)
    by_group = {r.subject.split()[0]: r for r in results}
    assert by_group["system"].status == OK
    assert by_group["p5"].status in (OK, FAIL)  # moto's offering data decides; the detail must name the AZ
    assert "us-east-2a" in by_group["p5"].detail
    # trn2 without an AZ: an EFA group must name one
    assert by_group["trn2"].status in (WARN, FAIL) and "availabilityZone" in by_group["trn2"].detail


@mock_aws
def test_offering_missing_in_the_chosen_az_fails(tmp_path):
    env = env_from(tmp_path, """\
        region: us-east-2
        vpc: {availabilityZones: [us-east-2z]}
        nodeGroups:
          - {name: system, instanceType: m7i.xlarge, availabilityZone: us-east-2z}
    """)
    [result] = check_offerings(boto3.client("ec2", region_name=REGION), env.node_groups)
    assert result.status == FAIL and "not offered in us-east-2z" in result.detail
    assert "change availabilityZone" in result.detail


def test_reservations_checked_for_state_az_type_and_kind(tmp_path):
    env = env_from(tmp_path, BODY)
    ec2 = boto3.client("ec2", region_name=REGION)
    with Stubber(ec2) as stub:
        stub.add_response("describe_capacity_reservations", {"CapacityReservations": [
            reservation("cr-0123456789abcdef0", "p5.48xlarge", "us-east-2b", "capacity-block", "scheduled")]},
            {"CapacityReservationIds": ["cr-0123456789abcdef0"]})
        stub.add_response("describe_capacity_reservations", {"CapacityReservations": [
            reservation("cr-0aaaaaaaaaaaaaaa1", "g6e.48xlarge", "us-east-2a", "default", "expired")]},
            {"CapacityReservationIds": ["cr-0aaaaaaaaaaaaaaa1"]})
        results = {r.subject.split()[0]: r for r in check_reservations(ec2, env.node_groups)}
    assert results["cb"].status == WARN and "starts 2026-12-01" in results["cb"].detail
    odcr = results["odcr"]
    assert odcr.status == FAIL
    for part in ("is for g6e.48xlarge, not g6e.12xlarge", "is in us-east-2a, not us-east-2c",
                 "is expired, not active", "holds 2 instances, maxSize is 4"):
        assert part in odcr.detail


def test_missing_reservation_and_wrong_kind(tmp_path):
    env = env_from(tmp_path, BODY)
    ec2 = boto3.client("ec2", region_name=REGION)
    with Stubber(ec2) as stub:
        stub.add_client_error("describe_capacity_reservations", "InvalidCapacityReservationId.NotFound",
                              expected_params={"CapacityReservationIds": ["cr-0123456789abcdef0"]})
        stub.add_response("describe_capacity_reservations", {"CapacityReservations": [
            reservation("cr-0aaaaaaaaaaaaaaa1", "g6e.12xlarge", "us-east-2c", "capacity-block", total=4)]},
            {"CapacityReservationIds": ["cr-0aaaaaaaaaaaaaaa1"]})
        results = {r.subject.split()[0]: r for r in check_reservations(ec2, env.node_groups)}
    assert results["cb"].status == FAIL and "no such capacity reservation" in results["cb"].detail
    assert results["odcr"].status == FAIL and "is a Capacity Block; write capacity: capacity-block:" in \
        results["odcr"].detail


def test_quotas(tmp_path):
    env = env_from(tmp_path, BODY)
    client = boto3.client("service-quotas", region_name=REGION)
    with quota_stub(client, {"L-DB2E81BA": 192, "L-417A185B": 192, "L-1216C47A": 1152, "L-2C3B7624": 0}):
        results = {r.subject: r for r in check_quotas(client, env.node_groups)}
    assert results["G"].status == OK and results["Standard"].status == OK
    assert results["P"].status == FAIL and "384 vCPUs at max size > 192" in results["P"].detail
    assert results["Trn"].status == FAIL and "request an increase" in results["Trn"].detail


@mock_aws
def test_full_run_with_moto_and_stubber_prints_one_line_per_check(tmp_path):
    env = env_from(tmp_path, """\
        account: "123456789012"
        region: us-east-2
        nodeGroups:
          - {name: system, instanceType: m7i.xlarge, maxSize: 2}
          - {name: g6, instanceType: g6.12xlarge, maxSize: 1, efa: off}
    """)
    quotas = boto3.client("service-quotas", region_name=REGION)
    with quota_stub(quotas, {"L-DB2E81BA": 64, "L-1216C47A": 64}):
        results = run_checks(env, Clients(ec2=boto3.client("ec2", region_name=REGION), service_quotas=quotas,
                                          sts=boto3.client("sts", region_name=REGION)))
    assert [r.check for r in results] == ["account", "offering", "offering", "quota", "quota"]
    assert results[0].status == OK  # moto's caller is account 123456789012
    table = format_table(results).splitlines()
    assert table[0].split()[:4] == ["CHECK", "SUBJECT", "RESULT", "DETAIL"] and len(table) == 1 + len(results)


@mock_aws
def test_cli_exit_codes(tmp_path, capsys):
    from eks_dra.cli import main

    (tmp_path / "other.yaml").write_text('account: "999999999999"\nregion: us-east-2\nnodeGroups:\n'
                                         '  - {name: system, instanceType: m7i.xlarge}\n')
    # quotas are not in moto for ec2: the quota line warns, the wrong account fails -> exit 1
    assert main(["preflight", "-c", "env=other", "--config-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "credentials belong to 123456789012" in out and "account" in out
    assert main(["preflight", "-c", "env=missing", "--config-dir", str(tmp_path)]) == 2
    assert "no such environment file" in capsys.readouterr().err


# --- the Kubernetes version: DescribeClusterVersions and DescribeCluster (botocore Stubber) ---

def _eks_stub(client, *, offered: list[dict], cluster_version: str | None, version: str = "1.34",
             addon_versions: tuple[str, ...] = ("v1.21.0-eksbuild.1", "v1.20.1-eksbuild.3")) -> Stubber:
    stubber = Stubber(client)
    stubber.add_response("describe_cluster_versions", {"clusterVersions": offered},
                         {"clusterVersions": [version], "includeAll": True})
    stubber.add_response("describe_addon_versions", {"addons": [{"addonName": "vpc-cni", "addonVersions": [
        {"addonVersion": v} for v in addon_versions]}]}, {"addonName": "vpc-cni", "kubernetesVersion": version})
    if cluster_version is None:
        stubber.add_client_error("describe_cluster", "ResourceNotFoundException", http_status_code=404,
                                 expected_params={"name": "eks-dra-t"})
    else:
        stubber.add_response("describe_cluster", {"cluster": {"name": "eks-dra-t", "version": cluster_version}},
                             {"name": "eks-dra-t"})
    return stubber


def _offered(version: str, status: str, standard: str, extended: str) -> dict:
    return {"clusterVersion": version, "versionStatus": status, "kubernetesPatchVersion": f"{version}.3",
            "endOfStandardSupportDate": datetime.fromisoformat(standard).replace(tzinfo=UTC),
            "endOfExtendedSupportDate": datetime.fromisoformat(extended).replace(tzinfo=UTC)}


def test_kubernetes_version_offered_until_and_upgrade_path(tmp_path):
    from eks_dra.preflight import check_kubernetes_version

    env = env_from(tmp_path, """\
        region: us-east-2
        kubernetesVersion: "1.36"
        nodeGroups:
          - {name: system, instanceType: m7i.xlarge}
    """)
    eks = boto3.client("eks", region_name=REGION)
    with _eks_stub(eks, version="1.36", cluster_version="1.35",
                   offered=[_offered("1.36", "STANDARD_SUPPORT", "2027-08-02", "2028-08-02")]):
        version, addon, upgrade = check_kubernetes_version(eks, env)
    assert (version.status, addon.status, upgrade.status) == (OK, OK, OK)
    assert addon.detail == "v1.20.1-eksbuild.3 is offered for Kubernetes 1.36"
    assert version.detail == ("offered (STANDARD_SUPPORT, patch 1.36.3); standard support until 2027-08-02, "
                              "extended support until 2028-08-02")
    assert upgrade.detail.startswith("runs 1.35: deploy upgrades the control plane to 1.36, then the node groups")
    # a two-minor jump is refused with the reason, before CloudFormation tries it
    with _eks_stub(eks, version="1.36", cluster_version="1.34",
                   offered=[_offered("1.36", "STANDARD_SUPPORT", "2027-08-02", "2028-08-02")]):
        _, _, upgrade = check_kubernetes_version(eks, env)
    assert upgrade.status == FAIL and "one minor version at a time" in upgrade.detail
    assert 'set kubernetesVersion: "1.35", deploy, then "1.36"' in upgrade.detail


def test_kubernetes_version_in_extended_support_or_not_offered(tmp_path):
    from eks_dra.preflight import check_kubernetes_version

    env = env_from(tmp_path, """\
        region: us-east-2
        kubernetesVersion: "1.33"
        nodeGroups:
          - {name: system, instanceType: m7i.xlarge}
    """)
    eks = boto3.client("eks", region_name=REGION)
    with _eks_stub(eks, version="1.33", cluster_version=None,
                   offered=[_offered("1.33", "EXTENDED_SUPPORT", "2026-07-29", "2027-07-29")]):
        version, _, new = check_kubernetes_version(eks, env)
    assert version.status == WARN and "standard support until 2026-07-29" in version.detail
    assert "$0.60 per cluster-hour" in version.detail
    assert (new.status, new.detail) == (OK, "no cluster yet: created at 1.33")
    with _eks_stub(eks, version="1.33", cluster_version=None, offered=[], addon_versions=("v1.21.0-eksbuild.1",)):
        version, addon, _ = check_kubernetes_version(eks, env)
    assert version.status == FAIL and "EKS does not offer this version" in version.detail
    assert addon.status == FAIL and addon.detail.startswith("v1.20.1-eksbuild.3 is not offered for Kubernetes 1.33; "
                                                            "EKS offers v1.21.0-eksbuild.1")
