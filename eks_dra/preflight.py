"""`eks-dra preflight -c env=NAME`: ask the AWS account whether an environment can be deployed as written.

Checks, one table line each: the caller's account (when the config names one); every node group's instance
type is offered in its availability zone; every reservation exists, is active, is in the group's AZ and is
for its instance type (and of the right kind: Capacity Block or ODCR); the On-Demand vCPU quotas of the P, G,
Trn, Inf and Standard families cover the node groups' max sizes; EKS offers the Kubernetes version (and until
when), and an existing cluster of that name is at most one minor older (EKS upgrades one minor at a time).
Uses boto3's standard credential chain.
Exit 0 when nothing failed, 1 when a check failed, 2 on bad input or missing credentials.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eks_dra.catalog import SYSTEM_INSTANCE_TYPES
from eks_dra.config import EnvironmentConfig, NodeGroupConfig, load_environment
from eks_dra.errors import UserError
from eks_dra.versions import VERSIONS, check_upgrade, utc_today

OK, WARN, FAIL = "ok", "warn", "FAIL"

# On-Demand vCPU quota names (service code ec2), by EC2 category; codes differ by partition, names do not.
QUOTA_NAMES = {
    "P": "Running On-Demand P instances",
    "G": "Running On-Demand G and VT instances",
    "Trn": "Running On-Demand Trn instances",
    "Inf": "Running On-Demand Inf instances",
    "Standard": "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances",
}
QUOTA_CODES = {"P": "L-417A185B", "G": "L-DB2E81BA", "Trn": "L-2C3B7624", "Inf": "L-1945791B",
               "Standard": "L-1216C47A"}


@dataclass(frozen=True)
class CheckResult:
    check: str  # "account", "offering", "reservation", "quota", "kubernetes", "addon", "upgrade"
    subject: str  # node group, reservation id or quota category
    status: str  # ok | warn | FAIL
    detail: str


@dataclass
class Clients:
    ec2: Any
    service_quotas: Any
    sts: Any | None = None
    eks: Any | None = None


# --- checks ---

def check_account(sts: Any, env: EnvironmentConfig) -> list[CheckResult]:
    if env.account is None:
        return []
    actual = sts.get_caller_identity()["Account"]
    if actual == env.account:
        return [CheckResult("account", env.account, OK, "credentials belong to the configured account")]
    return [CheckResult("account", env.account, FAIL,
                        f"credentials belong to {actual}; use a profile for {env.account} (AWS_PROFILE)")]


def check_offerings(ec2: Any, groups: tuple[NodeGroupConfig, ...]) -> list[CheckResult]:
    results = []
    for group in groups:
        pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [group.instance_type]}])
        zones = sorted({o["Location"] for page in pages for o in page["InstanceTypeOfferings"]})
        subject = f"{group.name} ({group.instance_type})"
        if group.availability_zone:
            if group.availability_zone in zones:
                results.append(CheckResult("offering", subject, OK, f"offered in {group.availability_zone}"))
            else:
                where = f"offered in {', '.join(zones)}" if zones else "not offered in this region"
                results.append(CheckResult("offering", subject, FAIL, f"not offered in {group.availability_zone}; "
                                           f"{where}: change availabilityZone"))
        elif zones:
            needs_one_az = group.efa_enabled or group.capacity.reserved
            status = WARN if needs_one_az else OK
            hint = "; set availabilityZone (EFA groups use one AZ)" if needs_one_az else ""
            results.append(CheckResult("offering", subject, status, f"offered in {', '.join(zones)}{hint}"))
        else:
            results.append(CheckResult("offering", subject, FAIL, "not offered in any AZ of this region; "
                                       "pick another region or instance type"))
    return results


def check_reservations(ec2: Any, groups: tuple[NodeGroupConfig, ...]) -> list[CheckResult]:
    reserved = [g for g in groups if g.capacity.reserved]
    if not reserved:
        return []
    ids = sorted({g.capacity.reservation_id for g in reserved})
    found: dict[str, dict] = {}
    for rid in ids:  # one call per id: an unknown id fails the whole call
        try:
            response = ec2.describe_capacity_reservations(CapacityReservationIds=[rid])
        except Exception as exc:  # botocore ClientError: InvalidCapacityReservationId.NotFound / .Malformed
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
            if "NotFound" not in code and "Malformed" not in code:
                raise
            continue
        for reservation in response.get("CapacityReservations", []):
            found[reservation["CapacityReservationId"]] = reservation
    results = []
    for group in reserved:
        results.append(_reservation_result(group, found.get(group.capacity.reservation_id)))
    return results


def _reservation_result(group: NodeGroupConfig, reservation: dict | None) -> CheckResult:
    rid = group.capacity.reservation_id
    subject = f"{group.name} ({rid})"
    if reservation is None:
        return CheckResult("reservation", subject, FAIL, "no such capacity reservation in this account and region")
    problems, warnings = [], []
    if reservation["InstanceType"] != group.instance_type:
        problems.append(f"is for {reservation['InstanceType']}, not {group.instance_type}")
    az = reservation["AvailabilityZone"]
    if group.availability_zone is None:
        problems.append(f"is in {az}; set availabilityZone: {az}")
    elif az != group.availability_zone:
        problems.append(f"is in {az}, not {group.availability_zone}")
    is_block = reservation.get("ReservationType") == "capacity-block"
    if group.capacity.kind == "capacity-block" and not is_block:
        problems.append("is an On-Demand Capacity Reservation; write capacity: odcr:" + rid)
    if group.capacity.kind == "odcr" and is_block:
        problems.append("is a Capacity Block; write capacity: capacity-block:" + rid)
    state = reservation.get("State")
    if state == "scheduled" and is_block:
        warnings.append(f"starts {reservation.get('StartDate', 'later')}")
    elif state != "active":
        problems.append(f"is {state}, not active")
    total = reservation.get("TotalInstanceCount", 0)
    if group.max_size > total:
        warnings.append(f"holds {total} instances, maxSize is {group.max_size}")
    if problems:
        return CheckResult("reservation", subject, FAIL, "; ".join(problems + warnings))
    detail = f"{state}, {reservation['InstanceType']} in {az}, {total} instances"
    return CheckResult("reservation", subject, WARN if warnings else OK,
                       detail + ("; " + "; ".join(warnings) if warnings else ""))


def vcpus_needed(groups: tuple[NodeGroupConfig, ...]) -> dict[str, int]:
    """On-Demand vCPUs at max size per quota category; Capacity Blocks do not use On-Demand quota."""
    needed: dict[str, int] = defaultdict(int)
    for group in groups:
        if group.capacity.kind == "capacity-block":
            continue
        inst = group.instance
        if inst is not None:
            needed[inst.ec2_category] += inst.vcpus * group.max_size
        else:
            needed["Standard"] += SYSTEM_INSTANCE_TYPES[group.instance_type][1] * group.max_size
    return dict(needed)


def check_quotas(service_quotas: Any, groups: tuple[NodeGroupConfig, ...]) -> list[CheckResult]:
    results = []
    for category, needed in sorted(vcpus_needed(groups).items()):
        try:
            quota = service_quotas.get_service_quota(ServiceCode="ec2", QuotaCode=QUOTA_CODES[category])["Quota"]
        except Exception as exc:  # NoSuchResourceException, AccessDenied: report, do not guess
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
            results.append(CheckResult("quota", category, WARN, f"cannot read {QUOTA_NAMES[category]!r} ({code})"))
            continue
        value = int(quota["Value"])
        name = quota.get("QuotaName", QUOTA_NAMES[category])
        if needed <= value:
            results.append(CheckResult("quota", category, OK, f"{needed} vCPUs at max size <= {value} ({name})"))
        else:
            results.append(CheckResult("quota", category, FAIL, f"{needed} vCPUs at max size > {value} ({name}); "
                                       "request an increase in Service Quotas or lower maxSize"))
    return results


def _error_code(exc: Exception) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)


def _version_offered(eks: Any, version: str) -> CheckResult:
    try:
        offered = eks.describe_cluster_versions(clusterVersions=[version], includeAll=True)["clusterVersions"]
    except Exception as exc:  # AccessDenied and the like: report, do not guess
        return CheckResult("kubernetes", version, WARN, f"cannot read EKS DescribeClusterVersions ({_error_code(exc)})")
    row = next((v for v in offered if v.get("clusterVersion") == version), None)
    status = row and row.get("versionStatus", row.get("status"))
    if row is None or status == "UNSUPPORTED":
        return CheckResult("kubernetes", version, FAIL, "EKS does not offer this version in the region; "
                           "set kubernetesVersion to one DescribeClusterVersions lists")
    standard, extended = row.get("endOfStandardSupportDate"), row.get("endOfExtendedSupportDate")
    detail = f"offered ({status}"
    detail += f", patch {row['kubernetesPatchVersion']})" if row.get("kubernetesPatchVersion") else ")"
    if standard is not None:
        detail += f"; standard support until {standard.date().isoformat()}"
    if extended is not None:
        detail += f", extended support until {extended.date().isoformat()}"
    if status == "EXTENDED_SUPPORT" or (standard is not None and utc_today() >= standard.date()):
        return CheckResult("kubernetes", version, WARN, detail + "; extended support costs $0.60 per cluster-hour")
    return CheckResult("kubernetes", version, OK, detail)


def _addons_offered(eks: Any, version: str) -> list[CheckResult]:
    """The add-on versions the versions table pins, as EKS offers them for the Kubernetes version."""
    addons = VERSIONS[version].addons
    pinned = {"vpc-cni": addons.vpc_cni, "coredns": addons.coredns, "kube-proxy": addons.kube_proxy,
              "eks-pod-identity-agent": addons.pod_identity_agent}
    results = []
    for name, wanted in pinned.items():
        if wanted is None:  # EKS's default for the version
            continue
        try:
            found = eks.describe_addon_versions(addonName=name, kubernetesVersion=version)["addons"]
        except Exception as exc:
            results.append(CheckResult("addon", name, WARN, f"cannot read EKS DescribeAddonVersions ({_error_code(exc)})"))
            continue
        offered = [v["addonVersion"] for a in found for v in a.get("addonVersions", [])]
        if wanted in offered:
            results.append(CheckResult("addon", name, OK, f"{wanted} is offered for Kubernetes {version}"))
        else:
            newest = f"; EKS offers {', '.join(offered[:3])}" if offered else ""
            results.append(CheckResult("addon", name, FAIL, f"{wanted} is not offered for Kubernetes {version}{newest}: "
                                       "update the add-on versions in eks_dra/versions.py"))
    return results


def check_kubernetes_version(eks: Any, env: EnvironmentConfig) -> list[CheckResult]:
    """Whether EKS offers the environment's version (DescribeClusterVersions) and the add-on versions pinned for it
    (DescribeAddonVersions), and whether the existing cluster (DescribeCluster) can be changed to it in one update."""
    version = env.kubernetes_version
    results = [_version_offered(eks, version), *_addons_offered(eks, version)]
    try:
        cluster = eks.describe_cluster(name=env.cluster_name)["cluster"]
    except Exception as exc:  # botocore ClientError ResourceNotFoundException: a new cluster
        code = _error_code(exc)
        if code == "ResourceNotFoundException":
            return results + [CheckResult("upgrade", env.cluster_name, OK, f"no cluster yet: created at {version}")]
        return results + [CheckResult("upgrade", env.cluster_name, WARN, f"cannot read EKS DescribeCluster ({code})")]
    deployed = str(cluster["version"])
    reason = check_upgrade(deployed, version)
    if reason:
        results.append(CheckResult("upgrade", env.cluster_name, FAIL, reason))
    elif deployed == version:
        results.append(CheckResult("upgrade", env.cluster_name, OK, f"runs {deployed}: no version change"))
    else:
        results.append(CheckResult("upgrade", env.cluster_name, OK, f"runs {deployed}: deploy upgrades the control "
                                   f"plane to {version}, then the node groups' AMIs (README, Upgrades)"))
    return results


def run_checks(env: EnvironmentConfig, clients: Clients) -> list[CheckResult]:
    results: list[CheckResult] = []
    if clients.sts is not None:
        results += check_account(clients.sts, env)
    results += check_offerings(clients.ec2, env.node_groups)
    results += check_reservations(clients.ec2, env.node_groups)
    results += check_quotas(clients.service_quotas, env.node_groups)
    if clients.eks is not None:
        results += check_kubernetes_version(clients.eks, env)
    return results


def format_table(results: list[CheckResult]) -> str:
    rows = [("CHECK", "SUBJECT", "RESULT", "DETAIL")] + [(r.check, r.subject, r.status, r.detail) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + "  " + row[3]
                     for row in rows)


# --- command ---

def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE",
                        help="as for cdk: -c env=NAME picks config/NAME.yaml (default dev)")
    parser.add_argument("--config-dir", type=Path, default=Path("config"))
    parser.add_argument("--region", help="AWS region (default: the environment's region, then the AWS profile's)")
    parser.add_argument("--profile", help="AWS named profile (default: the standard credential chain)")
    parser.add_argument("--output", choices=("table", "json"), default="table")


def _context(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise UserError(f"-c {pair}: expected KEY=VALUE, e.g. -c env=dev")
        out[key] = value
    return out


def run(args: argparse.Namespace) -> int:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError

    env = load_environment(_context(args.context).get("env", "dev"), args.config_dir)
    try:
        session = boto3.Session(profile_name=args.profile, region_name=args.region or env.region)
        if session.region_name is None:
            raise UserError(f"{env.source}: no region: set region in the file, pass --region or set AWS_REGION")
        clients = Clients(ec2=session.client("ec2"), service_quotas=session.client("service-quotas"),
                          sts=session.client("sts"), eks=session.client("eks"))
        results = run_checks(env, clients)
    except (NoCredentialsError, NoRegionError) as exc:
        raise UserError(f"no usable AWS credentials or region ({exc}); configure the standard credential chain "
                        "(AWS_PROFILE, aws sso login, or instance credentials)") from None
    except (BotoCoreError, ClientError) as exc:
        raise UserError(f"AWS call failed: {exc}; check the credentials' permissions (ec2:Describe*, "
                        "servicequotas:GetServiceQuota, sts:GetCallerIdentity, eks:DescribeClusterVersions, "
                        "eks:DescribeAddonVersions, eks:DescribeCluster)") from None
    if args.output == "json":
        print(json.dumps({"environment": env.name, "region": session.region_name,
                          "checks": [asdict(r) for r in results]}, indent=2))
    else:
        print(f"eks-dra preflight: environment {env.name} in {session.region_name}")
        print(format_table(results))
    return 1 if any(r.status == FAIL for r in results) else 0
