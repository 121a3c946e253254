"""`eks-dra-driver {gpu|efa|neuron}`: run one DRA kubelet plugin (the framework with one device family).

Every host path is a flag with an environment fallback, so one machine can run many simulated nodes.
Exit codes: 0 after SIGTERM/SIGINT, 2 bad flags or environment, 3 the driver must not run here (a newer
driver's checkpoint). Imports nothing of the CDK; the Kubernetes client is imported lazily and slim
(see kube.py) to keep start-up under a second and memory low.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from eks_dra.devices import names

FAMILIES = ("gpu", "efa", "neuron")
DEFAULT_HEALTH_PORTS = {"gpu": 51515, "efa": 51516, "neuron": 51517}
DEFAULT_METRICS_PORTS = {"gpu": 51525, "efa": 51526, "neuron": 51527}
DEFAULT_DRIVER_NAMES = {family: names.DEFAULT_DRIVER_NAMES.for_family(family) for family in FAMILIES}


def _env(name: str, default=None):
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eks-dra-driver", description="eks-dra DRA kubelet plugin")
    p.add_argument("family", choices=FAMILIES, help="device family this process drives")
    p.add_argument("--node-name", default=_env("NODE_NAME"), help="this node's name (env NODE_NAME; required)")
    p.add_argument("--driver-name", default=_env("DRIVER_NAME"), help="DRA driver name (default the upstream driver's: gpu.nvidia.com, dra.net, neuron.aws.com)")
    p.add_argument("--kubeconfig", default=_env("KUBECONFIG"), help="kubeconfig file (default: in-cluster)")
    p.add_argument("--host-root", type=Path, default=Path(_env("HOST_ROOT", "/")), help="host's / (sysfs, /dev)")
    p.add_argument("--plugins-dir", type=Path, default=Path(_env("KUBELET_PLUGINS_DIR", "/var/lib/kubelet/plugins")))
    p.add_argument("--registry-dir", type=Path,
                   default=Path(_env("KUBELET_REGISTRY_DIR", "/var/lib/kubelet/plugins_registry")))
    p.add_argument("--cdi-root", type=Path, default=Path(_env("CDI_ROOT", "/var/run/cdi")))
    p.add_argument("--state-dir", type=Path, default=_env("STATE_DIR"),
                   help="checkpoint and lock directory (default <plugins-dir>/<driver>)")
    p.add_argument("--health-port", type=int, default=_env("HEALTH_PORT"),
                   help="liveness port, HTTP GET /livez (default 51515 gpu, 51516 efa, 51517 neuron; -1 off)")
    p.add_argument("--health-address", default=_env("HEALTH_ADDRESS", "0.0.0.0"),
                   help="liveness listen address (the kubelet's probe dials the pod IP)")
    p.add_argument("--metrics-port", type=int, default=_env("METRICS_PORT"),
                   help="Prometheus /metrics port (default 51525 gpu, 51526 efa, 51527 neuron; -1 off)")
    p.add_argument("--pod-uid", default=_env("POD_UID"), help="plugin pod UID: per-pod socket names")
    p.add_argument("--reconcile-interval", type=float, default=float(_env("RECONCILE_INTERVAL", 60)),
                   help="seconds between checkpoint/CDI/API reconciliations (default 60)")
    p.add_argument("--health-interval", type=float, default=float(_env("HEALTH_INTERVAL", 1)),
                   help="seconds between device health polls (default 1, at most 2)")
    p.add_argument("--rediscover-interval", type=float, default=float(_env("REDISCOVER_INTERVAL", 10)),
                   help="seconds between full device re-discoveries (default 10)")
    p.add_argument("--resync-interval", type=float, default=float(_env("RESYNC_INTERVAL", 30)),
                   help="seconds between full ResourceSlice resyncs (default 30)")
    p.add_argument("--dra-health", action="store_true", default=_env("DRA_HEALTH") in ("1", "true"),
                   help="serve and advertise v1alpha1.DRAResourceHealth (kubelet gate ResourceHealthStatus)")
    p.add_argument("--driver-root", default=_env("NVIDIA_DRIVER_ROOT", "/"),
                   help="gpu: the host path the NVIDIA driver is installed under (env NVIDIA_DRIVER_ROOT; default /, "
                        "as the upstream chart's nvidiaDriverRoot)")
    p.add_argument("--container-driver-root", type=Path, default=_env("CONTAINER_DRIVER_ROOT"),
                   help="gpu: where this process sees the driver root (env CONTAINER_DRIVER_ROOT; default "
                        "<host-root>/<driver-root>)")
    p.add_argument("--nvidia-cdi-hook-path", default=_env("NVIDIA_CDI_HOOK_PATH"),
                   help="gpu: host path of nvidia-container-toolkit's nvidia-cdi-hook named in CDI specs "
                        "(default: the first of /usr/bin, /usr/local/bin, /usr/local/nvidia/toolkit on the host)")
    p.add_argument("--device-taints", action="store_true", default=_env("DEVICE_TAINTS") in ("1", "true"),
                   help="keep unhealthy devices in the slices with a device taint instead of withdrawing them "
                        "(control-plane gate DRADeviceTaints, on from Kubernetes 1.36)")
    p.add_argument("--log-level", default=_env("LOG_LEVEL", "info"), choices=("debug", "info", "warning", "error"))
    return p


class BadArguments(ValueError):
    pass


def family_host_from_args(args: argparse.Namespace) -> object | None:
    """The family's view of the node's software from the flags (GPU: the driver root and nvidia-cdi-hook)."""
    from .families import get_family

    return get_family(args.family).node_host(args.host_root, {
        "driver_root": args.driver_root, "container_driver_root": args.container_driver_root,
        "nvidia_cdi_hook_path": args.nvidia_cdi_hook_path})


def config_from_args(args: argparse.Namespace):
    """The driver's settings, without `family_host`: main sets it from `family_host_from_args` once the sockets
    serve (it imports the family package)."""
    from .framework.driver_config import DriverConfig

    if not args.node_name:
        raise BadArguments("--node-name (or NODE_NAME) is required: the name of the node this pod runs on "
                           "(fieldRef spec.nodeName)")
    if not 0 < args.health_interval <= 2:
        raise BadArguments("--health-interval must be in (0, 2] seconds")
    for name in ("reconcile_interval", "rediscover_interval", "resync_interval"):
        if getattr(args, name) <= 0:
            raise BadArguments(f"--{name.replace('_', '-')} must be positive")
    if not str(args.driver_root).startswith("/"):
        raise BadArguments(f"--driver-root {args.driver_root!r} must be an absolute host path (e.g. / or "
                           "/run/nvidia/driver)")
    driver_name = args.driver_name or DEFAULT_DRIVER_NAMES[args.family]
    health_port = DEFAULT_HEALTH_PORTS[args.family] if args.health_port is None else int(args.health_port)
    metrics_port = DEFAULT_METRICS_PORTS[args.family] if args.metrics_port is None else int(args.metrics_port)
    return DriverConfig(
        family=args.family, driver_name=driver_name, node_name=args.node_name, host_root=args.host_root,
        plugins_dir=args.plugins_dir, registry_dir=args.registry_dir, cdi_root=args.cdi_root,
        state_dir=Path(args.state_dir) if args.state_dir else None, kubeconfig=args.kubeconfig,
        pod_uid=args.pod_uid or None, health_port=health_port, health_address=args.health_address,
        metrics_port=metrics_port, reconcile_interval_s=args.reconcile_interval,
        health_interval_s=args.health_interval, rediscover_interval_s=args.rediscover_interval,
        resync_interval_s=args.resync_interval, dra_health_stream=args.dra_health,
        device_taints=args.device_taints)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .framework import kube

    kube.use_slim_import()  # before anything imports the kubernetes client
    from .framework import logging as driver_logging

    try:
        cfg = config_from_args(args)
    except BadArguments as exc:
        print(f"eks-dra-driver: error: {exc}", file=sys.stderr)
        return 2
    driver_logging.setup(args.log_level, cfg.driver_name, cfg.node_name)
    stopping = threading.Event()

    def on_signal(signum, frame) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # The kubelet's sockets first (grpc and the protos only): registration answers at once, DRA calls wait until
    # the checkpoint is loaded and the devices are discovered. Everything heavy is imported after this.
    from .framework.plugin import PluginServers

    try:
        servers = PluginServers.for_config(cfg)
        servers.start()
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"eks-dra-driver: error: {exc}", file=sys.stderr)
        return 2
    try:
        driver = _start_driver(cfg, servers, args)
    except _StartError as exc:
        servers.stop(0)
        print(f"eks-dra-driver: {exc}", file=sys.stderr)
        return exc.code
    while not stopping.wait(3600):
        pass
    driver.stop()
    return 0


class _StartError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _start_driver(cfg, servers, args: argparse.Namespace):
    from .families import get_family
    from .framework import kube
    from .framework.driver import Driver, FatalError

    cfg.family_host = family_host_from_args(args)

    try:
        api = kube.KubeApi(kube.api_client(cfg.kubeconfig))
    except Exception as exc:  # noqa: BLE001 - bad kubeconfig / not in a cluster: one clear line
        raise _StartError(2, f"error: cannot configure the Kubernetes client: {exc}") from None
    family = get_family(cfg.family)
    monitor = family.health_monitor(cfg.host_root, host=cfg.family_host)

    def inventory_source():
        return family.discover(cfg.host_root, host=cfg.family_host)

    def health_source(fresh_inventory):
        if fresh_inventory is not None:
            monitor.refresh(fresh_inventory)
        return monitor.poll()

    try:
        driver = Driver(cfg, family, api, inventory_source, health_source, servers=servers)
        driver.start()
    except FatalError as exc:
        raise _StartError(3, f"refusing to run: {exc}") from None
    except (OSError, ValueError) as exc:
        raise _StartError(2, f"error: {exc}") from None
    return driver


if __name__ == "__main__":
    sys.exit(main())
