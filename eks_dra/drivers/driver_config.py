"""The settings of one driver process (flags of main.py), in a module of its own: main.py reads them before
it imports anything heavy, to have the kubelet sockets serving first."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the GPU host module is imported only by GPU drivers, after the sockets serve
    from .gpu.host import GpuHost


@dataclass
class DriverConfig:
    family: str
    driver_name: str
    node_name: str
    host_root: Path = Path("/")
    plugins_dir: Path = Path("/var/lib/kubelet/plugins")
    registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    cdi_root: Path = Path("/var/run/cdi")
    state_dir: Path | None = None
    kubeconfig: str | None = None
    pod_uid: str | None = None
    health_port: int = -1  # -1: no liveness endpoint
    health_address: str = "0.0.0.0"
    metrics_port: int = -1
    reconcile_interval_s: float = 60.0
    health_interval_s: float = 1.0
    rediscover_interval_s: float = 10.0
    resync_interval_s: float = 30.0
    dra_health_stream: bool = False
    device_taints: bool = False  # unhealthy devices stay in the slices, tainted (DRADeviceTaints, 1.36+)
    lock_timeout_s: float = 30.0
    durable: bool = True  # fsync the checkpoint (tests turn it off for speed)
    gpu_host: GpuHost | None = None  # the NVIDIA driver root and tools (default: the driver root / under host_root)

    @property
    def state_path(self) -> Path:
        return self.state_dir or self.plugins_dir / self.driver_name
