"""Protocol tests: the real gRPC services over Unix sockets, driven by a kubelet-side client built from the
same .proto files (registration, version negotiation, prepare, unprepare, idempotency, empty requests)."""

from __future__ import annotations

import json

import grpc
import pytest
from drivers.harness import DRIVERS, Sandbox, kubelet_for, make_claim, wait_for
from drivers.kubelet import Kubelet

from eks_dra.drivers.framework import cdi
from eks_dra.drivers.framework.proto import dra_v1beta1_pb2, dra_v1beta1_pb2_grpc, generate

GPU = DRIVERS["gpu"]


@pytest.fixture
def env():
    box = Sandbox()
    node = box.node(directory="a")
    yield box.kube, node, lambda family="gpu", **kw: box.start(node, family, **kw)
    box.close(1)


def test_stubs_match_protos():
    assert generate.main(["--check"]) == 0


def test_registration_info_and_version_negotiation(env):
    kube, node, start = env
    driver = start()
    kubelet = kubelet_for(node, "gpu")
    assert kubelet.info.type == "DRAPlugin"
    assert kubelet.info.name == GPU
    assert kubelet.info.endpoint == str(node.plugins / GPU / "dra.sock")
    assert list(kubelet.info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert kubelet.version == "v1.DRAPlugin"
    assert not driver.servers.registration.registered.is_set()
    kubelet.notify(True)
    assert driver.servers.registration.registered.is_set()
    with pytest.raises(grpc.RpcError) as err:
        kubelet.notify(False, "name clash")
    assert "name clash" in err.value.details()
    kubelet.close()


def test_health_service_advertised_only_when_enabled(env):
    kube, node, start = env
    start(dra_health_stream=True)
    kubelet = kubelet_for(node, "gpu")
    assert list(kubelet.info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"]
    kubelet.close()


def test_prepare_unprepare_v1_and_idempotency(env):
    kube, node, start = env
    start()
    kubelet = kubelet_for(node, "gpu")
    claim = kube.put_claim(make_claim(GPU, "node-a", ["gpu-0", "gpu-1"], requests=["a", "b/sub"]))
    uid = claim["metadata"]["uid"]
    first = kubelet.prepare([claim])
    assert set(first) == {uid}
    assert first[uid].error == ""
    devices = {d.device_name: d for d in first[uid].devices}
    assert set(devices) == {"gpu-0", "gpu-1"}
    assert list(devices["gpu-1"].request_names) == ["b"]  # subrequest stripped
    assert devices["gpu-0"].pool_name == "node-a"
    assert list(devices["gpu-0"].cdi_device_ids) == [f"k8s.{GPU}/claim={uid}-gpu-0"]
    spec_path = node.cdi / f"k8s.{GPU}-claim_{uid}.json"
    spec = json.loads(spec_path.read_text())
    assert spec["kind"] == f"k8s.{GPU}/claim"
    assert spec["cdiVersion"] == cdi.minimum_version(spec)
    assert [d["name"] for d in spec["devices"]] == [f"{uid}-gpu-0", f"{uid}-gpu-1"]
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia0"}]
    assert {"path": "/dev/nvidiactl"} in spec["containerEdits"]["deviceNodes"]
    # One value for every claim (upstream's "void"), so a container with two claims keeps one environment.
    visible = [e for e in spec["containerEdits"]["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert visible == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert not any("env" in d["containerEdits"] for d in spec["devices"])

    again = kubelet.prepare([claim])  # idempotent: same answer, no second spec
    assert again[uid] == first[uid]
    assert len(list(node.cdi.iterdir())) == 1

    out = kubelet.unprepare([claim])
    assert set(out) == {uid} and out[uid].error == ""
    assert not spec_path.exists()
    out = kubelet.unprepare([claim])  # unknown claim: not an error
    assert out[uid].error == ""
    kubelet.close()


def test_v1beta1_service_on_the_same_socket(env):
    kube, node, start = env
    start()
    claim = kube.put_claim(make_claim(GPU, "node-a", ["gpu-3"]))
    with grpc.insecure_channel(f"unix://{node.plugins / GPU / 'dra.sock'}") as ch:
        stub = dra_v1beta1_pb2_grpc.DRAPluginStub(ch)
        ref = dra_v1beta1_pb2.Claim(namespace="default", uid=claim["metadata"]["uid"], name=claim["metadata"]["name"])
        resp = stub.NodePrepareResources(dra_v1beta1_pb2.NodePrepareResourcesRequest(claims=[ref]), timeout=10)
        entry = resp.claims[claim["metadata"]["uid"]]
        assert entry.error == "" and [d.device_name for d in entry.devices] == ["gpu-3"]
        un = stub.NodeUnprepareResources(dra_v1beta1_pb2.NodeUnprepareResourcesRequest(claims=[ref]), timeout=10)
        assert un.claims[claim["metadata"]["uid"]].error == ""


def test_empty_requests_succeed(env):
    kube, node, start = env
    start()
    kubelet = kubelet_for(node, "gpu")
    assert kubelet.prepare([]) == {}
    assert kubelet.unprepare([]) == {}
    kubelet.close()


def test_pod_uid_socket_names_and_cleanup_on_stop(env):
    kube, node, start = env
    old = start(pod_uid="11111111-1111-1111-1111-111111111111")
    start(pod_uid="22222222-2222-2222-2222-222222222222")
    old_reg = node.registry / f"{GPU}-11111111-1111-1111-1111-111111111111-reg.sock"
    new_reg = node.registry / f"{GPU}-22222222-2222-2222-2222-222222222222-reg.sock"
    for sock in (old_reg, new_reg):
        wait_for(sock.exists, what=str(sock))
    k_new = Kubelet(new_reg)
    assert k_new.info.endpoint == str(node.plugins / GPU / "dra-22222222-2222-2222-2222-222222222222.sock")
    old.stop(1)  # the old pod leaves: only its own sockets go
    assert not old_reg.exists()
    assert not (node.plugins / GPU / "dra-11111111-1111-1111-1111-111111111111.sock").exists()
    assert new_reg.exists() and (node.plugins / GPU / "dra-22222222-2222-2222-2222-222222222222.sock").exists()
    claim = kube.put_claim(make_claim(GPU, "node-a", ["gpu-5"]))
    assert k_new.prepare([claim])[claim["metadata"]["uid"]].error == ""
    assert kube.slices_of("node-a", GPU), "slices stay when the old pod stops"
    k_new.close()
