"""A kubelet-side client built from the same .proto files: registration and the DRA service."""

from __future__ import annotations

from pathlib import Path

import grpc

from eks_dra.drivers.framework.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

KUBELET_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # what kubelet 1.34 supports


class Kubelet:
    """Registers a plugin as the kubelet does and calls its DRA service in the negotiated version."""

    def __init__(self, reg_socket: Path, timeout: float = 45.0) -> None:
        self.timeout = timeout
        self.reg_channel = grpc.insecure_channel(f"unix://{reg_socket}")
        info = pluginregistration_pb2_grpc.RegistrationStub(self.reg_channel).GetInfo(
            pluginregistration_pb2.InfoRequest(), timeout=timeout)
        self.info = info
        # kubelet: the first supported_versions entry it knows wins
        self.version = next((v for v in info.supported_versions if v in KUBELET_SERVICES), None)
        self.dra_channel = grpc.insecure_channel(f"unix://{info.endpoint}")
        if self.version == "v1beta1.DRAPlugin":
            self.pb2, self.stub = dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginStub(self.dra_channel)
        else:
            self.pb2, self.stub = dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginStub(self.dra_channel)

    def notify(self, registered: bool = True, error: str = "") -> None:
        pluginregistration_pb2_grpc.RegistrationStub(self.reg_channel).NotifyRegistrationStatus(
            pluginregistration_pb2.RegistrationStatus(plugin_registered=registered, error=error), timeout=self.timeout)

    def _claims(self, claims):
        return [self.pb2.Claim(namespace=c["metadata"]["namespace"], uid=c["metadata"]["uid"], name=c["metadata"]["name"])
                if isinstance(c, dict) else self.pb2.Claim(namespace=c[0], uid=c[1], name=c[2]) for c in claims]

    def prepare(self, claims) -> dict:
        resp = self.stub.NodePrepareResources(self.pb2.NodePrepareResourcesRequest(claims=self._claims(claims)),
                                              timeout=self.timeout)
        return dict(resp.claims)

    def unprepare(self, claims) -> dict:
        resp = self.stub.NodeUnprepareResources(self.pb2.NodeUnprepareResourcesRequest(claims=self._claims(claims)),
                                                timeout=self.timeout)
        return dict(resp.claims)

    def close(self) -> None:
        self.reg_channel.close()
        self.dra_channel.close()
