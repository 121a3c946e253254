"""`eks-dra slices`: the ResourceSlices our drivers publish on nodes of an instance type, as YAML."""

from __future__ import annotations

import argparse
import sys

import yaml

from eks_dra.catalog import UnknownInstanceType
from eks_dra.devices import resource_slices, simulate_node
from eks_dra.errors import UserError

from .options import driver_names


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--instance-type", required=True, help="e.g. p5.48xlarge")
    parser.add_argument("--node-name", help="node name (with --nodes N > 1: the prefix of <name>-<i>)")
    parser.add_argument("--nodes", type=int, default=1, help="number of nodes (default 1)")
    parser.add_argument("--mig-profile", help="static MIG: every GPU split into this profile")
    parser.add_argument("--driver-name", action="append", default=[], metavar="FAMILY=NAME",
                        help="driver name of a device family if not the eks-dra default")


def node_names(instance_type: str, count: int, node_name: str | None) -> list[str]:
    if count < 1:
        raise UserError(f"--nodes must be at least 1, got {count}")
    prefix = node_name or instance_type
    if node_name and count == 1:
        return [node_name]
    return [f"{prefix}-{i}" for i in range(count)]


def slices_for(instance_type: str, names: list[str], mig_profile: str | None, driver_overrides: list[str]) -> list[dict]:
    drivers = driver_names(driver_overrides)
    documents: list[dict] = []
    for name in names:
        try:
            per_family = simulate_node(instance_type, name, mig_profile=mig_profile)
        except UnknownInstanceType as exc:
            raise UserError(str(exc)) from None
        except KeyError as exc:  # unknown MIG profile; the message names the known ones
            raise UserError(str(exc.args[0])) from None
        for family, devices in per_family.items():
            documents.extend(resource_slices(drivers.for_family(family), name, devices))
    return documents


def run(args: argparse.Namespace) -> int:
    names = node_names(args.instance_type, args.nodes, args.node_name)
    yaml.safe_dump_all(slices_for(args.instance_type, names, args.mig_profile, args.driver_name), sys.stdout,
                       sort_keys=False)
    return 0
