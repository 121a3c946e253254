"""ResourceSlices, readiness taint and health withdrawal against the in-test API server."""

from __future__ import annotations

import random
import threading
import time

import pytest
from drivers.fake_kube import FakeKube
from drivers.harness import DRIVERS, Sandbox, make_claim, short_tmp, wait_for

from eks_dra.devices import Device
from eks_dra.devices.neuron import neuron_device_name
from eks_dra.drivers import fixture
from eks_dra.drivers.framework.kube import KubeApi, api_client
from eks_dra.drivers.framework.metrics import DriverMetrics
from eks_dra.drivers.framework.publisher import SlicePublisher
from eks_dra.drivers.framework.readiness import taint_key

GPU, EFA, NEURON = DRIVERS["gpu"], DRIVERS["efa"], DRIVERS["neuron"]
NOT_READY = {"key": taint_key(GPU), "value": "true", "effect": "NoSchedule"}


@pytest.fixture
def cluster():
    box = Sandbox()
    yield box.kube, box.node, box.start
    box.close()


def devices_in(kube, node, driver):
    return sorted(d["name"] for s in kube.slices_of(node, driver) for d in s["spec"]["devices"])


def test_publish_pool_owner_generation_and_taint(cluster):
    kube, make_node, start = cluster
    n = make_node(taints=[NOT_READY, {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}])
    start(n, "gpu")
    start(n, "efa")
    wait_for(lambda: len(devices_in(kube, "node-a", EFA)) == 32 and len(devices_in(kube, "node-a", GPU)) == 8,
             what="slices")
    node_uid = kube.nodes["node-a"]["metadata"]["uid"]
    for s in kube.slices_of("node-a"):
        assert s["spec"]["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
        assert s["spec"]["nodeName"] == "node-a"
        assert s["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": "node-a",
                                                     "uid": node_uid, "controller": True}]
    wait_for(lambda: [t["key"] for t in kube.node_taints("node-a")] == ["nvidia.com/gpu"], what="taint removed")


def test_idle_driver_makes_no_writes(cluster):
    kube, make_node, start = cluster
    n = make_node()
    driver = start(n, "gpu", resync_interval_s=0.3)
    wait_for(driver.publisher.in_sync.is_set, what="published")
    wait_for(lambda: driver.readiness.ready is True, what="ready")
    time.sleep(0.5)
    before = sum(kube.writes.values())
    time.sleep(2.5)  # ~8 resyncs and ~12 health polls
    assert sum(kube.writes.values()) == before


def test_deleted_slices_come_back_even_at_hostile_moments(cluster):
    """200 deletions: right after a (re)create, a little later, during watch reconnects and after the
    watch's resourceVersion was compacted away (410). Every one is put back within 15 s."""
    kube, make_node, start = cluster
    n = make_node()
    driver = start(n, "efa")
    wait_for(lambda: kube.device_count("node-a", EFA) == 32, what="slices")
    name = kube.slices_of("node-a", EFA)[0]["metadata"]["name"]
    rng = random.Random(3)
    worst = 0.0
    for i in range(200):
        if i % 20 == 3:
            kube.drop_watches()  # during a watch reconnect
        if i % 20 == 11:
            kube.compact()  # the watch's resourceVersion is gone: 410
        wait_for(lambda: kube.device_count("node-a", EFA) == 32, timeout=15, interval=0.002, what="slice present")
        time.sleep(rng.choice([0, 0, 0, 0.005, 0.02]))  # right after the create, or a bit later
        start_t = time.monotonic()
        assert kube.delete_slice(name)
        wait_for(lambda: kube.device_count("node-a", EFA) == 32, timeout=15, interval=0.002, what=f"recreate #{i}")
        worst = max(worst, time.monotonic() - start_t)
    assert worst < 15
    assert kube.writes[("resourceslices", "update")] == 0  # put back as it was: create only, same generation
    gens = {s["spec"]["pool"]["generation"] for s in kube.slices_of("node-a", EFA)}
    assert gens == {driver.publisher._generation} == {1}


