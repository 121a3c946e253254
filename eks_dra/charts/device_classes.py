"""The DeviceClasses chart: the cluster-scoped classes of eks-dra's own drivers (see eks_dra.devices.classes)."""

from __future__ import annotations

import cdk8s
from cdk8s_plus_34 import k8s
from constructs import Construct

from eks_dra.devices.classes import EXTENDED_RESOURCES, DeviceClassDefinition, DeviceClasses

from . import labels

__all__ = ["EXTENDED_RESOURCES", "DeviceClassDefinition", "DeviceClasses", "DeviceClassesChart"]


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
