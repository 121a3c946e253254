"""DeviceClasses as plain data: which driver serves each device family and what its classes select.

For a family served by eks-dra's driver the classes follow the environment's driver names (by default the
upstream names, so the classes are the upstream ones); for a family served by the vendor's driver
(`drivers: upstream`) the vendor's chart creates its classes and we only name them. The charts render the
classes of our drivers; the planner knows all of them, so a claim plans without being given its class.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import efa, gpu
from .device_plugins import FAMILY_RESOURCES
from .names import DEVICE_KINDS, FAMILIES, UPSTREAM_CLASSES, UPSTREAM_DRIVER_NAMES, DeviceKind, DriverNames

# Extended resources of the device plugins (reference eks-accelerators.md §3.2, §3.4, §3.6). Where the
# DRAExtendedResource gate is on (1.36+), our class of the family's whole devices carries the same name, so a
# pod with `nvidia.com/gpu: 1` in its limits is served by our DRA driver on a DRA node (an implicit claim).
EXTENDED_RESOURCES = {family: names[0] for family, names in FAMILY_RESOURCES.items()}


@dataclass(frozen=True)
class DeviceClassDefinition:
    name: str
    family: str
    expression: str  # the CEL selector
    extended_resource_name: str | None = None  # spec.extendedResourceName (DRAExtendedResource)


@dataclass(frozen=True)
class DeviceClasses:
    """Per family: the driver that publishes the devices (its name is the attribute domain) and class names."""

    implementations: dict[str, str]  # family -> "python" | "upstream"
    names: DriverNames

    def upstream(self, family: str) -> bool:
        return self.implementations.get(family, "python") == "upstream"

    def driver(self, family: str) -> str:
        names = UPSTREAM_DRIVER_NAMES if self.upstream(family) else self.names
        return names.for_family(family)  # type: ignore[arg-type]

    def driver_names(self) -> DriverNames:
        """The name each family's devices are published under in this environment."""
        return DriverNames(**{f: self.driver(f) for f in FAMILIES})

    def class_name(self, kind: str) -> str:
        """Class for `gpu`, `mig`, `efa` or `neuron` devices."""
        family = "gpu" if kind == "mig" else kind
        if self.upstream(family):
            return UPSTREAM_CLASSES[kind]  # type: ignore[index]
        return self.names.class_name(kind)  # type: ignore[arg-type]

    def attribute(self, family: str, name: str) -> str:
        """CEL for one of the driver's own attributes of `device`, e.g. device.attributes['gpu.nvidia.com'].type."""
        return f"device.attributes['{self.driver(family)}'].{name}"

    def definition(self, kind: DeviceKind, extended_resources: bool = False) -> DeviceClassDefinition:
        """The class of one device kind, with the upstream charts' selector semantics. With `extended_resources`,
        a whole-device class names the device plugin's extended resource."""
        family = "gpu" if kind == "mig" else kind
        expression = f"device.driver == '{self.driver(family)}'"
        if family == "gpu":
            expression += f" && {self.attribute('gpu', gpu.TYPE)} == '{kind}'"
        elif family == "efa":  # aws-dranet's class: DRANET also publishes non-EFA network devices
            expression += f" && {self.attribute('efa', efa.PCI_DEVICE)} == '{efa.EFA_PCI_DEVICE_NAME}'"
        extended = EXTENDED_RESOURCES.get(kind) if extended_resources else None
        return DeviceClassDefinition(self.class_name(kind), family, expression, extended)

    def owned(self, kinds: tuple[str, ...], extended_resources: bool = False) -> list[DeviceClassDefinition]:
        """The classes eks-dra creates for the device kinds present (`gpu`, `mig`, `efa`, `neuron`) that its own
        drivers serve. A class no node could ever satisfy (MIG without a MIG node group) is left out."""
        return [self.definition(kind, extended_resources) for kind in kinds  # type: ignore[arg-type]
                if not self.upstream("gpu" if kind == "mig" else kind)]

    def all(self, extended_resources: bool = False) -> list[DeviceClassDefinition]:
        """Every class a cluster of this environment has: ours and the vendor charts'."""
        return [self.definition(kind, extended_resources) for kind in DEVICE_KINDS]
