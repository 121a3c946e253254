"""The settings of one driver process (flags of main.py), in a module of its own: main.py reads them before
it imports anything heavy, to have the kubelet sockets serving first."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class DriverConfig:
    family: str  # the device family's name (DeviceFamily.name)
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
    family_host: object | None = None  # DeviceFamily.node_host(): GPU: the NVIDIA driver root and tools

    @property
    def state_path(self) -> Path:
        return self.state_dir or self.plugins_dir / self.driver_name
