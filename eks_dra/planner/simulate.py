"""Simulated nodes: the devices our drivers publish, from the one device model (`eks_dra.devices`).

Devices are ordered as the allocator walks them: pools by (driver, pool name), then slice order, which
`resource_slices` makes device-name order. (kube-scheduler walks pools in map order, i.e. unordered; a
stable order keeps plans reproducible.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from eks_dra.catalog import UnknownInstanceType, get_instance_type
from eks_dra.devices import DEFAULT_DRIVER_NAMES, FAMILIES, AttributeValue, Device, DriverNames, Version, simulate_node
from eks_dra.devices.classes import DeviceClasses
from eks_dra.devices.device_plugins import advertised
from eks_dra.errors import UserError

if TYPE_CHECKING:
    from eks_dra.config import EnvironmentConfig

    from .model import PlanClaim

# Taints the drivers remove once their slices are published: not a placement constraint for the plan.
_READINESS_TAINT_SUFFIX = "/not-ready"


@dataclass(eq=False)
class SimDevice:
    index: int  # position on its node, the allocator's walk order
    driver: str
    pool: str
    name: str
    attributes: dict[str, AttributeValue]
    capacity: dict[str, str]
    # Fully qualified attribute name -> (type tag, value), for matchAttribute (bool is not int there).
    qualified: dict[str, tuple[str, object]]
    uid: int = 0  # unique in the plan (CEL context cache key)
    owner: PlanClaim | None = None  # exclusive allocation; admin access does not own
    taints: tuple[tuple[str, str, str], ...] = ()  # device taints (key, value, effect) of published slices

    def attribute(self, name: str) -> tuple[str, object] | None:
        return self.qualified.get(name)


@dataclass(eq=False)
class SimNode:
    name: str
    instance_type: str
    group: str | None
    mig_profile: str | None
    devices: list[SimDevice]
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[tuple[str, str, str], ...] = ()  # (key, value, effect)
    index: int = 0
    # Allocatable extended resources of the node's device plugins (nvidia.com/gpu: 4), for device-plugin groups.
    extended: dict[str, int] = field(default_factory=dict)
    # Nodes with equal layouts publish the same devices (up to names and ids) and advertise the same resources.
    layout: tuple = field(init=False)

    def __post_init__(self) -> None:
        self.layout = (self.instance_type, self.mig_profile, tuple(sorted({d.driver for d in self.devices})),
                       tuple(sorted(self.extended.items())))

    @property
    def kind(self) -> str:
        """How messages name this node's hardware: the instance type (and MIG profile)."""
        return f"{self.instance_type} (MIG {self.mig_profile})" if self.mig_profile else self.instance_type


def _tag(value: AttributeValue) -> tuple[str, object]:
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, Version):
        return ("version", value.value)
    return ("string", value)


def _qualified(driver: str, attributes: dict[str, AttributeValue]) -> dict[str, tuple[str, object]]:
    return {(key if "/" in key else f"{driver}/{key}"): _tag(v) for key, v in attributes.items()}


def simulate_plan_node(instance_type: str, node_name: str, *, names: DriverNames = DEFAULT_DRIVER_NAMES,
                       mig_profile: str | None = None, families: tuple[str, ...] | None = None,
                       group: str | None = None, labels: dict[str, str] | None = None,
                       taints: tuple[tuple[str, str, str], ...] = (),
                       device_plugin_families: tuple[str, ...] = ()) -> SimNode:
    """One node of an instance type; `families` limits the families published by DRA (None: all of them), the
    device plugins of `device_plugin_families` advertise their extended resources."""
    try:
        per_family = simulate_node(instance_type, node_name, mig_profile=mig_profile)
    except UnknownInstanceType as exc:
        raise UserError(str(exc)) from None
    except KeyError as exc:  # unknown MIG profile: the message names the known ones
        raise UserError(str(exc.args[0])) from None
    devices = [sim_device(names.for_family(family), node_name, d.name, d.attributes, d.capacity)
               for family, family_devices in per_family.items()
               if families is None or family in families
               for d in family_devices]
    node_labels = {"eks-dra.io/instance-type": instance_type, **(labels or {})}
    extended = advertised(get_instance_type(instance_type), device_plugin_families)
    return sim_node(node_name, instance_type, devices, group=group, mig_profile=mig_profile, labels=node_labels,
                    taints=taints, extended=extended)


def sim_device(driver: str, pool: str, name: str, attributes: dict[str, AttributeValue],
               capacity: dict[str, str] | None = None,
               taints: tuple[tuple[str, str, str], ...] = ()) -> SimDevice:
    return SimDevice(0, driver, pool, name, attributes, capacity or {}, _qualified(driver, attributes),
                     taints=taints)


def sim_node(name: str, instance_type: str, devices: list[SimDevice], *, group: str | None = None,
             mig_profile: str | None = None, labels: dict[str, str] | None = None,
             taints: tuple[tuple[str, str, str], ...] = (), extended: dict[str, int] | None = None) -> SimNode:
    """A node with its devices in the allocator's walk order (any device list: tests build their own) and the
    extended resources its device plugins advertise."""
    devices = sorted(devices, key=lambda d: (d.driver, d.pool, d.name))
    for i, d in enumerate(devices):
        d.index = i
    node_labels = {"kubernetes.io/hostname": name, "node.kubernetes.io/instance-type": instance_type,
                   **(labels or {})}
    return SimNode(name, instance_type, group, mig_profile, devices, node_labels, taints, extended=extended or {})


