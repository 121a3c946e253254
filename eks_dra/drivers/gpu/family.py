"""The NVIDIA GPU family (`eks-dra-driver gpu`, driver name gpu.nvidia.com by default).

Device taints (DRADeviceTaints) by fault:

| fault (health.py) | kind = value | effect |
|---|---|---|
| XID (not an application XID) or double-bit ECC event | xid | NoExecute: the GPU context is lost |
| uncorrected volatile ECC errors | ecc-uncorrected | NoExecute: memory contents are corrupt |
| NVML cannot reach the GPU | gpu-lost | NoExecute: the GPU fell off the bus |
| row remapping failed | row-remap-failed | NoExecute: the GPU needs replacing |
| row remapping pending | row-remap-pending | NoSchedule: running work continues; reset when idle |
| (MIG) parent GPU unhealthy | the parent's value | the parent's effect |
| anything else (e.g. an NVML query that failed) | unknown | NoSchedule |
"""

from __future__ import annotations

from pathlib import Path

from ..framework.device_setup import DeviceSetup
from ..framework.device_taints import NO_EXECUTE, NO_SCHEDULE, TaintEffects
from ..framework.family import DeviceFamily, HealthMonitor, ToolUnavailable, apply_health
from ..framework.inventory import Inventory
from .configs import GPU_CONFIG_SCHEMAS, HARDWARE_SETTINGS


class GpuFamily(DeviceFamily):
    name = "gpu"
    device_plugin_resources = ("nvidia.com/gpu", "nvidia.com/mig-")
    config_schemas = GPU_CONFIG_SCHEMAS
    hardware_settings = HARDWARE_SETTINGS
    taint_effects: TaintEffects = {
        "xid": NO_EXECUTE,
        "ecc-uncorrected": NO_EXECUTE,
        "gpu-lost": NO_EXECUTE,
        "row-remap-failed": NO_EXECUTE,
        "row-remap-pending": NO_SCHEDULE,
    }
    tool_unavailable_reason = "GpuToolUnavailable"

    def node_host(self, host_root: Path, options: dict) -> object | None:
        """The NVIDIA driver root and tools: options `driver_root` (host path), `container_driver_root` (where
        this process sees it) and `nvidia_cdi_hook_path` (main.py's flags)."""
        from .host import GpuHost

        return GpuHost.for_node(host_root, options.get("driver_root", "/"), options.get("container_driver_root"),
                                options.get("nvidia_cdi_hook_path"))

    def discover(self, host_root: Path, *, host: object | None = None, nvml=None, instance_type: str | None = None,
                 **options) -> Inventory:
        """nvml: an NVML backend (tests inject a fake); None loads libnvidia-ml.so.1 from the driver root unless
        the host tree is a fixture. host: the GpuHost (default: driver root `/` under host_root)."""
        from .discovery import discover_gpus
        from .health import gpu_level_health

        inventory, nvml = discover_gpus(host_root, nvml=nvml, instance_type=instance_type, gpu_host=host)
        return apply_health(inventory, gpu_level_health(Path(host_root), inventory, nvml))

    def health_monitor(self, host_root: Path, *, host: object | None = None, nvml=None, **options) -> HealthMonitor:
        """NVML XID/ECC events and level signals (health.GpuHealthMonitor; options xid_hold_s, clock, ...)."""
        from .health import GpuHealthMonitor

        return GpuHealthMonitor(host_root, nvml, gpu_host=host, **options)

    def device_setup(self, host_root: Path, host: object | None, on_tool_unavailable: ToolUnavailable) -> DeviceSetup:
        """Time-slicing through the driver root's nvidia-smi; the host reports an unusable NVML or nvidia-smi."""
        from .host import GpuHost
        from .setup import GpuSetup

        gpu_host = host if isinstance(host, GpuHost) else GpuHost.for_node(host_root)
        gpu_host.on_unavailable = on_tool_unavailable
        return GpuSetup.for_node(gpu_host)


FAMILY = GpuFamily()
