"""`eks-dra plan`: allocate ResourceClaims offline on simulated nodes, before any node exists.

    eks-dra plan --instance-type p5.48xlarge --nodes 2 --claims claims.yaml [--output json]
    eks-dra plan -c env=dev          # the environment's accelerator node groups and dist/dev/*.k8s.yaml
    eks-dra plan --slices slices.yaml --claims claims.yaml   # the nodes of published ResourceSlices
    helm template ... | eks-dra plan -c env=dev --claims -     # manifests on stdin, like kubectl -f -

Exit codes: 0 every claim allocated, 1 at least one is not (or a workload's pods could not be planned: a kind
the planner does not understand, unless --ignore-unknown), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from eks_dra.devices import FAMILIES
from eks_dra.devices.classes import DeviceClasses
from eks_dra.devices.names import COMPUTE_DOMAIN_CLASSES, COMPUTE_DOMAIN_DRIVER
from eks_dra.errors import UserError
from eks_dra.versions import DEFAULT_KUBERNETES_VERSION, DRA_EXTENDED_RESOURCE, VERSIONS

if TYPE_CHECKING:
    from eks_dra.config import EnvironmentConfig

from .cel_env import CelEnvironment
from .claims import STDIN, load_manifests, read_documents
from .fit_hint import EnvironmentHints, Replanner, gang_starts
from .options import driver_names
from .plan import Planner, PlanResult
from .report import Findings, to_json, to_table
from .simulate import nodes_for_environment, nodes_for_instance_type, nodes_from_slices


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--instance-type", help="simulate nodes of this instance type (e.g. p5.48xlarge)")
    parser.add_argument("--nodes", type=int, default=1, help="number of simulated nodes (default 1)")
    parser.add_argument("--claims", nargs="+", action="extend", type=Path, metavar="FILE",
                        help="YAML/JSON manifests: DeviceClasses, ResourceClaims, ResourceClaimTemplates, workloads "
                             "(- reads them from stdin)")
    parser.add_argument("--slices", nargs="+", action="extend", type=Path, metavar="FILE",
                        help="plan on the nodes of these ResourceSlices instead of simulated ones")
    parser.add_argument("--mig-profile", help="static MIG: every GPU split into this profile (e.g. 1g.10gb)")
    parser.add_argument("--output", "-o", choices=("table", "json"), default="table")
    parser.add_argument("--width", type=int, metavar="COLUMNS",
                        help="wrap the table's paragraphs at COLUMNS (default: the terminal's width on a terminal, "
                             "no wrapping otherwise; 0: no wrapping)")
    parser.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE",
                        help="env=NAME plans the environment's synthesized manifests (or --claims) on its accelerator "
                             "node groups, each simulated at its maxSize (at least one node): DRA-managed families "
                             "publish devices, device-plugin families advertise their extended resources; system "
                             "(non-accelerator) groups are left out. "
                             "A workload that does not fit gets the smallest single change that makes it fit "
                             "(a raised maxSize or a new node group), found by planning again")
    parser.add_argument("--config-dir", type=Path, default=Path("config"), help="environment configs (default config)")
    parser.add_argument("--dist-dir", type=Path, default=Path("dist"), help="synthesized manifests (default dist)")
    parser.add_argument("--kubernetes-version", metavar="MAJOR.MINOR", type=_kubernetes_version,
                        help=f"the scheduler to predict (default {DEFAULT_KUBERNETES_VERSION}; "
                             "with -c env=NAME the environment's)")
    parser.add_argument("--ignore-unknown", action="store_true",
                        help="exit 0 even when the files hold workload kinds the planner does not understand "
                             "(they are still reported; their pods are not planned)")
    parser.add_argument("--driver-name", action="append", default=[], metavar="FAMILY=NAME",
                        help="driver name of a device family (gpu, efa, neuron) if not the eks-dra default")


COMPUTE_DOMAIN_CONTROLLER = f"the NVIDIA ComputeDomain controller ({COMPUTE_DOMAIN_DRIVER})"


def _kubernetes_version(text: str) -> str:
    if text not in VERSIONS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a Kubernetes version eks-dra plans for; "
                                          f"use one of {', '.join(VERSIONS)}")
    return text


def _environment_name(contexts: list[str]) -> str | None:
    env = None
    for item in contexts:
        key, sep, value = item.partition("=")
        if not sep or not value:
            raise UserError(f"-c {item!r}: expected KEY=VALUE, e.g. -c env=dev")
        if key == "env":
            env = value
    return env


def environment_classes(environment) -> DeviceClasses:
    """Who serves each family of an environment (our driver or the vendor's) under which names."""
    return DeviceClasses({f: environment.drivers.implementation(f) for f in FAMILIES}, environment.drivers.names)


@dataclass
class PlanRun:
    """The plan, and what is needed to plan the same input again (for hints and gangs)."""

    result: PlanResult
    replanner: Replanner
    environment: EnvironmentConfig | None  # -c env=NAME


def build_plan(args: argparse.Namespace) -> PlanRun:
    env_name = _environment_name(args.context)
    environment = None
    if env_name is not None:
        if args.instance_type:
            raise UserError("give either --instance-type or -c env=NAME, not both")
        from eks_dra.config import load_environment

        environment = load_environment(env_name, args.config_dir)
        if args.kubernetes_version:
            raise UserError("--kubernetes-version comes from the environment with -c env=NAME (kubernetesVersion)")
        version = environment.kubernetes_version
        compute_domains = environment.compute_domains
        classes = environment_classes(environment)
        nodes = nodes_for_environment(environment)
        files = args.claims
        if not files:
            dist = args.dist_dir / env_name
            if not dist.is_dir():
                raise UserError(f"{dist} does not exist: run `make synth ENV={env_name}` first "
                                "(it writes the environment's manifests that the plan reads)")
            files = sorted(dist.glob("*.k8s.yaml")) + sorted(dist.glob("samples/*.k8s.yaml"))
            if not files:
                raise UserError(f"{dist} holds no *.k8s.yaml manifests: run `make synth ENV={env_name}`")
    else:
        if bool(args.instance_type) == bool(args.slices):
            raise UserError("give --instance-type T or --slices FILE... (with --claims FILE...), or -c env=NAME")
        if not args.claims:
            raise UserError("--claims FILE... is required with --instance-type and --slices")
        if STDIN in args.claims and STDIN in (args.slices or []):
            raise UserError("stdin (-) can be read once: give it to --claims or to --slices, not both")
        classes = DeviceClasses({}, driver_names(args.driver_name))
        version = args.kubernetes_version or DEFAULT_KUBERNETES_VERSION
        compute_domains = False
        if args.slices:
            nodes = nodes_from_slices([(d.obj, str(d.source(namespaced=False))) for d in read_documents(args.slices)
                                       if d.kind == "ResourceSlice"])
        else:
            nodes = nodes_for_instance_type(args.instance_type, args.nodes, names=classes.names,
                                            mig_profile=args.mig_profile)
        files = args.claims
    extended_resources = VERSIONS[version].gate(DRA_EXTENDED_RESOURCE)
    env = CelEnvironment()
    external = {c: COMPUTE_DOMAIN_CONTROLLER for c in COMPUTE_DOMAIN_CLASSES} if compute_domains else {}
    manifests = load_manifests(list(files), env, builtin_classes=tuple(classes.all(extended_resources)),
                               external_classes=external,
                               compute_domains=COMPUTE_DOMAIN_CONTROLLER if compute_domains else None,
                               extended_resources=extended_resources)
    ours = {classes.driver(f): f for f in FAMILIES if not classes.upstream(f)}
    replanner = Replanner(env, list(manifests.pods), ours, version)
    mapped = {d.extended_resource_name: d.name for d in classes.all(extended_resources=True) if d.extended_resource_name}
    result = Planner(env, nodes, config_drivers=ours, kubernetes_version=version, extended_resource_classes=mapped,
                     environment=environment is not None).run(manifests.pods)
    result.warnings.extend(manifests.skipped)
    result.warnings.extend(manifests.not_planned)
    result.warnings.extend(manifests.unknown)
    result.unplanned = manifests.not_planned + ([] if args.ignore_unknown else manifests.unknown)
    return PlanRun(result, replanner, environment)


def findings(plan: PlanRun) -> Findings:
    """Gangs' would-start counts, and in env mode the hints: each from plans of the same input (bounded in
    fit_hint.py)."""
    if plan.result.all_allocated:
        return Findings(None if plan.environment is None else {})
    starts = gang_starts(plan.replanner, plan.result)
    hints = None if plan.environment is None else \
        EnvironmentHints(plan.replanner, plan.environment).hints(plan.result)
    return Findings(hints, starts)


def _width(args: argparse.Namespace) -> int | None:
    if args.width is not None:
        if args.width < 0:
            raise UserError(f"--width {args.width}: give a number of columns, or 0 for no wrapping")
        return args.width or None
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def run(args: argparse.Namespace) -> int:
    width = _width(args)
    plan = build_plan(args)
    result = plan.result
    found = findings(plan)
    if args.output == "json":
        json.dump(to_json(result, found), sys.stdout, indent=2)
        sys.stdout.write("\n")
        for warning in result.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    else:
        print(to_table(result, found, width))
    return 0 if result.all_allocated else 1
