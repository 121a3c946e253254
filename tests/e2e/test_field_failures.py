"""The drivers against the field failures of DRA drivers, on the real control plane.

Every scenario runs `eks-dra-driver` processes as their ServiceAccount against fixture host trees, with the
kubelet stand-in (the kubelet's own plugin manager) per simulated node. Counts are scaled down for the test
tier and printed as FIGURE lines; EKS_DRA_FF_FULL=1 runs the issue's counts (bench/field_failures.py).
"""

from __future__ import annotations

import json
import random
import threading
import time

import pytest
from controlplane import wait_until
from drivers.kubelet import Kubelet
from ff_helpers import (
    DRIVERS,
    FULL,
    PodChurn,
    claim_template,
    create_pod,
    delete_pod,
    device_names,
    ensure_device_class,
    make_namespace,
    node_events,
    percentiles,
    pod_state,
    pool_complete,
    prepared,
    raw,
    record_figure,
    scaled,
    slices,
    wait_devices,
    wait_registered,
    wait_running,
)
from kubernetes import client

from eks_dra.devices.neuron import neuron_device_name
from eks_dra.drivers import fixture
from eks_dra.drivers.framework.checkpoint import CheckpointStore, encode
from eks_dra.drivers.gpu.fixture_root import FIXTURE_SMI_LOG

pytestmark = pytest.mark.e2e
GPU, EFA, NEURON = DRIVERS["gpu"], DRIVERS["efa"], DRIVERS["neuron"]


def checkpoint_claims(node, family: str) -> set[str]:
    return set(CheckpointStore(node.state_dir(family), DRIVERS[family], node.name).load().claims)


def claim_uids(pod: dict) -> list[str]:
    return list(prepared(pod))


def start_pods(api, ns: str, node, template: str, count: int, prefix: str = "w") -> dict[str, dict]:
    names = [f"{prefix}-{i}" for i in range(count)]
    for name in names:
        create_pod(api, ns, name, node.name, template)
    return {name: wait_running(api, ns, name, 90) for name in names}


# ----- kubelet restarts ------------------------------------------------------------------------------

def test_kubelet_restarts_under_load_keep_slices_and_claims(api, nodes):
    """Every kubelet start wipes the node's slices: back within 30 s each time; no prepared claim lost."""
    restarts = scaled(3, 20)
    node = nodes.node("ff-kr", "p5.48xlarge")
    drv = node.start_driver("gpu")
    wait_registered(node, drv)
    wait_devices(api, node, drv, 8)
    ns = make_namespace(api, "ff-kr")
    template = claim_template(api, ns, "one-gpu", ensure_device_class(api, GPU))
    steady = start_pods(api, ns, node, template, 4, "steady")
    steady_claims = {uid for pod in steady.values() for uid in claim_uids(pod)}
    assert len(steady_claims) == 4

    watch = nodes.watch(node)
    recovery: list[float] = []
    try:
        # load: a pod comes and goes on the remaining GPUs while the kubelet restarts
        with PodChurn(api, ns, node.name, template, prefix="churn", interval_s=2, lifetime_s=2,
                      join_s=10) as churn:
            for _ in range(restarts):
                node.kubelet.stop()
                seen = len(watch.snapshot())
                node.kubelet.start()  # returns once the stand-in has wiped the node's slices
                wait_devices(api, node, drv, 8, timeout=30)
                time.sleep(0.5)
                events = watch.snapshot()[seen:]
                deleted = [e.at for e in events if e.type == "DELETED"]
                assert deleted, "the kubelet start did not wipe the slices"
                back = [e.at for e in events if e.type == "ADDED" and e.at > deleted[-1]]
                assert back, "slices not recreated after the last wipe"
                recovery.append(back[-1] - deleted[0])  # first wipe -> the pool complete again
    finally:
        watch.stop()
    record_figure("kubelet-restart", restarts=restarts, recovery_s=percentiles(recovery),
                  churn_pods=len(churn.created))
    assert max(recovery) < 30
    assert drv.running
    wait_devices(api, node, drv, 8, timeout=5)  # and they stayed
    for name in steady:
        pod = pod_state(api, ns, name)
        assert pod["status"]["phase"] == "Running", name
    assert steady_claims <= checkpoint_claims(node, "gpu")  # no prepared claim lost
    assert steady_claims <= set(node.cdi_specs("gpu"))  # CDI specs stay
    unprepared = {c["uid"] for e in node.kubelet.events("unprepare") for c in e["claims"]}
    assert not steady_claims & unprepared
    failed = [e["errors"] for e in node.kubelet.events("prepare") if e.get("errors")]
    assert failed == []


def node_spec_writes(api, node: str) -> list[tuple]:
    """The Node's managedFields entries outside the status subresource (the stand-in's heartbeats go there):
    manager, operation and time of the last write of each writer of the Node's metadata/spec."""
    node_obj = raw(client.CoreV1Api(api).read_node, node)
    return sorted((m.get("manager"), m.get("operation"), m.get("time")) for m in node_obj["metadata"].get(
        "managedFields") or [] if not m.get("subresource"))


# ----- hostile slice deletions, idle writes ------------------------------------------------------------

