"""`eks-dra catalog show|check|refresh`: the catalog's EC2-level fields against EC2 DescribeInstanceTypes.

`show` prints the embedded catalog (offline). `check` compares the EC2-level fields (architecture, vCPUs,
memory, accelerator name/count/memory, EFA support and count, network cards, max ENIs) with the live API and
exits 1 on drift. `refresh` prints the change to the catalog's EC2 rows as a unified diff; `--write` applies
it. PCIe/NUMA topology is not in the EC2 API and is never touched.
"""

from __future__ import annotations

import argparse
import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import INSTANCE_TYPES, InstanceType

DATA_MODULE = Path(__file__).with_name("instances.py")
EC2_FIELDS = ("architecture", "vcpus", "memory_mib", "accelerator_name", "accelerator_count",
              "accelerator_memory_mib", "efa_supported", "max_efa_interfaces", "network_cards",
              "max_network_interfaces")


@dataclass(frozen=True)
class Difference:
    instance_type: str
    field: str
    catalog: Any
    live: Any

    def __str__(self) -> str:
        return f"{self.instance_type}: {self.field}: catalog {self.catalog!r}, EC2 {self.live!r}"


def catalog_fields(inst: InstanceType) -> dict[str, Any]:
    model = inst.gpu or inst.neuron
    return {
        "architecture": inst.architecture,
        "vcpus": inst.vcpus,
        "memory_mib": inst.memory_mib,
        "accelerator_name": model.ec2_name if model else None,
        "accelerator_count": inst.accelerator_count,
        "accelerator_memory_mib": model.memory_mib if model else None,
        "efa_supported": inst.efa_supported,
        "max_efa_interfaces": inst.max_efa_interfaces,
        "network_cards": inst.network_cards,
        "max_network_interfaces": inst.max_network_interfaces,
    }


def describe_fields(info: dict) -> dict[str, Any]:
    """The same fields from one DescribeInstanceTypes entry."""
    devices = (info.get("GpuInfo") or {}).get("Gpus") or (info.get("NeuronInfo") or {}).get("NeuronDevices") or []
    device = devices[0] if devices else {}
    net = info.get("NetworkInfo", {})
    archs = info.get("ProcessorInfo", {}).get("SupportedArchitectures", [])
    return {
        "architecture": "arm64" if "arm64" in archs else (archs[0] if archs else None),
        "vcpus": info.get("VCpuInfo", {}).get("DefaultVCpus"),
        "memory_mib": info.get("MemoryInfo", {}).get("SizeInMiB"),
        "accelerator_name": device.get("Name"),
        "accelerator_count": sum(d.get("Count", 0) for d in devices),
        "accelerator_memory_mib": device.get("MemoryInfo", {}).get("SizeInMiB"),
        "efa_supported": bool(net.get("EfaSupported")),
        "max_efa_interfaces": (net.get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0),
        "network_cards": net.get("MaximumNetworkCards", 1),
        "max_network_interfaces": net.get("MaximumNetworkInterfaces"),
    }


def describe_instance_types(ec2: Any, names: list[str]) -> dict[str, dict]:
    """DescribeInstanceTypes for the names EC2 knows; unknown names are left out (not an error)."""
    found: dict[str, dict] = {}
    for start in range(0, len(names), 100):
        batch = names[start:start + 100]
        try:
            pages = ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=batch)
            for page in pages:
                found.update({i["InstanceType"]: i for i in page["InstanceTypes"]})
        except Exception as exc:  # InvalidInstanceType: one unknown name fails the batch; retry one by one
            if "InvalidInstanceType" not in str(exc):
                raise
            for name in batch:
                try:
                    found.update({i["InstanceType"]: i for i in
                                  ec2.describe_instance_types(InstanceTypes=[name])["InstanceTypes"]})
                except Exception as inner:
                    if "InvalidInstanceType" not in str(inner):
                        raise
    return found


def compare(live: dict[str, dict], types: dict[str, InstanceType] | None = None) -> tuple[list[Difference], list[str]]:
    """Differences per field, and the catalog types the live data lacks."""
    types = INSTANCE_TYPES if types is None else types
    differences, missing = [], []
    for name, inst in sorted(types.items()):
        if name not in live:
            missing.append(name)
            continue
        ours, theirs = catalog_fields(inst), describe_fields(live[name])
        differences += [Difference(name, f, ours[f], theirs[f]) for f in EC2_FIELDS if ours[f] != theirs[f]]
    return differences, missing


