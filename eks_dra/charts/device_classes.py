"""DeviceClasses: which driver serves each device family, the class names samples use, and our classes.

For a family served by eks-dra's Python driver we create the classes (GPU, MIG, EFA, Neuron) with CEL on
our driver names and attributes. For a family served by the vendor's driver (`drivers: upstream`), the
vendor's Helm chart creates its own classes; we only point samples at them.
"""

from __future__ import annotations

from dataclasses import dataclass

import cdk8s
from cdk8s_plus_34 import k8s
from constructs import Construct

from eks_dra.devices import DriverNames

from . import labels

# The vendor drivers the EKS device-management guide installs (reference eks-accelerators.md §3).
UPSTREAM_DRIVERS = {"gpu": "gpu.nvidia.com", "efa": "dra.net", "neuron": "neuron.aws.com"}
UPSTREAM_CLASSES = {"gpu": "gpu.nvidia.com", "mig": "mig.nvidia.com", "efa": "efa.networking.k8s.aws",
                    "neuron": "neuron.aws.com"}
# Extended resources of the device plugins (reference eks-accelerators.md §3.2, §3.4, §3.6). Where the
# DRAExtendedResource gate is on (1.36+), our class of the family's whole devices carries the same name, so a
# pod with `nvidia.com/gpu: 1` in its limits is served by our DRA driver on a DRA node (an implicit claim).
EXTENDED_RESOURCES = {"gpu": "nvidia.com/gpu", "efa": "vpc.amazonaws.com/efa", "neuron": "aws.amazon.com/neuron"}


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
        return UPSTREAM_DRIVERS[family] if self.upstream(family) else self.names.for_family(family)  # type: ignore[arg-type]

    def class_name(self, kind: str) -> str:
        """Class for `gpu`, `mig`, `efa` or `neuron` devices."""
        family = "gpu" if kind == "mig" else kind
        if self.upstream(family):
            return UPSTREAM_CLASSES[kind]
        return f"mig.{self.names.gpu}" if kind == "mig" else self.names.for_family(family)  # type: ignore[arg-type]

    def attribute(self, family: str, name: str) -> str:
        """CEL for one of the driver's own attributes of `device`, e.g. device.attributes['gpu.eks-dra.io'].type."""
        return f"device.attributes['{self.driver(family)}'].{name}"

    def owned(self, kinds: tuple[str, ...], extended_resources: bool = False) -> list[DeviceClassDefinition]:
        """The classes eks-dra creates for the device kinds present (`gpu`, `mig`, `efa`, `neuron`) that its own
        drivers serve. A class no node could ever satisfy (MIG without a MIG node group) is left out. With
        `extended_resources`, the whole-device classes name the device plugins' extended resources."""
        out: list[DeviceClassDefinition] = []
        for kind in kinds:
            family = "gpu" if kind == "mig" else kind
            if self.upstream(family):
                continue
            on_driver = f"device.driver == '{self.driver(family)}'"
            if family == "gpu":
                on_driver += f" && {self.attribute('gpu', 'type')} == '{kind}'"
            extended = EXTENDED_RESOURCES.get(kind) if extended_resources else None
            out.append(DeviceClassDefinition(self.class_name(kind), family, on_driver, extended))
        return out


class DeviceClassesChart(cdk8s.Chart):
    """The cluster-scoped DeviceClasses of eks-dra's own drivers."""

    def __init__(self, scope: Construct, id: str, *, definitions: list[DeviceClassDefinition]) -> None:
        super().__init__(scope, id, disable_resource_name_hashes=True)
        for d in definitions:
            k8s.KubeDeviceClass(
                self, d.name,
                metadata=k8s.ObjectMeta(name=d.name, labels=labels.app_labels(d.name, "device-class")),
                spec=k8s.DeviceClassSpec(selectors=[k8s.DeviceSelector(cel=k8s.CelDeviceSelector(expression=d.expression))],
                                         extended_resource_name=d.extended_resource_name),
            )