def test_slice_deletions_at_hostile_moments_recreated_and_idle_writes_zero(api, nodes):
    deletions = scaled(24, 200)
    idle_s = scaled(20, 300)
    node = nodes.node("ff-sd", "p5.48xlarge", taints=["gpu", "efa"])  # the drivers patch the Node once each
    gpu, efa = node.start_driver("gpu"), node.start_driver("efa")
    wait_registered(node, gpu)
    wait_registered(node, efa)
    wait_devices(api, node, gpu, 8)
    wait_devices(api, node, efa, 32)
    watch = nodes.watch(node)
    resource = client.ResourceV1Api(api)
    recreate: list[float] = []
    rng = random.Random(7)
    try:
        for i in range(deletions):
            drv, count = (gpu, 8) if i % 2 == 0 else (efa, 32)
            mode = i % 3
            if mode == 1:
                time.sleep(rng.uniform(0, 0.3))  # a random moment shortly after the last recreate
            if mode == 2:  # the whole node at once, as a kubelet start does
                for s in slices(api, node.name, GPU) + slices(api, node.name, EFA):
                    resource.delete_resource_slice(s["metadata"]["name"])
            else:  # mode 0: immediately after the (re)create was observed
                for s in slices(api, node.name, drv.driver):
                    resource.delete_resource_slice(s["metadata"]["name"])
            t0 = time.monotonic()
            wait_devices(api, node, drv, count, timeout=15)
            if mode == 2:
                wait_devices(api, node, gpu if drv is efa else efa, 40 - count, timeout=15)
            recreate.append(time.monotonic() - t0)
        time.sleep(3)  # let the last recreate settle
        writes_before = sum(d.metric("eks_dra_slice_writes_total", op=op) for d in (gpu, efa)
                            for op in ("create", "update", "delete"))
        events_before = len(node_events(api, node.name))
        spec_writes_before = node_spec_writes(api, node.name)
        seen = len(watch.snapshot())
        time.sleep(idle_s)
        idle_watch = watch.snapshot()[seen:]
        spec_writes_after = node_spec_writes(api, node.name)
        writes_after = sum(d.metric("eks_dra_slice_writes_total", op=op) for d in (gpu, efa)
                           for op in ("create", "update", "delete"))
        idle_events = len(node_events(api, node.name)) - events_before
    finally:
        watch.stop()
    record_figure("slice-deletions", deletions=deletions, recreate_s=percentiles(recreate), idle_window_s=idle_s,
                  idle_slice_writes=writes_after - writes_before, idle_slice_watch_events=len(idle_watch),
                  idle_node_events=idle_events)
    assert max(recreate) < 15
    assert writes_after - writes_before == 0
    assert idle_watch == []
    assert idle_events == 0
    assert spec_writes_after == spec_writes_before  # no Node patch (readiness taint) while idle
    assert gpu.running and efa.running


def test_slice_deleted_while_the_watch_reconnects_after_an_apiserver_restart(api, nodes, control_plane):
    """The API server restarts: every watch breaks and the driver backs off. A slice deleted the moment the
    API is back (before the driver's watch is) is recreated within 15 s; a driver that started while the API
    was down publishes once it is back."""
    node = nodes.node("ff-wr", "p5.48xlarge")
    drv = node.start_driver("gpu")
    wait_registered(node, drv)
    wait_devices(api, node, drv, 8)
    control_plane.stop()
    efa = node.start_driver("efa")  # starts and registers with the API down
    wait_registered(node, efa)
    time.sleep(2)
    resource = client.ResourceV1Api(api)
    deleted_at: list[float] = []

    def delete_when_api_answers() -> None:  # the first moment the API serves, while the drivers back off
        deadline = time.monotonic() + 120
        while not deleted_at and time.monotonic() < deadline:
            try:
                for s in slices(api, node.name, GPU):
                    resource.delete_resource_slice(s["metadata"]["name"], _request_timeout=2)
                deleted_at.append(time.monotonic())
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.05)

    deleter = threading.Thread(target=delete_when_api_answers, daemon=True)
    deleter.start()
    control_plane.start()
    deleter.join(30)
    assert deleted_at, "the slices could not be deleted after the API came back"
    t0 = deleted_at[0]
    wait_devices(api, node, drv, 8, timeout=15)
    took = time.monotonic() - t0
    wait_devices(api, node, efa, 32, timeout=30)
    efa_took = time.monotonic() - t0
    record_figure("slice-delete-during-watch-reconnect", recreate_s=round(took, 3),
                  started_during_outage_published_s=round(efa_took, 3))
    assert drv.running and efa.running


def test_node_object_recreated_slices_follow_the_new_node_uid(api, nodes):
    """The Node object is deleted and the kubelet registers it again (new UID): the garbage collector deletes
    slices owned by the old UID, so the driver must republish them owned by the new Node, quickly and without
    a storm of writes."""
    node = nodes.node("ff-nr", "p5.48xlarge")
    drv = node.start_driver("gpu")  # its Node poll runs now, then every --resync-interval (30 s)
    wait_registered(node, drv)
    wait_devices(api, node, drv, 8)
    core = client.CoreV1Api(api)
    old_uid = raw(core.read_node, node.name)["metadata"]["uid"]
    creates_before = drv.metric("eks_dra_slice_writes_total", op="create")
    node.kubelet.stop()
    core.delete_node(node.name)
    wait_until(lambda: not slices(api, node.name, GPU), 30, what="slices garbage-collected with the Node")
    node.kubelet.start()  # registers the Node again
    t0 = time.monotonic()
    new_uid = raw(core.read_node, node.name)["metadata"]["uid"]
    assert new_uid != old_uid

    def owned_by_new_node():
        items = slices(api, node.name, GPU)
        return (pool_complete(items) and sum(len(s["spec"]["devices"]) for s in items) == 8
                and all(o["uid"] == new_uid for s in items for o in s["metadata"].get("ownerReferences") or []))

    try:
        wait_until(owned_by_new_node, 45 if FULL else 15, interval=0.1, what="slices owned by the new Node")
        took: float | None = time.monotonic() - t0
    except TimeoutError:
        took = None
    creates = drv.metric("eks_dra_slice_writes_total", op="create") - creates_before
    record_figure("node-recreated", republished_s=took and round(took, 3), slice_creates=creates)
    assert took is not None and took < 15, "slices not owned by the new Node within 15 s"
    assert creates <= 10, f"{creates:.0f} slice creates to republish one pool: a write storm"
    time.sleep(3)
    assert owned_by_new_node()  # and they stay (not garbage-collected again)


