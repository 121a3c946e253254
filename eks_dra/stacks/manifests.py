"""One environment's Kubernetes side: the cdk8s charts, in dependency order, and their plain-YAML copies.

The only module of the charts that reads `EnvironmentConfig`; the charts get plain settings. Imports cdk8s
but not aws_cdk, so `write_manifests` stays cheap. The cluster stack adds `build_k8s_app(env).charts` with
`add_cdk8s_chart` in list order, and installs `upstream_helm_charts(env)` with `add_helm_chart`.
"""

from __future__ import annotations

from pathlib import Path

import cdk8s

from eks_dra.charts import labels
from eks_dra.charts.device_classes import DeviceClasses, DeviceClassesChart
from eks_dra.charts.device_plugins import DevicePluginsChart, DevicePluginSettings
from eks_dra.charts.driver_chart import (
    DEFAULT_IMAGE,
    DriverChart,
    DriverNodeGroup,
    DriverSettings,
    SystemNamespaceChart,
)
from eks_dra.charts.samples import NodeGroupDevices, SamplesChart
from eks_dra.charts.upstream import UNPINNABLE, UPSTREAM_CHARTS, HelmChartSpec, with_compute_domains
from eks_dra.config import EnvironmentConfig, NodeGroupConfig
from eks_dra.devices import FAMILIES, simulate_node
from eks_dra.errors import UserError
from eks_dra.versions import DRA_DEVICE_TAINTS, DRA_EXTENDED_RESOURCE, RESOURCE_HEALTH_STATUS, VERSIONS

MANIFEST_SUFFIX = ".k8s.yaml"
# Samples are written apart, so that `kubectl apply -f dist/<env>/` installs the drivers and classes only.
SAMPLES_DIR = "samples"
SAMPLES_CHART = "dra-samples"


def device_classes(env: EnvironmentConfig) -> DeviceClasses:
    return DeviceClasses(implementations={f: env.drivers.implementation(f) for f in FAMILIES},
                         names=env.drivers.names)


def node_group_devices(env: EnvironmentConfig) -> list[NodeGroupDevices]:
    """Accelerator node groups as the samples see them: managers per family and one node's devices."""
    out = []
    for group in env.node_groups:
        inst = group.instance
        if inst is None:
            continue
        simulated = simulate_node(inst, f"{group.name}-node", mig_profile=group.mig_profile)
        devices = {f: d for f, d in simulated.items() if f in group.families}  # no EFA devices when efa is off
        out.append(NodeGroupDevices(
            name=group.name, instance_type=group.instance_type,
            managers={f: group.manager(f) for f in group.families}, devices=devices,
            mig_profile=group.mig_profile,
            neuron_core_version=inst.neuron.core_version if inst.neuron else None,
        ))
    return out


def _dra_device_kinds(groups: list[NodeGroupDevices]) -> tuple[str, ...]:
    """Device kinds some DRA node group publishes: gpu (whole GPUs), mig, efa, neuron."""
    kinds = set()
    for g in groups:
        if g.dra("gpu"):
            kinds |= {"gpu"} if g.full_gpus() else set()
            kinds |= {"mig"} if g.migs() else set()
        kinds |= {f for f in ("efa", "neuron") if g.dra(f) and g.devices.get(f)}
    return tuple(k for k in ("gpu", "mig", "efa", "neuron") if k in kinds)


def user_taints(group: NodeGroupConfig) -> tuple[tuple[str, str, str], ...]:
    """The group's own taints (config nodeGroups[].taints) as (key, value, effect), for the drivers to tolerate."""
    return tuple((t.key, t.value, t.effect) for t in group.taints)


def driver_node_groups(env: EnvironmentConfig, family: str) -> tuple[DriverNodeGroup, ...]:
    """The family's DRA node groups as the driver chart places its DaemonSets on them."""
    return tuple(DriverNodeGroup(name=g.name, selinux_enforcing=g.ami_family == "bottlerocket", taints=user_taints(g))
                 for g in env.dra_node_groups(family))


def _families(env: EnvironmentConfig, manager: str) -> tuple[str, ...]:
    groups = env.dra_node_groups if manager == labels.MANAGER_DRA else env.device_plugin_node_groups
    return tuple(f for f in FAMILIES if groups(f))


