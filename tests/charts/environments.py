"""The environments the chart tests run on (shipped config/*.yaml plus tests/charts/envs/*.yaml), synthesized once."""

from __future__ import annotations

import dataclasses
import functools
import tempfile
from pathlib import Path

from eks_dra.config import EnvironmentConfig, load_environment
from eks_dra.devices import Device, simulate_node
from eks_dra.stacks.manifests import write_manifests

from .k8s_objects import load_documents

REPO = Path(__file__).resolve().parents[2]
SHIPPED_DIR = REPO / "config"
FIXTURE_DIR = Path(__file__).resolve().parent / "envs"
SHIPPED = sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml") if p.stem != "pipeline")
FIXTURES = sorted(p.stem for p in FIXTURE_DIR.glob("*.yaml"))
ALL = [f"config/{n}" for n in SHIPPED] + [f"fixture/{n}" for n in FIXTURES]
UPSTREAM_DRIVERS = {"gpu": "gpu.nvidia.com", "efa": "dra.net", "neuron": "neuron.aws.com"}
_OUT = Path(tempfile.mkdtemp(prefix="eks-dra-charts-"))


def environment(key: str) -> EnvironmentConfig:
    name = key.split("/", 1)[1]
    return load_environment(name, config_dir(key))


@functools.cache
def synthesized(key: str) -> tuple[tuple[Path, ...], tuple[dict, ...]]:
    """(manifest files, documents) of one environment; synthesized once per test session."""
    # With the samples on even where the environment turns them off (prod): their claims are what these tests check.
    paths = write_manifests(dataclasses.replace(environment(key), samples=True), dist_dir(key) / key.split("/", 1)[1])
    return tuple(paths), tuple(load_documents(paths))


def dist_dir(key: str) -> Path:
    """The `dist` folder holding `<env name>/*.k8s.yaml` of this environment (what `eks-dra plan` reads)."""
    return _OUT / key.split("/", 1)[0]


def config_dir(key: str) -> Path:
    return SHIPPED_DIR if key.startswith("config/") else FIXTURE_DIR


def driver_of(env: EnvironmentConfig, family: str) -> str:
    if env.drivers.implementation(family) == "upstream":
        return UPSTREAM_DRIVERS[family]
    return env.drivers.names.for_family(family)


def dra_devices(env: EnvironmentConfig) -> dict[str, list[tuple[str, Device]]]:
    """Per node group, (driver, device) for every device a DRA driver publishes on one of its nodes."""
    out: dict[str, list[tuple[str, Device]]] = {}
    for group in env.node_groups:
        if group.instance is None:
            continue
        simulated = simulate_node(group.instance, f"{group.name}-0", mig_profile=group.mig_profile)
        out[group.name] = [(driver_of(env, fam), d) for fam, devs in simulated.items()
                           if fam in group.families and group.manager(fam) == "dra" for d in devs]
    return out