def test_api_outage_is_retried(cluster):
    kube, make_node, start = cluster
    n = make_node()
    kube.fail_all = True
    driver = start(n, "gpu")
    time.sleep(1.0)
    assert not kube.slices_of("node-a")
    kube.fail_all = False
    wait_for(lambda: len(devices_in(kube, "node-a", GPU)) == 8, timeout=15, what="published after outage")
    assert driver.metrics.value("eks_dra_api_errors_total", call="watch_slices") > 0


def test_two_nodes_same_device_names_are_separate_pools(cluster):
    kube, make_node, start = cluster
    a, b = make_node("node-a"), make_node("node-b")
    start(a, "gpu")
    start(b, "gpu")
    wait_for(lambda: devices_in(kube, "node-a", GPU) == devices_in(kube, "node-b", GPU) != [], what="both")
    pools = {s["spec"]["pool"]["name"] for s in kube.slices_of("node-a") + kube.slices_of("node-b")}
    assert pools == {"node-a", "node-b"}


def test_starts_before_devices_publishes_nothing_then_everything(cluster):
    kube, make_node, start = cluster
    n = make_node(without_driver=True, taints=[NOT_READY])
    seen_sizes: list[int] = []
    stop = threading.Event()

    def observe():
        while not stop.is_set():
            s = devices_in(kube, "node-a", GPU)
            if s:
                seen_sizes.append(len(s))
            time.sleep(0.005)

    watcher = threading.Thread(target=observe, daemon=True)
    watcher.start()
    driver = start(n, "gpu")
    time.sleep(1.0)
    assert not kube.slices_of("node-a")
    assert kube.node_taints("node-a") == [NOT_READY]
    fixture.add_devices(n.host, "gpu")
    t0 = time.monotonic()
    wait_for(lambda: len(devices_in(kube, "node-a", GPU)) == 8, what="full inventory")
    appeared = time.monotonic() - t0
    wait_for(lambda: kube.node_taints("node-a") == [], what="taint removed")
    stop.set()
    watcher.join()
    # One sample after the watcher: on a loaded machine its 5 ms polls may all fall before the slice appears.
    seen_sizes.append(len(devices_in(kube, "node-a", GPU)))
    assert set(seen_sizes) == {8}, "never an empty or partial slice"
    assert appeared < 60
    assert driver.inventory.ready


def test_unhealthy_devices_withdrawn_and_restored(cluster):
    kube, make_node, start = cluster
    n = make_node()
    efa = start(n, "efa")
    gpu = start(n, "gpu")
    wait_for(lambda: len(devices_in(kube, "node-a", EFA)) == 32 and len(devices_in(kube, "node-a", GPU)) == 8,
             what="slices")
    name, dev = sorted(efa.inventory.devices.items())[0]
    ibdev = dev.device.attributes["rdmaDevice"]
    t0 = time.monotonic()
    fixture.set_efa_port_state(n.host, ibdev, False)
    fixture.set_gpu_xid(n.host, 2, 79)
    wait_for(lambda: name not in devices_in(kube, "node-a", EFA) and "gpu-2" not in devices_in(kube, "node-a", GPU),
             timeout=10, what="withdrawn")
    assert time.monotonic() - t0 < 10
    assert len(devices_in(kube, "node-a", EFA)) == 31
    reasons = [r for _, r, _ in efa.events.sent + gpu.events.sent]
    assert reasons.count("DeviceUnhealthy") == 2
    assert efa.metrics.value("eks_dra_health_changes_total", health="unhealthy") == 1
    # a claim on the withdrawn GPU is refused with the reason
    claim = kube.put_claim(make_claim(GPU, "node-a", ["gpu-2"]))
    ref = [(claim["metadata"]["namespace"], claim["metadata"]["uid"], claim["metadata"]["name"])]
    from eks_dra.drivers.framework.state import ClaimRef

    out = gpu.state.prepare([ClaimRef(*ref[0])])
    assert "unhealthy" in out[claim["metadata"]["uid"]][1]
    fixture.set_efa_port_state(n.host, ibdev, True)
    fixture.set_gpu_xid(n.host, 2, None)
    wait_for(lambda: len(devices_in(kube, "node-a", EFA)) == 32, timeout=10, what="EFA restored")
    wait_for(lambda: "gpu-2" in devices_in(kube, "node-a", GPU), timeout=10, what="GPU restored")
    assert efa.metrics.value("eks_dra_health_changes_total", health="healthy") == 1
    gens = {s["spec"]["pool"]["generation"] for s in kube.slices_of("node-a", EFA)}
    assert gens == {3}


