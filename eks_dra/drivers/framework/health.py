"""Liveness: a `grpc.health.v1` service on TCP (`--health-port`) that checks the plugin end to end.

Each Check (service "" or "liveness") dials the plugin's own Unix sockets as the kubelet would:
`GetInfo` on the registration socket (it must name this driver) and an empty `NodePrepareResources` on
the DRA socket (it must succeed with no entries). Anything else answers NOT_SERVING, so a wedged gRPC
server or a deleted socket restarts the pod. The DRA resource-health stream (v1alpha1) lives in plugin.py.
"""

from __future__ import annotations

import logging
from concurrent import futures

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .proto import dra_v1_pb2, dra_v1_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc

log = logging.getLogger(__name__)
SERVICES = ("", "liveness")
CHECK_TIMEOUT_S = 5.0


def check_plugin(driver: str, reg_path: str, dra_path: str, timeout_s: float = CHECK_TIMEOUT_S) -> str:
    """'' when both sockets answer correctly, else why not."""
    try:
        with grpc.insecure_channel(f"unix://{reg_path}") as ch:
            info = pluginregistration_pb2_grpc.RegistrationStub(ch).GetInfo(
                pluginregistration_pb2.InfoRequest(), timeout=timeout_s)
        if info.name != driver:
            return f"registration socket answers for {info.name!r}, not {driver!r}"
        with grpc.insecure_channel(f"unix://{dra_path}") as ch:
            resp = dra_v1_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(), timeout=timeout_s)
        if len(resp.claims):
            return "an empty NodePrepareResources returned claims"
    except grpc.RpcError as exc:
        return f"{exc.code().name}: {exc.details()}"
    return ""


class LivenessServicer(health_pb2_grpc.HealthServicer):
    def __init__(self, driver: str, reg_path: str, dra_path: str) -> None:
        self.driver, self.reg_path, self.dra_path = driver, reg_path, dra_path

    def Check(self, request, context):  # noqa: N802 - gRPC method name
        if request.service not in SERVICES:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        problem = check_plugin(self.driver, self.reg_path, self.dra_path)
        if problem:
            log.warning("liveness check failed", extra={"error": problem})
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.NOT_SERVING)
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    def Watch(self, request, context):  # noqa: N802
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "use Check")


def serve_liveness(driver: str, reg_path: str, dra_path: str, port: int, address: str = "0.0.0.0"):
    """Start the liveness server; returns (server, bound port)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="health"))
    health_pb2_grpc.add_HealthServicer_to_server(LivenessServicer(driver, reg_path, dra_path), server)
    bound = server.add_insecure_port(f"{address}:{port}")
    if not bound:
        raise OSError(f"cannot listen on {address}:{port}")
    server.start()
    return server, bound