def test_slice_deleted_while_a_device_is_withdrawn_comes_back_without_it(api, nodes):
    node = nodes.node("ff-fd", "trn1.32xlarge")
    drv = node.start_driver("neuron")
    wait_devices(api, node, drv, 16)
    resource = client.ResourceV1Api(api)
    fixture.set_neuron_error(node.host, 5, 2)
    for s in slices(api, node.name, NEURON):  # in the same instant as the health change
        resource.delete_resource_slice(s["metadata"]["name"])
    wait_devices(api, node, drv, 15, timeout=15)
    assert neuron_device_name(5) not in device_names(api, node.name, NEURON)
    fixture.set_neuron_error(node.host, 5, 0)
    wait_devices(api, node, drv, 16, timeout=15)


def test_reboot_with_corrupt_checkpoint_rebuilds_claims_from_the_api(api, nodes):
    """Power loss: new boot id, empty CDI directory and a torn checkpoint at once. The claims of running pods
    come back from the API (allocated here, reserved) with their CDI specs."""
    node = nodes.node("ff-rc", "p5.48xlarge")
    drv = node.start_driver("gpu")
    wait_registered(node, drv)
    wait_devices(api, node, drv, 8)
    ns = make_namespace(api, "ff-rc")
    template = claim_template(api, ns, "one-gpu", ensure_device_class(api, GPU))
    pods = start_pods(api, ns, node, template, 2)
    expected = {uid: e for pod in pods.values() for uid, e in prepared(pod).items()}
    drv.terminate()
    node.kubelet.stop()
    fixture.set_boot_id(node.host)
    for path in node.cdi.iterdir():
        path.unlink()
    (node.state_dir("gpu") / "checkpoint.json").write_bytes(b'{"kind": "EksDraCheckpoint", "vers')
    node.kubelet.start()
    t0 = time.monotonic()
    node.start_driver("gpu")
    # Claims with neither record nor spec are reserved from the API (devices blocked), not prepared: only the
    # kubelet knows whether it still needs them. Kubelet 1.34 restores its claim cache unprepared
    # after its own restart (cm/dra/claiminfo.go newClaimInfoFromState: prepared=false) and calls
    # NodePrepareResources again; the stand-in keeps them prepared, so this test makes that call.
    wait_until(lambda: set(expected) <= checkpoint_claims(node, "gpu"), 60, interval=0.1,
               what="claims reserved from the API")
    claims = raw(client.ResourceV1Api(api).list_namespaced_resource_claim, ns)["items"]
    refs = [(c["metadata"]["namespace"], c["metadata"]["uid"], c["metadata"]["name"]) for c in claims
            if c["metadata"]["uid"] in expected]
    kubelet = wait_until(lambda: Kubelet(node.kubelet.registry_dir / f"{GPU}-reg.sock", timeout=45), 30,
                         what="plugin answering")
    assert {uid: e.error for uid, e in kubelet.prepare(refs).items()} == {uid: "" for uid in expected}
    kubelet.close()
    wait_until(lambda: set(expected) <= set(node.cdi_specs("gpu")), 60, interval=0.1,
               what="claims rebuilt from the API with their CDI specs")
    took = time.monotonic() - t0
    record_figure("reboot-with-corrupt-checkpoint", claims=len(expected), rebuilt_s=round(took, 3))
    for uid, entry in expected.items():
        ids = [i for d in node.cdi_specs("gpu")[uid]["devices"] for i in [d["name"]]]
        assert [f"{uid}-{d['deviceName']}" for d in entry["devices"]] == ids
    assert wait_until(lambda: node_events(api, node.name, "StateRebuilt"), 10, what="StateRebuilt Event")


# ----- reboot ----------------------------------------------------------------------------------------------

def test_reboot_new_boot_id_and_empty_cdi_dir_reapplies_every_prepared_claim(api, nodes):
    node = nodes.node("ff-rb", "p5.48xlarge")
    drv = node.start_driver("gpu")
    wait_registered(node, drv)
    wait_devices(api, node, drv, 8)
    ns = make_namespace(api, "ff-rb")
    template = claim_template(api, ns, "one-gpu", ensure_device_class(api, GPU))
    pods = start_pods(api, ns, node, template, 3)
    expected = {uid: entry for pod in pods.values() for uid, entry in prepared(pod).items()}
    specs_before = node.cdi_specs("gpu")
    assert set(expected) <= set(specs_before)

    drv.terminate()  # the node goes down: plugin and kubelet stop, /var/run/cdi (tmpfs) is empty afterwards
    node.kubelet.stop()
    fixture.set_boot_id(node.host)
    for path in node.cdi.iterdir():
        path.unlink()
    node.kubelet.start()
    t0 = time.monotonic()
    drv2 = node.start_driver("gpu")
    wait_until(lambda: set(expected) <= set(node.cdi_specs("gpu")), 60, interval=0.1,
               what="CDI specs of every prepared claim rewritten")
    took = time.monotonic() - t0
    record_figure("reboot", claims=len(expected), reapplied_s=round(took, 3))
    assert took < 60
    assert node.cdi_specs("gpu") == specs_before  # the same devices and edits as before the reboot
    wait_registered(node, drv2, count=2)
    k = Kubelet(node.kubelet.registry_dir / f"{GPU}-reg.sock", timeout=20)
    try:  # what the kubelet does when it restarts the containers: prepare again, same CDI ids
        by_uid = {c["uid"]: c for e in node.kubelet.events("prepare") for c in e["claims"]}
        answer = k.prepare([(by_uid[u]["namespace"], u, by_uid[u]["name"]) for u in expected])
        for uid, entry in expected.items():
            assert answer[uid].error == ""
            assert [list(d.cdi_device_ids) for d in answer[uid].devices] == \
                [d["cdiDeviceIds"] for d in entry["devices"]]
    finally:
        k.close()
    assert wait_until(lambda: node_events(api, node.name, "BootChanged"), 10, what="BootChanged Event")