def test_mig_devices_follow_their_parent(cluster):
    kube, make_node, start = cluster
    n = make_node(mig_profile="3g.40gb")
    driver = start(n, "gpu")
    wait_for(lambda: len(devices_in(kube, "node-a", GPU)) > 0, what="slices")
    before = devices_in(kube, "node-a", GPU)
    children = [d for d in before if d.startswith("gpu-1-mig-")]
    assert children
    fixture.set_gpu_xid(n.host, 1, 48)
    wait_for(lambda: not any(d.startswith("gpu-1-mig-") for d in devices_in(kube, "node-a", GPU)), timeout=10,
             what="MIG children withdrawn")
    assert len(devices_in(kube, "node-a", GPU)) == len(before) - len(children)
    assert driver.metrics.value("eks_dra_unhealthy_devices") == len(children)


def test_device_plugin_on_node_blocks_publishing(cluster):
    kube, make_node, start = cluster
    n = make_node(taints=[NOT_READY])
    kube.nodes["node-a"]["status"]["allocatable"]["nvidia.com/gpu"] = "8"
    driver = start(n, "gpu")
    wait_for(lambda: any(r == "DevicePluginConflict" for _, r, _ in driver.events.sent), what="conflict event")
    time.sleep(0.5)
    assert not kube.slices_of("node-a")
    assert kube.node_taints("node-a") == [NOT_READY]


def test_publisher_splits_large_pools_and_bumps_generation():
    kube = FakeKube()
    try:
        kube.add_node("big")
        api = KubeApi(api_client(str(kube.write_kubeconfig(short_tmp() / "kc"))))
        pub = SlicePublisher(api, "x.example.com", "big", DriverMetrics("x.example.com"), resync_s=60)
        pub.node_uid = kube.nodes["big"]["metadata"]["uid"]
        pub.start()
        pub.set_devices([Device(f"dev-{i:03d}", {"index": i}) for i in range(300)])
        wait_for(lambda: len(kube.slices_of("big")) == 3, what="3 slices")
        wait_for(pub.in_sync.is_set, what="in sync")
        sizes = sorted(len(s["spec"]["devices"]) for s in kube.slices_of("big"))
        assert sizes == [44, 128, 128]
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in kube.slices_of("big")} == {3}
        pub.set_devices([Device(f"dev-{i:03d}", {"index": i}) for i in range(100)])
        wait_for(lambda: len(kube.slices_of("big")) == 1, what="shrunk to 1 slice")
        (only,) = kube.slices_of("big")
        assert only["spec"]["pool"] == {"name": "big", "generation": 2, "resourceSliceCount": 1}
        pub.stop()
    finally:
        kube.close()


def test_device_plugin_appearing_later_withdraws_slices_and_taints(cluster):
    kube, make_node, start = cluster
    n = make_node(taints=[NOT_READY])
    driver = start(n, "gpu", resync_interval_s=0.3)
    wait_for(lambda: kube.device_count("node-a", GPU) == 8 and kube.node_taints("node-a") == [], what="ready")
    with kube.lock:
        kube.nodes["node-a"]["status"]["allocatable"]["nvidia.com/gpu"] = "8"
    # the gauge is set once the last slice is deleted: waited for too, a look in between would see 8
    wait_for(lambda: not kube.slices_of("node-a", GPU) and kube.node_taints("node-a") == [NOT_READY]
             and driver.metrics.value("eks_dra_published_devices") == 0, timeout=5,
             what="withdrawn, tainted and counted")