def refreshed_module(live: dict[str, dict], source: str) -> str:
    """The data module with each `_EC2` row rewritten from the live fields (model keys kept)."""
    row = re.compile(r'^(\s*)\("(?P<name>[^"]+)", "(?P<arch>[^"]+)", (?P<vcpus>\d+), (?P<mem>\d+), '
                     r'"(?P<model>[^"]+)", (?P<count>\d+), (?P<efa>True|False), (?P<max_efa>\d+), '
                     r'(?P<cards>\d+), (?P<enis>\d+)\),$')
    out = []
    for line in source.splitlines(keepends=True):
        m = row.match(line.rstrip("\n"))
        if m and m.group("name") in live:
            f = describe_fields(live[m.group("name")])
            line = (f'{m.group(1)}("{m.group("name")}", "{f["architecture"]}", {f["vcpus"]}, {f["memory_mib"]}, '
                    f'"{m.group("model")}", {f["accelerator_count"]}, {f["efa_supported"]}, '
                    f'{f["max_efa_interfaces"]}, {f["network_cards"]}, {f["max_network_interfaces"]}),\n')
        out.append(line)
    return "".join(out)


def refresh_patch(live: dict[str, dict], path: Path = DATA_MODULE) -> str:
    source = path.read_text()
    new = refreshed_module(live, source)
    name = f"eks_dra/catalog/{path.name}"
    return "".join(difflib.unified_diff(source.splitlines(keepends=True), new.splitlines(keepends=True),
                                        f"a/{name}", f"b/{name}"))


def format_catalog(types: dict[str, InstanceType]) -> str:
    header = ("TYPE", "ARCH", "VCPU", "MEM GiB", "ACCELERATOR", "EFA", "CARDS", "ENIS", "NUMA", "MIG")
    rows = [header]
    for name, inst in sorted(types.items()):
        model = inst.gpu or inst.neuron
        accel = f"{inst.accelerator_count}x {model.ec2_name} {model.memory_mib // 1024} GiB" if model else "-"
        rows.append((name, inst.architecture, str(inst.vcpus), str(inst.memory_mib // 1024), accel,
                     str(inst.max_efa_interfaces), str(inst.network_cards), str(inst.max_network_interfaces),
                     str(inst.numa_nodes), "yes" if inst.mig_capable else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows)


# --- command ---

def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="print the embedded catalog")
    show.add_argument("types", nargs="*", metavar="TYPE")
    for name, help_text in (("check", "compare the EC2 fields with DescribeInstanceTypes; exit 1 on drift"),
                            ("refresh", "print the catalog change as a diff (--write applies it)")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--region", default=None, help="AWS region (default: the profile's, then us-east-2)")
        p.add_argument("--profile", default=None)
        if name == "refresh":
            p.add_argument("--write", action="store_true", help=f"rewrite {DATA_MODULE.name} in place")


def run(args: argparse.Namespace) -> int:
    from eks_dra.errors import UserError

    if args.action == "show":
        unknown = [t for t in args.types if t not in INSTANCE_TYPES]
        if unknown:
            from . import UnknownInstanceType, get_instance_type

            try:
                get_instance_type(unknown[0])
            except UnknownInstanceType as exc:  # names the closest types
                raise UserError(f"{exc}; run `eks-dra catalog show` for the list") from None
        print(format_catalog({t: INSTANCE_TYPES[t] for t in args.types} if args.types else INSTANCE_TYPES))
        return 0
    live = _live(args, UserError)
    if args.action == "check":
        differences, missing = compare(live)
        for d in differences:
            print(d)
        for name in missing:
            print(f"{name}: not returned by DescribeInstanceTypes in this region")
        print(f"{len(INSTANCE_TYPES)} types, {len(differences)} differences, {len(missing)} not returned")
        return 1 if differences else 0
    patch = refresh_patch(live)
    print(patch or "# the catalog's EC2 rows match DescribeInstanceTypes", end="" if patch else "\n")
    if patch and args.write:
        DATA_MODULE.write_text(refreshed_module(live, DATA_MODULE.read_text()))
        print(f"# wrote {DATA_MODULE}; accelerator memory lives in the GPU/Neuron models and is not rewritten")
    return 0


def _live(args: argparse.Namespace, user_error: type[Exception]) -> dict[str, dict]:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    try:
        session = boto3.Session(profile_name=args.profile, region_name=args.region)
        ec2 = session.client("ec2", region_name=session.region_name or "us-east-2")
        return describe_instance_types(ec2, sorted(INSTANCE_TYPES))
    except NoCredentialsError:
        raise user_error("no AWS credentials: configure the standard credential chain (AWS_PROFILE, aws sso "
                         "login) to check the catalog against EC2") from None
    except (BotoCoreError, ClientError) as exc:
        raise user_error(f"DescribeInstanceTypes failed: {exc}") from None