def test_reboot_reapplies_gpu_time_slicing(api, nodes):
    """Device settings are re-applied after a reboot (the GPU forgets its compute policy), not trusted."""
    node = nodes.node("ff-ts", "p5.48xlarge")
    calls = node.host / FIXTURE_SMI_LOG  # the fixture driver root's nvidia-smi appends its arguments here
    drv = node.start_driver("gpu")
    wait_registered(node, drv)
    wait_devices(api, node, drv, 8)
    ns = make_namespace(api, "ff-ts")
    config = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
              "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}
    template = claim_template(api, ns, "shared", ensure_device_class(api, GPU), opaque=(GPU, config))
    pod = start_pods(api, ns, node, template, 1)["w-0"]
    (entry,) = prepared(pod).values()
    uuid = next(d["attributes"]["uuid"]["string"] for s in slices(api, node.name, GPU)
                for d in s["spec"]["devices"] if d["name"] == entry["devices"][0]["deviceName"])
    applied = f"compute-policy --set-timeslice=3 -i {uuid}"
    assert calls.read_text().splitlines() == [applied]

    drv.terminate()
    node.kubelet.stop()
    fixture.set_boot_id(node.host)
    for path in node.cdi.iterdir():
        path.unlink()
    node.kubelet.start()
    t0 = time.monotonic()
    node.start_driver("gpu")
    wait_until(lambda: calls.read_text().splitlines() == [applied, applied], 60, interval=0.1,
               what="time-slicing re-applied after the reboot")
    record_figure("reboot-time-slicing", reapplied_s=round(time.monotonic() - t0, 3))
    delete_pod(api, ns, "w-0")  # unprepare puts the GPU back to its default policy
    wait_until(lambda: calls.read_text().splitlines()[-1:] == [f"compute-policy --set-timeslice=0 -i {uuid}"], 30,
               what="time-slicing reverted at unprepare")


# ----- checkpoint corruption and versions -------------------------------------------------------------------

def test_corrupt_checkpoint_ready_event_and_new_claims_prepare(api, nodes):
    node = nodes.node("ff-cc", "p5.48xlarge")
    drv = node.start_driver("gpu")
    wait_registered(node, drv)
    wait_devices(api, node, drv, 8)
    ns = make_namespace(api, "ff-cc")
    template = claim_template(api, ns, "one-gpu", ensure_device_class(api, GPU))
    old = start_pods(api, ns, node, template, 2, "old")
    old_claims = {uid for pod in old.values() for uid in claim_uids(pod)}
    drv.terminate()
    path = node.state_dir("gpu") / "checkpoint.json"
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])  # truncated by a crash mid-write

    t0 = time.monotonic()
    drv2 = node.start_driver("gpu")
    wait_registered(node, drv2, count=2, timeout=30)
    drv2.wait_metrics(30)
    ready = time.monotonic() - t0
    wait_devices(api, node, drv2, 8, timeout=30)
    published = time.monotonic() - t0
    record_figure("corrupt-checkpoint", ready_s=round(ready, 3), slices_s=round(published, 3))
    assert published < 30
    events = wait_until(lambda: node_events(api, node.name, "CheckpointCorrupt"), 10, what="CheckpointCorrupt")
    assert events[0]["type"] == "Warning"
    assert list(node.state_dir("gpu").glob("checkpoint.json.corrupt-*"))  # moved aside for inspection
    wait_until(lambda: old_claims <= checkpoint_claims(node, "gpu"), 30, what="old claims rebuilt")
    create_pod(api, ns, "new", node.name, template)  # new claims prepare, on devices not taken by old ones
    new = wait_running(api, ns, "new", 60)
    new_devices = {d["deviceName"] for e in prepared(new).values() for d in e["devices"]}
    old_devices = {d["deviceName"] for pod in old.values() for e in prepared(pod).values() for d in e["devices"]}
    assert new_devices and not new_devices & old_devices
    for name in old:  # the rebuilt records unprepare cleanly
        delete_pod(api, ns, name)
    wait_until(lambda: not old_claims & checkpoint_claims(node, "gpu"), 30, what="old claims unprepared")
    assert not old_claims & set(node.cdi_specs("gpu"))
    assert [e["errors"] for e in node.kubelet.events("unprepare") if e.get("errors")] == []