def test_device_driver_unloaded_retaints_then_recovers(cluster):
    kube, make_node, start = cluster
    efa_not_ready = {**NOT_READY, "key": taint_key(EFA)}
    n = make_node(taints=[efa_not_ready])
    driver = start(n, "efa")
    wait_for(lambda: kube.device_count("node-a", EFA) == 32 and kube.node_taints("node-a") == [], what="ready")
    fixture.unload_driver(n.host, "efa")
    wait_for(lambda: kube.node_taints("node-a") == [efa_not_ready], timeout=5, what="re-tainted")
    wait_for(lambda: any(r == "InventoryNotReady" for _, r, _ in driver.events.sent), timeout=5, what="event")
    fixture.add_devices(n.host, "efa")
    wait_for(lambda: kube.node_taints("node-a") == [] and kube.device_count("node-a", EFA) == 32, timeout=5,
             what="untainted again, full inventory")
    unhealthy = [t for t, r, _ in driver.events.sent if r == "DeviceUnhealthy"]
    assert len(unhealthy) <= 2, "32 devices going down at once is one Event, not 32"


def test_dra_health_stream_reports_every_device(cluster):
    import grpc

    from eks_dra.drivers.framework.proto import dra_health_v1alpha1_pb2 as pb
    from eks_dra.drivers.framework.proto import dra_health_v1alpha1_pb2_grpc as pb_grpc

    kube, make_node, start = cluster
    n = make_node()
    driver = start(n, "gpu", dra_health_stream=True)
    with grpc.insecure_channel(f"unix://{driver.servers.dra_path}") as ch:
        stream = pb_grpc.DRAResourceHealthStub(ch).NodeWatchResources(pb.NodeWatchResourcesRequest(), timeout=20)
        first = next(stream)
        assert len(first.devices) == 8
        assert {d.device.pool_name for d in first.devices} == {"node-a"}
        assert all(d.health == pb.HEALTHY for d in first.devices)
        fixture.set_gpu_xid(n.host, 4, 79)
        for msg in stream:
            bad = [d.device.device_name for d in msg.devices if d.health == pb.UNHEALTHY]
            if bad:
                assert bad == ["gpu-4"] and len(msg.devices) == 8
                break
        stream.cancel()


def test_neuron_error_counter_withdraws_device(cluster):
    kube, make_node, start = cluster
    n = make_node("node-t", "trn2.48xlarge")
    start(n, "neuron")
    wait_for(lambda: kube.device_count("node-t", NEURON) == 16, what="slices")
    t0 = time.monotonic()
    fixture.set_neuron_error(n.host, 5, 3)
    wait_for(lambda: neuron_device_name(5) not in devices_in(kube, "node-t", NEURON), timeout=10, what="withdrawn")
    assert time.monotonic() - t0 < 10
    fixture.set_neuron_error(n.host, 5, 0)
    wait_for(lambda: kube.device_count("node-t", NEURON) == 16, timeout=10, what="restored")


def test_same_device_names_on_two_nodes_prepare_concurrently(cluster):
    from drivers.harness import kubelet_for

    kube, make_node, start = cluster
    a, b = make_node("node-a"), make_node("node-b")
    start(a, "gpu")
    start(b, "gpu")
    claims = {n.name: kube.put_claim(make_claim(GPU, n.name, ["gpu-0"])) for n in (a, b)}
    results = {}

    def run(n):
        k = kubelet_for(n, "gpu")
        results[n.name] = k.prepare([claims[n.name]])[claims[n.name]["metadata"]["uid"]]
        k.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results["node-a"].error == results["node-b"].error == ""
    assert results["node-a"].devices[0].pool_name == "node-a" and results["node-b"].devices[0].pool_name == "node-b"


def test_api_outage_after_ready_does_not_retaint(cluster):
    kube, make_node, start = cluster
    n = make_node(taints=[NOT_READY])
    driver = start(n, "gpu", resync_interval_s=0.3)
    wait_for(lambda: kube.node_taints("node-a") == [] and driver.publisher.in_sync.is_set(), what="ready")
    patches = kube.writes[("nodes", "patch")]
    kube.fail_all = True
    time.sleep(1.5)  # several resyncs fail
    kube.fail_all = False
    time.sleep(1.0)
    assert kube.node_taints("node-a") == []
    assert kube.writes[("nodes", "patch")] == patches
    assert kube.device_count("node-a", GPU) == 8