def build_k8s_app(env: EnvironmentConfig, image: str | None = None, *, outdir: Path | None = None,
                  drivers: bool = True) -> cdk8s.App:
    """The environment's charts: system namespace, one driver per DRA family served by eks-dra, DeviceClasses,
    device plugins, samples when `env.samples` (`app.charts` lists them in this, the apply, order).
    drivers=False leaves out the eks-dra driver charts (plain manifests without a real image reference)."""
    app = cdk8s.App(outdir=str(outdir) if outdir else None, output_file_extension=MANIFEST_SUFFIX,
                    yaml_output_type=cdk8s.YamlOutputType.FILE_PER_CHART)
    classes = device_classes(env)
    release = VERSIONS[env.kubernetes_version]
    dra_families = _families(env, labels.MANAGER_DRA)
    ours = tuple(f for f in dra_families if not classes.upstream(f))
    image = image or env.driver_image or DEFAULT_IMAGE
    # The node groups carry one readiness taint per DRA family, named after the configured driver name.
    readiness = tuple(labels.readiness_taint_key(env.drivers.names.for_family(f)) for f in dra_families)

    order: list[cdk8s.Chart] = []
    if ours and drivers:
        order.append(SystemNamespaceChart(app, "eks-dra-system"))
        for family in ours:
            order.append(DriverChart(app, f"eks-dra-driver-{family}", settings=DriverSettings(
                family=family, driver_name=classes.driver(family), image=image,
                other_readiness_taints=readiness,
                node_groups=driver_node_groups(env, family),
                device_taints=release.gate(DRA_DEVICE_TAINTS), dra_health=release.gate(RESOURCE_HEALTH_STATUS))))
    groups = node_group_devices(env)
    extended_resources = release.gate(DRA_EXTENDED_RESOURCE)
    definitions = classes.owned(_dra_device_kinds(groups), extended_resources=extended_resources)
    if definitions:
        order.append(DeviceClassesChart(app, "eks-dra-device-classes", definitions=definitions))
    plugin_families = _families(env, labels.MANAGER_DEVICE_PLUGIN)
    if plugin_families:
        order.append(DevicePluginsChart(app, "eks-dra-device-plugins", settings=DevicePluginSettings(
            families=plugin_families,
            gpu_nodes_use_efa=any(g.efa_enabled for g in env.device_plugin_node_groups("gpu")),
            region=env.region or "us-west-2", readiness_taints=readiness)))
    if env.samples:
        order.append(SamplesChart(app, SAMPLES_CHART, groups=groups, classes=classes,
                                  compute_domains=env.compute_domains, extended_resources=extended_resources))
    for before, after in zip(order, order[1:], strict=False):
        after.add_dependency(before)
    return app


def write_manifests(env: EnvironmentConfig, out_dir: Path, image: str | None = None, *,
                    drivers: bool = True) -> list[Path]:
    """Write dist/<env>/NNNN-<chart>.k8s.yaml (apply order = file order) and the samples to dist/<env>/samples/;
    stale manifests are removed. Returns every file written."""
    out_dir = Path(out_dir)
    samples_dir = out_dir / SAMPLES_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in (*out_dir.glob(f"*{MANIFEST_SUFFIX}"), *samples_dir.glob(f"*{MANIFEST_SUFFIX}")):
        stale.unlink()
    build_k8s_app(env, image, outdir=out_dir, drivers=drivers).synth()
    for path in out_dir.glob(f"*-{SAMPLES_CHART}{MANIFEST_SUFFIX}"):
        samples_dir.mkdir(exist_ok=True)
        path.rename(samples_dir / path.name)
    if samples_dir.is_dir() and not any(samples_dir.iterdir()):
        samples_dir.rmdir()
    return sorted(out_dir.glob(f"*{MANIFEST_SUFFIX}")) + sorted(samples_dir.glob(f"*{MANIFEST_SUFFIX}"))


def needs_driver_image(env: EnvironmentConfig) -> bool:
    """Whether the environment runs eks-dra's own drivers (and so needs an image reference)."""
    return any(env.dra_node_groups(f) and env.drivers.implementation(f) == "python" for f in FAMILIES)


def upstream_helm_charts(env: EnvironmentConfig) -> list[HelmChartSpec]:
    """Vendor driver charts for the DRA families the environment serves with `drivers: <family>: upstream`."""
    specs = []
    for family in _families(env, labels.MANAGER_DRA):
        if env.drivers.implementation(family) != "upstream":
            continue
        plugin_groups = env.device_plugin_node_groups(family)
        if family in UNPINNABLE and plugin_groups:
            raise UserError(
                f"{env.source}: drivers.{family}: upstream cannot be combined with node group "
                f"{plugin_groups[0].name!r} in device-plugin mode for {family}: the vendor chart's DaemonSet cannot "
                f"be pinned to DRA node groups and would hand out the same devices as the device plugin; use "
                f"drivers.{family}: python, or deviceMode: dra for that group")
        taints = tuple(dict.fromkeys(t for g in env.dra_node_groups(family) for t in user_taints(g)))
        spec = UPSTREAM_CHARTS[family](taints)
        specs.append(with_compute_domains(spec) if family == "gpu" and env.compute_domains else spec)
    return specs