def number_nodes(nodes: list[SimNode]) -> list[SimNode]:
    uid = 0
    for i, node in enumerate(nodes):
        node.index = i
        for d in node.devices:
            d.uid = uid
            uid += 1
    return nodes


# The largest cluster Kubernetes is tested for (kubernetes.io/docs/setup/best-practices/cluster-large): also
# the budget of a simulation, whose memory grows with the node count.
MAX_NODES = 5000


def nodes_for_instance_type(instance_type: str, count: int, *, names: DriverNames = DEFAULT_DRIVER_NAMES,
                            mig_profile: str | None = None) -> list[SimNode]:
    """`count` nodes of one type, named <type>-<i>, with every device family published by DRA."""
    if count < 1:
        raise UserError(f"--nodes must be at least 1, got {count}")
    if count > MAX_NODES:
        raise UserError(f"--nodes {count} is more than a Kubernetes cluster supports ({MAX_NODES} nodes, the "
                        "scalability threshold of kubernetes.io/docs/setup/best-practices/cluster-large); plan on "
                        "fewer nodes")
    try:
        it = get_instance_type(instance_type)
    except UnknownInstanceType as exc:
        raise UserError(str(exc)) from None
    taints = _accelerator_taints(it.accelerator_kind)
    return number_nodes([simulate_plan_node(instance_type, f"{instance_type}-{i}", names=names,
                                            mig_profile=mig_profile, taints=taints) for i in range(count)])


def _accelerator_taints(kind: str | None) -> tuple[tuple[str, str, str], ...]:
    # Every eks-dra accelerator node group carries these taints (eks_dra/charts/labels.py).
    if kind == "gpu":
        return (("nvidia.com/gpu", "true", "NoSchedule"),)
    if kind == "neuron":
        return (("aws.amazon.com/neuron", "true", "NoSchedule"),)
    return ()


def nodes_for_environment(env: EnvironmentConfig) -> list[SimNode]:
    """max_size nodes (at least one) of every node group with an accelerator or EFA: its DRA-managed families
    publish devices (a family served by the vendor's driver publishes under the vendor's name the same
    vocabulary as ours), its device-plugin families advertise their extended resources. System groups, which
    have neither, are left out."""
    names = DeviceClasses({f: env.drivers.implementation(f) for f in FAMILIES}, env.drivers.names).driver_names()
    nodes: list[SimNode] = []
    for group in env.node_groups:
        if not group.families:
            continue
        families = tuple(f for f in group.families if group.manager(f) == "dra")
        plugins = tuple(f for f in group.families if group.manager(f) == "device-plugin")
        labels = env.node_labels(group)
        taints = tuple((t.key, t.value, t.effect) for t in env.node_taints(group)
                       if not t.key.endswith(_READINESS_TAINT_SUFFIX))
        for i in range(max(group.max_size, 1)):
            nodes.append(simulate_plan_node(group.instance_type, f"{group.name}-{i}", names=names,
                                            mig_profile=group.mig_profile, families=families, group=group.name,
                                            labels=labels, taints=taints, device_plugin_families=plugins))
    return number_nodes(nodes)


def nodes_from_slices(slices: list[tuple[dict, str]]) -> list[SimNode]:
    """Nodes from published ResourceSlices (e.g. `kubectl get resourceslices -o yaml` of a real cluster),
    one node per spec.nodeName in order of appearance; (object, where) pairs name the source in errors."""
    per_node: dict[str, list[SimDevice]] = {}
    for obj, where in slices:
        spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
        node_name, driver = spec.get("nodeName"), spec.get("driver")
        pool = (spec.get("pool") or {}).get("name")
        if not node_name:
            raise UserError(f"{where}: spec.nodeName: only node-local slices can be planned "
                            "(allNodes and nodeSelector pools are not supported)")
        if not isinstance(driver, str) or not isinstance(pool, str):
            raise UserError(f"{where}: spec.driver and spec.pool.name are required")
        devices = per_node.setdefault(node_name, [])
        for i, raw in enumerate(spec.get("devices") or []):
            try:
                device = Device.from_api(raw)
            except (KeyError, TypeError, ValueError, AttributeError):
                raise UserError(f"{where}: spec.devices[{i}]: not a valid device (name, attributes, capacity)") from None
            taints = tuple((t.get("key", ""), t.get("value", ""), t.get("effect", "")) for t in device.taints)
            devices.append(sim_device(driver, pool, device.name, device.attributes, device.capacity, taints))
    nodes = []
    for name, devices in per_node.items():
        # Published nodes may differ from each other: each is its own layout, named by itself in messages.
        node = sim_node(name, f"node {name}", devices)
        del node.labels["node.kubernetes.io/instance-type"]
        nodes.append(node)
    return number_nodes(nodes)
