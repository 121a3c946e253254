"""The kubelet-facing gRPC servers over Unix sockets.

Sockets (per-pod names when POD_UID is set, so that during a rolling update with maxSurge: 1 the new pod
never takes or deletes the old pod's sockets, and vice versa):
    registration  <registry-dir>/<driver>-<podUID>-reg.sock   (without POD_UID: <driver>-reg.sock)
    DRA service   <plugins-dir>/<driver>/dra-<podUID>.sock     (without POD_UID: dra.sock)
Registration answers type DRAPlugin, name = driver, endpoint = the DRA socket, supported versions
["v1.DRAPlugin", "v1beta1.DRAPlugin"] (kubelet takes the first it knows) plus
"v1alpha1.DRAResourceHealth" when the health stream is enabled. One server on the DRA socket serves both
DRAPlugin versions (and the health stream). At start each server removes a stale socket of its own name
only; at stop it removes its own sockets and nothing else.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

from .proto import (
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

log = logging.getLogger(__name__)
PLUGIN_TYPE = "DRAPlugin"
DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"
MAX_UNIX_PATH = 107  # sun_path is 108 bytes including the terminating NUL
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
ANSWER_MARGIN_S = 0.5  # of a kubelet call's deadline, kept for sending the answer back
STARTING_WAIT_S = 30.0  # a DRA call arriving while the driver starts waits this long (kubelet: 45 s)


def socket_paths(driver: str, registry_dir: Path, plugins_dir: Path, pod_uid: str | None) -> tuple[Path, Path]:
    """(registration socket, DRA service socket) for this driver and plugin pod."""
    if pod_uid:
        return registry_dir / f"{driver}-{pod_uid}-reg.sock", plugins_dir / driver / f"dra-{pod_uid}.sock"
    return registry_dir / f"{driver}-reg.sock", plugins_dir / driver / "dra.sock"


class RegistrationServicer(pluginregistration_pb2_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: str, versions: list[str]) -> None:
        self.driver, self.endpoint, self.versions = driver, endpoint, versions
        self.registered = threading.Event()
        self.registered_at: float | None = None
        self.last_error = ""

    def GetInfo(self, request, context):  # noqa: N802 - gRPC method name
        return pluginregistration_pb2.PluginInfo(type=PLUGIN_TYPE, name=self.driver, endpoint=self.endpoint,
                                                 supported_versions=self.versions)

    def NotifyRegistrationStatus(self, request, context):  # noqa: N802
        if not request.plugin_registered:
            self.last_error = request.error
            log.error("kubelet rejected the registration", extra={"error": request.error})
            context.abort(grpc.StatusCode.UNKNOWN, f"registration failed: {request.error}")
        self.registered_at = time.monotonic()
        self.registered.set()
        log.info("registered with the kubelet")
        return pluginregistration_pb2.RegistrationStatusResponse()


class StateSlot:
    """The DeviceState behind the DRA servicers. The sockets serve before the driver has loaded its checkpoint
    and discovered its devices (heavy imports, file and API work): a call that arrives meanwhile waits."""

    def __init__(self) -> None:
        self._state = None
        self._set = threading.Event()

    def attach(self, state) -> None:
        self._state = state
        self._set.set()

    def get(self, context):
        if not self._set.wait(STARTING_WAIT_S):
            context.abort(grpc.StatusCode.UNAVAILABLE, f"driver still starting after {STARTING_WAIT_S:.0f}s")
        return self._state


def _answer_by(context) -> float | None:
    """When (time.monotonic()) a call's answers must be ready: its deadline less the time to send them back."""
    remaining = context.time_remaining()
    if remaining is None:
        return None
    return time.monotonic() + remaining - min(ANSWER_MARGIN_S, remaining / 10)


def _dra_servicer(pb2, base, slot: StateSlot):
    """A DRAPlugin servicer for one API version (v1 and v1beta1 share messages field for field)."""

    def refs(request):
        from .state import ClaimRef  # imported by the driver long before the first call; not on the start path

        return [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]

    class Servicer(base):
        def NodePrepareResources(self, request, context):  # noqa: N802
            state = slot.get(context)
            resp = pb2.NodePrepareResourcesResponse()
            for uid, (devices, error) in state.prepare(refs(request), _answer_by(context)).items():
                entry = resp.claims[uid]
                if error:
                    entry.error = error
                    continue
                for d in devices:
                    entry.devices.add(request_names=d.request_names, pool_name=d.pool_name,
                                      device_name=d.device_name, cdi_device_ids=d.cdi_device_ids)
            return resp

        def NodeUnprepareResources(self, request, context):  # noqa: N802
            state = slot.get(context)
            resp = pb2.NodeUnprepareResourcesResponse()
            for uid, error in state.unprepare(refs(request)).items():
                resp.claims[uid].error = error  # an entry for every claim, empty on success
            return resp

    return Servicer()


