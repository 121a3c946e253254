"""cdk8s charts of eks-dra: drivers, DeviceClasses, samples, the device-plugin alternative, vendor charts.

Charts know nothing of the environment; `eks_dra.stacks.manifests` composes them for one environment.
"""

from .device_classes import DeviceClassDefinition, DeviceClasses, DeviceClassesChart
from .device_plugins import DevicePluginsChart, DevicePluginSettings
from .driver_chart import DriverChart, DriverSettings, SystemNamespaceChart
from .samples import NodeGroupDevices, SamplesChart
from .upstream import HelmChartSpec

__all__ = [
    "DeviceClassDefinition",
    "DeviceClasses",
    "DeviceClassesChart",
    "DevicePluginSettings",
    "DevicePluginsChart",
    "DriverChart",
    "DriverSettings",
    "HelmChartSpec",
    "NodeGroupDevices",
    "SamplesChart",
    "SystemNamespaceChart",
]