def test_checkpoint_upgrade_from_previous_version_and_refusal_of_a_newer_one(api, nodes):
    node = nodes.node("ff-cv", "p5.48xlarge")
    drv = node.start_driver("gpu")
    wait_registered(node, drv)
    wait_devices(api, node, drv, 8)
    ns = make_namespace(api, "ff-cv")
    template = claim_template(api, ns, "one-gpu", ensure_device_class(api, GPU))
    pods = start_pods(api, ns, node, template, 2)
    claims = {uid for pod in pods.values() for uid in claim_uids(pod)}
    drv.terminate()
    store = CheckpointStore(node.state_dir("gpu"), GPU, node.name)
    store.save(store.load(), version=1)  # what driver version N-1 left on the node
    assert json.loads(store.path.read_bytes())["version"] == 1

    drv2 = node.start_driver("gpu")  # N reads N-1
    wait_registered(node, drv2, count=2)
    wait_devices(api, node, drv2, 8)
    doc = wait_until(lambda: (d := json.loads(store.path.read_bytes()))["version"] == 2 and d, 30,
                     what="checkpoint rewritten in version 2")
    assert set(doc["data"]["claims"]) == claims
    for name in pods:  # claims prepared by N-1 unprepare cleanly under N
        delete_pod(api, ns, name)
    wait_until(lambda: not claims & checkpoint_claims(node, "gpu"), 30, what="claims unprepared")
    assert [e["errors"] for e in node.kubelet.events("unprepare") if e.get("errors")] == []
    drv2.terminate()

    # N-1 refusing N: this driver reads versions <= 2; a file of version 3 stands for the next release's.
    cp = store.load()
    newer = json.loads(encode(cp, GPU, node.name))
    newer["version"] = newer["minReaderVersion"] = 3
    store.path.write_text(json.dumps(newer))
    untouched = store.path.read_bytes()
    drv3 = node.start_driver("gpu")
    assert drv3.proc.wait(30) == 3
    log = drv3.log_path.read_text()
    assert "refusing to run" in log and "newer driver" in log and "Traceback" not in log
    assert store.path.read_bytes() == untouched
    assert not list(node.state_dir("gpu").glob("checkpoint.json.corrupt-*"))  # not mistaken for corruption
    assert wait_until(lambda: node_events(api, node.name, "CheckpointTooNew"), 10, what="CheckpointTooNew Event")


# ----- rolling update under pod churn --------------------------------------------------------------------

def test_rolling_update_under_pod_churn_no_failed_prepare_no_slice_deletion(api, nodes):
    duration = scaled(30, 120)
    rate_per_min = 50
    node = nodes.node("ff-ru", "p5.48xlarge")
    old_uid, new_uid = "aaaaaaaa-1111-4000-8000-000000000001", "bbbbbbbb-2222-4000-8000-000000000002"
    old = node.start_driver("efa", pod_uid=old_uid)
    wait_registered(node, old)
    wait_devices(api, node, old, 32)
    ns = make_namespace(api, "ff-ru")
    template = claim_template(api, ns, "one-efa", ensure_device_class(api, EFA))
    watch = nodes.watch(node)
    # 50 pod creations a minute, each pod living ~6 s, across the whole upgrade
    with PodChurn(api, ns, node.name, template, prefix="p", interval_s=60 / rate_per_min, lifetime_s=6,
                  join_s=30) as churn:
        time.sleep(duration / 3)
        new = node.start_driver("efa", pod_uid=new_uid)  # maxSurge: 1, the new pod beside the old one
        wait_registered(node, new)
        time.sleep(duration / 6)
        assert old.terminate() == 0
        time.sleep(duration / 2)
    created = churn.created
    running = [n for n in created if (p := pod_state(api, ns, n)) is None or prepared(p)]
    failed = [(e["pod"], e["errors"]) for e in node.kubelet.events("prepare") if e.get("errors")]
    deletions = [e for e in watch.snapshot() if e.type == "DELETED"]
    watch.stop()
    record_figure("rolling-update", duration_s=duration, pods_created=len(created), failed_prepares=len(failed),
                  slice_deletions=len(deletions))
    assert len(created) >= duration * rate_per_min / 60 * 0.8
    assert failed == []
    assert deletions == []
    assert len(running) == len(created)  # every pod got its claim prepared (or was already gone again)
    wait_devices(api, node, new, 32, timeout=5)
    assert (node.kubelet.registry_dir / f"{EFA}-{new_uid}-reg.sock").exists()
    assert not (node.kubelet.registry_dir / f"{EFA}-{old_uid}-reg.sock").exists()


def test_rolling_update_from_the_previous_checkpoint_version_under_churn(api, nodes):
    """maxSurge upgrade N-1 -> N with live claims: the N-1 pod (checkpoint format 1) still serves while N
    starts beside it and upgrades the file; no failed prepare, no slice deletion, N-1's claims unprepare
    cleanly under N."""
    node = nodes.node("ff-uv", "p5.48xlarge")
    old_uid, new_uid = "cccccccc-1111-4000-8000-000000000001", "dddddddd-2222-4000-8000-000000000002"
    old = node.start_driver("gpu", pod_uid=old_uid, previous_version=True)
    wait_registered(node, old)
    wait_devices(api, node, old, 8)
    ns = make_namespace(api, "ff-uv")
    template = claim_template(api, ns, "one-gpu", ensure_device_class(api, GPU))
    live = start_pods(api, ns, node, template, 3, "live")
    live_claims = {uid for pod in live.values() for uid in claim_uids(pod)}
    store = CheckpointStore(node.state_dir("gpu"), GPU, node.name)
    assert json.loads(store.path.read_bytes())["version"] == 1
    watch = nodes.watch(node)
    # one GPU pod at a time on the remaining GPUs
    with PodChurn(api, ns, node.name, template, prefix="c", interval_s=1.5, lifetime_s=1.5) as churn:
        time.sleep(3)
        new = node.start_driver("gpu", pod_uid=new_uid)
        wait_registered(node, new)
        wait_until(lambda: json.loads(store.path.read_bytes())["version"] == 2, 30, what="checkpoint upgraded")
        time.sleep(3)
        old_exit = old.terminate()
        time.sleep(5)
    created = churn.created
    failed = [(e["pod"], e["errors"]) for e in node.kubelet.events("prepare") if e.get("errors")]
    deletions = [e for e in watch.snapshot() if e.type == "DELETED"]
    watch.stop()
    record_figure("rolling-update-from-previous-version", pods_created=len(created), failed_prepares=len(failed),
                  slice_deletions=len(deletions), old_exit=old_exit)
    assert failed == []
    assert deletions == []
    assert old_exit == 0
    assert live_claims <= checkpoint_claims(node, "gpu")
    for name in live:
        delete_pod(api, ns, name)
    wait_until(lambda: not live_claims & checkpoint_claims(node, "gpu"), 30, what="N-1's claims unprepared")
    assert [e["errors"] for e in node.kubelet.events("unprepare") if e.get("errors")] == []
    assert not live_claims & set(node.cdi_specs("gpu"))