class HealthStreamServicer(dra_health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    """`NodeWatchResources`: the complete device list on every change, and at least every `period_s`."""

    def __init__(self, node_name: str, inventory=None, period_s: float = 10.0) -> None:
        # inventory None until the driver is built; a watch that starts earlier waits for it
        self.node_name, self.inventory, self.period_s = node_name, inventory, period_s
        self.changed = threading.Condition()
        self.stopping = False

    def notify(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def NodeWatchResources(self, request, context):  # noqa: N802
        pb = dra_health_v1alpha1_pb2
        while context.is_active() and not self.stopping and self.inventory is None:
            with self.changed:
                self.changed.wait(0.1)
        while context.is_active() and not self.stopping:
            now = int(time.time())
            msg = pb.NodeWatchResourcesResponse()
            for name, healthy in sorted(self.inventory.snapshot().items()):
                msg.devices.add(device=pb.DeviceIdentifier(pool_name=self.node_name, device_name=name),
                                health=pb.HEALTHY if healthy else pb.UNHEALTHY, last_updated_time=now)
            yield msg
            with self.changed:
                self.changed.wait(self.period_s)


def _remove_socket(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class PluginServers:
    """Registration server + DRA server; start() binds the DRA socket first so kubelet never sees a
    registration whose endpoint does not answer. They may start before the DeviceState exists (`attach`)."""

    def __init__(self, *, driver: str, registry_dir: Path, plugins_dir: Path, pod_uid: str | None,
                 health_stream: HealthStreamServicer | None = None, workers: int = 16) -> None:
        self.driver = driver
        self.reg_path, self.dra_path = socket_paths(driver, Path(registry_dir), Path(plugins_dir), pod_uid)
        for path in (self.reg_path, self.dra_path):
            if len(str(path)) > MAX_UNIX_PATH:
                raise ValueError(f"socket path {path} is {len(str(path))} bytes; Unix sockets allow {MAX_UNIX_PATH}")
        versions = list(DRA_SERVICES) + ([HEALTH_SERVICE] if health_stream else [])
        self.registration = RegistrationServicer(driver, str(self.dra_path), versions)
        self.health_stream = health_stream
        self.slot = StateSlot()
        self.started = False
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        self.dra_server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dra"),
                                      options=options)
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
            _dra_servicer(dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginServicer, self.slot), self.dra_server)
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
            _dra_servicer(dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginServicer, self.slot), self.dra_server)
        if health_stream:
            dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(health_stream, self.dra_server)
        self.reg_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="reg"))
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(self.registration, self.reg_server)

    @classmethod
    def for_config(cls, cfg) -> PluginServers:
        """The servers of a driver_config.DriverConfig (not started)."""
        stream = HealthStreamServicer(cfg.node_name) if cfg.dra_health_stream else None
        return cls(driver=cfg.driver_name, registry_dir=cfg.registry_dir, plugins_dir=cfg.plugins_dir,
                   pod_uid=cfg.pod_uid, health_stream=stream)

    def start(self) -> None:
        for server, path in ((self.dra_server, self.dra_path), (self.reg_server, self.reg_path)):
            path.parent.mkdir(parents=True, exist_ok=True)
            _remove_socket(path)  # our own name only: a previous run of this pod (or of this node's single pod)
            server.add_insecure_port(f"unix://{path}")
            server.start()
        self.started = True
        log.info("serving", extra={"path": [str(self.reg_path), str(self.dra_path)]})

    def attach(self, state) -> None:
        """The driver is ready: DRA calls go to `state` (calls waiting since start-up proceed)."""
        self.slot.attach(state)

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting calls, let running ones finish, then remove our own sockets."""
        if self.health_stream:
            self.health_stream.stopping = True
            self.health_stream.notify()
        events = [self.reg_server.stop(grace_s), self.dra_server.stop(grace_s)]
        for ev in events:
            ev.wait(grace_s + 1)
        for path in (self.reg_path, self.dra_path):
            _remove_socket(path)