# ----- double allocation, orphans ------------------------------------------------------------------------------

def test_forged_double_allocation_refused_and_nothing_injected(api, nodes):
    node = nodes.node("ff-da", "p5.48xlarge")
    drv = node.start_driver("gpu")
    wait_registered(node, drv)
    wait_devices(api, node, drv, 8)
    ns = make_namespace(api, "ff-da")
    dc = ensure_device_class(api, GPU)
    template = claim_template(api, ns, "one-gpu", dc)
    first = start_pods(api, ns, node, template, 1)["w-0"]
    (first_uid, entry), = prepared(first).items()
    device = entry["devices"][0]["deviceName"]
    spec_before = node.cdi_specs("gpu")[first_uid]

    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim(ns, {"metadata": {"name": "forged"}, "spec": {"devices": {
        "requests": [{"name": "dev", "exactly": {"deviceClassName": dc}}]}}})
    pod = raw(core.create_namespaced_pod, ns, {"metadata": {"name": "forged"}, "spec": {
        "nodeName": node.name,  # bound by hand: the scheduler never sees it
        "containers": [{"name": "ctr", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "dev"}]}}],
        "resourceClaims": [{"name": "dev", "resourceClaimName": "forged"}]}})
    resource.patch_namespaced_resource_claim_status("forged", ns, {"status": {
        "allocation": {"devices": {"results": [{"request": "dev", "driver": GPU, "pool": node.name, "device": device}]},
                       "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                           {"key": "metadata.name", "operator": "In", "values": [node.name]}]}]}},
        "reservedFor": [{"resource": "pods", "name": "forged", "uid": pod["metadata"]["uid"]}]}})
    forged_uid = raw(resource.read_namespaced_resource_claim, "forged", ns)["metadata"]["uid"]

    result = wait_until(lambda: prepared(pod_state(api, ns, "forged")).get(forged_uid), 60, what="forged prepare")
    assert "already prepared for claim" in result["error"] and first_uid in result["error"]
    assert result["devices"] == []
    assert pod_state(api, ns, "forged")["status"].get("phase") != "Running"
    assert forged_uid not in node.cdi_specs("gpu")  # nothing injected
    assert forged_uid not in checkpoint_claims(node, "gpu")
    assert node.cdi_specs("gpu")[first_uid] == spec_before
    record_figure("forged-double-allocation", refused=True, error=result["error"][:160])


def test_orphan_claim_deleted_while_plugin_down_cleaned_within_one_reconcile_interval(api, nodes):
    interval = 10.0
    node = nodes.node("ff-or", "p5.48xlarge")
    drv = node.start_driver("gpu", "--reconcile-interval", str(interval))
    wait_registered(node, drv)
    wait_devices(api, node, drv, 8)
    ns = make_namespace(api, "ff-or")
    dc = ensure_device_class(api, GPU)
    template = claim_template(api, ns, "one-gpu", dc)
    pod = start_pods(api, ns, node, template, 1)["w-0"]
    (orphan,) = claim_uids(pod)
    drv.terminate()
    node.kubelet.stop()  # plugin and kubelet down; pod and claim force-deleted meanwhile
    client.CoreV1Api(api).delete_namespaced_pod("w-0", ns, grace_period_seconds=0)
    resource = client.ResourceV1Api(api)
    wait_until(lambda: not raw(resource.list_namespaced_resource_claim, ns)["items"], 60,
               what="the generated claim deleted by the resourceclaim controller")
    assert orphan in checkpoint_claims(node, "gpu") and orphan in node.cdi_specs("gpu")

    drv2 = node.start_driver("gpu", "--reconcile-interval", str(interval))
    drv2.wait_metrics()  # started: the reconciler runs from here
    t0 = time.monotonic()
    wait_until(lambda: orphan not in checkpoint_claims(node, "gpu") and orphan not in node.cdi_specs("gpu"),
               interval + 10, interval=0.1, what="orphan cleaned")
    took = time.monotonic() - t0
    record_figure("orphan-cleanup", reconcile_interval_s=interval, cleaned_s=round(took, 3))
    assert took <= interval + 1  # within one interval of the driver being up (+ polling slack)
    assert wait_until(lambda: node_events(api, node.name, "OrphanCleaned"), 10, what="OrphanCleaned Event")
    assert drv2.metric("eks_dra_orphans_cleaned_total", kind="claim") >= 1
    node.kubelet.start()
    wait_registered(node, drv2, count=2)
    all_gpus = claim_template(api, ns, "all-gpus", dc, count=8)
    create_pod(api, ns, "all", node.name, all_gpus)  # the orphan's device is usable again
    wait_running(api, ns, "all", 60)


def test_cdi_dir_wiped_without_reboot_prepare_and_reconciler_rewrite_specs(api, nodes):
    """AT-7: /var/run/cdi emptied under a running plugin (same boot): a prepare of an already-prepared claim
    rewrites its spec at once; the reconciler rewrites the others within one interval."""
    interval = 5.0
    node = nodes.node("ff-cw", "p5.48xlarge")
    drv = node.start_driver("gpu", "--reconcile-interval", str(interval))
    wait_registered(node, drv)
    wait_devices(api, node, drv, 8)
    ns = make_namespace(api, "ff-cw")
    template = claim_template(api, ns, "one-gpu", ensure_device_class(api, GPU))
    pods = start_pods(api, ns, node, template, 3)
    specs = node.cdi_specs("gpu")
    first, *rest = [(ns, uid, c["name"]) for e in node.kubelet.events("prepare") for c in e["claims"]
                    for uid in [c["uid"]] if uid in specs]
    for path in node.cdi.iterdir():
        path.unlink()
    k = Kubelet(node.kubelet.registry_dir / f"{GPU}-reg.sock", timeout=20)
    try:
        t0 = time.monotonic()
        assert k.prepare([first])[first[1]].error == ""
        assert first[1] in node.cdi_specs("gpu")  # rewritten before the answer
        immediate = time.monotonic() - t0
    finally:
        k.close()
    wait_until(lambda: {uid for _, uid, _ in rest} <= set(node.cdi_specs("gpu")), interval + 2, interval=0.1,
               what="the reconciler rewriting the other specs")
    by_reconciler = time.monotonic() - t0
    record_figure("cdi-dir-wiped", claims=len(pods), prepare_rewrite_s=round(immediate, 3),
                  reconciler_rewrite_s=round(by_reconciler, 3), reconcile_interval_s=interval)
    assert node.cdi_specs("gpu") == specs
    assert wait_until(lambda: node_events(api, node.name, "CDISpecRewritten"), 10, what="CDISpecRewritten Event")


def test_host_driver_unloaded_under_a_live_plugin_retaints_node_and_keeps_slices(api, nodes):
    """A host driver reload (aicr#1704, NV#1144): the node is re-tainted while the devices are gone, the
    published slices are neither emptied nor shrunk, and everything is back once the driver has reloaded."""
    node = nodes.node("ff-ul", "p5.48xlarge", taints=["gpu"])
    drv = node.start_driver("gpu")
    wait_devices(api, node, drv, 8)
    core = client.CoreV1Api(api)

    def tainted() -> bool:
        return f"{GPU}/not-ready" in {t["key"] for t in raw(core.read_node, node.name)["spec"].get("taints") or []}

    wait_until(lambda: not tainted(), 30, what="readiness taint removed")
    watch = nodes.watch(node)
    t0 = time.monotonic()
    fixture.unload_driver(node.host, "gpu")
    wait_until(tainted, 15, what="node re-tainted")
    retainted = time.monotonic() - t0
    assert wait_until(lambda: node_events(api, node.name, "InventoryNotReady"), 10, what="InventoryNotReady Event")
    time.sleep(3)
    fixture.add_devices(node.host, "gpu")
    wait_until(lambda: not tainted(), 30, what="readiness taint removed after the reload")
    untainted = time.monotonic() - t0
    events = watch.snapshot()
    watch.stop()
    record_figure("host-driver-reload", retainted_s=round(retainted, 3), back_s=round(untainted, 3),
                  slice_events=[(e.type, e.devices) for e in events])
    assert [e for e in events if e.type == "DELETED" or e.devices != 8] == []
    assert len(device_names(api, node.name, GPU)) == 8
    assert drv.running


def test_plugin_started_before_all_devices_initialised_never_publishes_a_partial_pool(api, nodes):
    node = nodes.node("ff-pd", "trn1.32xlarge")
    fixture.remove_devices(node.host, "neuron", 5)  # the Neuron driver is still initialising 5 of 16
    fixture.remove_devices(node.host, "efa", 3)
    watch = nodes.watch(node)
    neuron, efa = node.start_driver("neuron"), node.start_driver("efa")
    wait_registered(node, neuron)
    wait_registered(node, efa)
    time.sleep(4)
    assert watch.snapshot() == []  # nothing at all while incomplete
    fixture.add_devices(node.host)
    t0 = time.monotonic()
    wait_devices(api, node, neuron, 16, timeout=60)
    wait_devices(api, node, efa, 8, timeout=60)
    took = time.monotonic() - t0
    events = watch.snapshot()
    watch.stop()
    record_figure("partial-devices-at-start", full_inventory_s=round(took, 3),
                  slice_events=[(e.type, e.driver, e.devices) for e in events])
    assert took < 60
    assert sorted((e.driver, e.devices) for e in events) == [(EFA, 8), (NEURON, 16)]


# ----- plugin before its devices ------------------------------------------------------------------------------

def test_plugin_started_before_devices_never_publishes_empty_and_node_stays_tainted(api, nodes):
    node = nodes.node("ff-bd", "p5.48xlarge", without_driver=True, taints=["gpu"])
    watch = nodes.watch(node)
    drv = node.start_driver("gpu")
    wait_registered(node, drv)
    ns = make_namespace(api, "ff-bd")
    template = claim_template(api, ns, "one-gpu", ensure_device_class(api, GPU))
    create_pod(api, ns, "early", node.name, template)
    time.sleep(5)  # the plugin runs without devices
    core = client.CoreV1Api(api)
    assert [e for e in watch.snapshot() if e.driver == GPU] == []  # nothing published, not even empty
    assert f"{GPU}/not-ready" in {t["key"] for t in raw(core.read_node, node.name)["spec"].get("taints") or []}
    assert not (pod_state(api, ns, "early")["spec"].get("nodeName"))
    assert drv.running

    fixture.add_devices(node.host, "gpu")  # the NVIDIA driver finishes loading
    t0 = time.monotonic()
    wait_devices(api, node, drv, 8, timeout=60)
    took = time.monotonic() - t0
    wait_until(lambda: f"{GPU}/not-ready" not in {t["key"] for t in raw(core.read_node, node.name)["spec"].get(
        "taints") or []}, 30, what="readiness taint removed")
    wait_running(api, ns, "early", 60)
    events = [e for e in watch.snapshot() if e.driver == GPU]
    watch.stop()
    record_figure("plugin-before-devices", full_inventory_s=round(took, 3),
                  slice_events=[(e.type, e.devices) for e in events])
    assert took < 60
    assert all(e.devices == 8 for e in events if e.type != "DELETED")  # never empty, never partial
    assert not [e for e in events if e.type == "DELETED"]


# ----- device faults --------------------------------------------------------------------------------------------

def _withdraw_and_restore(api, node, drv, total: int, inject, clear, expected_gone: set[str]) -> tuple[float, float]:
    t0 = time.monotonic()
    inject()
    wait_until(lambda: not expected_gone & set(device_names(api, node.name, drv.driver))
               and pool_complete(slices(api, node.name, drv.driver)), 10, interval=0.05,
               what=f"{sorted(expected_gone)} withdrawn")
    withdrawn = time.monotonic() - t0
    assert len(device_names(api, node.name, drv.driver)) == total - len(expected_gone)
    t1 = time.monotonic()
    clear()
    wait_until(lambda: len(device_names(api, node.name, drv.driver)) == total, 10, interval=0.05,
               what=f"{sorted(expected_gone)} restored")
    return withdrawn, time.monotonic() - t1


def test_injected_faults_withdrawn_within_10s_restored_without_restart(api, nodes):
    trn = nodes.node("ff-ft", "trn1.32xlarge")
    neuron, efa = trn.start_driver("neuron"), trn.start_driver("efa")
    wait_devices(api, trn, neuron, 16)
    wait_devices(api, trn, efa, 8)
    figures: dict[str, tuple[float, float]] = {}

    ibdev = sorted(p.name for p in (trn.host / "sys/class/infiniband").iterdir())[0]
    bdf = (trn.host / "sys/class/infiniband" / ibdev).resolve().parent.parent.name
    efa_name = "efa-" + bdf.replace(":", "-").replace(".", "-")
    figures["efa-port-down"] = _withdraw_and_restore(
        api, trn, efa, 8, lambda: fixture.set_efa_port_state(trn.host, ibdev, False),
        lambda: fixture.set_efa_port_state(trn.host, ibdev, True), {efa_name})
    figures["neuron-ecc"] = _withdraw_and_restore(
        api, trn, neuron, 16, lambda: fixture.set_neuron_error(trn.host, 3, 1),
        lambda: fixture.set_neuron_error(trn.host, 3, 0), {neuron_device_name(3)})

    mig = nodes.node("ff-fm", "p4d.24xlarge", mig_profile="3g.20gb")
    gpu = mig.start_driver("gpu")
    wait_until(lambda: pool_complete(slices(api, mig.name, GPU)), 60, what="MIG node slices")
    names = device_names(api, mig.name, GPU)
    family = {n for n in names if n == "gpu-2" or n.startswith("gpu-2-mig-")}
    assert len(family) > 1  # the GPU and/or its MIG devices
    figures["gpu-xid-with-mig"] = _withdraw_and_restore(
        api, mig, gpu, len(names), lambda: fixture.set_gpu_xid(mig.host, 2, 79),
        lambda: fixture.set_gpu_xid(mig.host, 2, None), family)

    record_figure("device-faults", **{k: {"withdrawn_s": round(w, 3), "restored_s": round(r, 3)}
                                      for k, (w, r) in figures.items()})
    for node, reasons in ((trn, 2), (mig, 1)):
        unhealthy = wait_until(lambda n=node, r=reasons: len(ev := node_events(api, n.name, "DeviceUnhealthy")) >= r
                               and ev, 10, what="DeviceUnhealthy Events")
        healthy = wait_until(lambda n=node, r=reasons: len(ev := node_events(api, n.name, "DeviceHealthy")) >= r
                             and ev, 10, what="DeviceHealthy Events")
        assert all(e["type"] == "Warning" for e in unhealthy) and all(e["type"] == "Normal" for e in healthy)
    assert all(d.running for d in (neuron, efa, gpu))  # no restart
    assert neuron.metric("eks_dra_health_changes_total", health="unhealthy") == 1
    assert neuron.metric("eks_dra_health_changes_total", health="healthy") == 1
    assert gpu.metric("eks_dra_unhealthy_devices") == 0
    assert max(w for w, _ in figures.values()) < 10


# ----- identity: pool = node name ---------------------------------------------------------------------------------

def test_two_nodes_with_the_same_device_names_allocate_concurrently(api, nodes):
    a, b = nodes.node("ff-ida", "p5.48xlarge"), nodes.node("ff-idb", "p5.48xlarge")
    group = f"ff-id-{a.name[-6:]}"
    core = client.CoreV1Api(api)
    drivers = []
    for n in (a, b):
        core.patch_node(n.name, {"metadata": {"labels": {"eks-dra.io/ff-group": group}}})
        drivers.append(n.start_driver("gpu"))
    for n, d in zip((a, b), drivers, strict=True):
        wait_devices(api, n, d, 8)
    assert device_names(api, a.name, GPU) == device_names(api, b.name, GPU)  # same names on both nodes
    ns = make_namespace(api, "ff-id")
    template = claim_template(api, ns, "all-gpus", ensure_device_class(api, GPU), count=8)
    for name in ("x", "y"):  # each needs every GPU of a node: only possible if the pools are told apart
        client.CoreV1Api(api).create_namespaced_pod(ns, {"metadata": {"name": name}, "spec": {
            "nodeSelector": {"eks-dra.io/ff-group": group},
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "dev"}]}}],
            "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": template}]}})
    x, y = wait_running(api, ns, "x", 90), wait_running(api, ns, "y", 90)
    assert {x["spec"]["nodeName"], y["spec"]["nodeName"]} == {a.name, b.name}
    pools = {d["poolName"] for p in (x, y) for e in prepared(p).values() for d in e["devices"]}
    assert pools == {a.name, b.name}
    record_figure("same-device-names", nodes=2, pods_running=2)
