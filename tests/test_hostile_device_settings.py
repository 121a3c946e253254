"""A claim can never change another claim's device settings.

Against a real driver process over the kubelet's gRPC: the GPU time-slice interval is a property of the physical
GPU, so only the one claim holding a GPU may set it. An adminAccess claim (monitoring, from another namespace)
never sets it; a claim may not set it on a GPU another claim holds; the interval goes back to Default only when
the GPU's last holder is unprepared. What the setup ran is read from the fixture driver root's nvidia-smi, which
records its arguments.
"""

from __future__ import annotations

import pytest
import yaml
from drivers.harness import DRIVERS, Sandbox, connect, make_claim

from eks_dra.devices import names
from eks_dra.devices.classes import DeviceClasses
from eks_dra.drivers.framework.checkpoint import CheckpointStore
from eks_dra.drivers.framework.lock import NodeLock
from eks_dra.drivers.gpu.fixture_root import FIXTURE_SMI_LOG
from eks_dra.planner.cel_env import CelEnvironment
from eks_dra.planner.claims import load_manifests
from eks_dra.planner.plan import Planner
from eks_dra.planner.simulate import nodes_for_instance_type

GPU = DRIVERS["gpu"]
MONITORING = "monitoring"  # the adminAccess claims' namespace


@pytest.fixture(scope="module")
def driver():
    box = Sandbox()
    node = box.node()
    box.spawn(node, "gpu", "--reconcile-interval", "3600")
    kubelet = connect(node)
    store = CheckpointStore(node.plugins / GPU, GPU, node.name)
    yield box.kube, node, kubelet, store
    kubelet.close()
    box.close()


def ts_config(interval: str) -> list[dict]:
    return [{"source": "FromClaim", "requests": [], "opaque": {"driver": GPU, "parameters": {
        "apiVersion": names.GPU_CONFIG_API_VERSION, "kind": names.GPU_CONFIG_KIND,
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}}}}]


def smi_calls(node) -> list[str]:
    log = node.host / FIXTURE_SMI_LOG
    return log.read_text().splitlines() if log.exists() else []


def prepare(kube, kubelet, device: str, name: str, *, interval: str | None = None, admin: bool = False):
    claim = kube.put_claim(make_claim(GPU, "node-a", [device], name=name, admin_access=admin,
                                      namespace=MONITORING if admin else "default",
                                      configs=ts_config(interval) if interval else None))
    return claim, kubelet.prepare([claim])[claim["metadata"]["uid"]].error


def unprepare(kubelet, claim) -> str:
    return kubelet.unprepare([claim])[claim["metadata"]["uid"]].error


def uid(claim) -> str:
    return claim["metadata"]["uid"]


def applied_interval(store, claim, device: str) -> str | None:
    rec = store.load().claims[uid(claim)]
    return (rec.settings.get("applied") or {}).get("devices", {}).get(device, {}).get("timeSliceInterval")


def gpu_uuid(store, claim, device: str) -> str:
    return store.load().claims[uid(claim)].settings["applied"]["devices"][device]["uuid"]


def test_admin_claim_cannot_change_the_interval_another_claim_set(driver):
    kube, node, kubelet, store = driver
    a, error = prepare(kube, kubelet, "gpu-0", "train", interval="Long")
    assert error == ""
    uuid = gpu_uuid(store, a, "gpu-0")
    assert smi_calls(node)[-1] == f"compute-policy --set-timeslice=3 -i {uuid}"
    before = len(smi_calls(node))

    b, error = prepare(kube, kubelet, "gpu-0", "watch", interval="Short", admin=True)
    assert error.startswith(f"{GPU}: claim {MONITORING}/watch ({uid(b)}): request req has adminAccess and its "
                            "config sets timeSliceInterval Short on device gpu-0: an adminAccess claim never changes "
                            "a device's settings"), error
    assert "remove the setting from the claim's or its DeviceClass's config" in error
    assert f"(device gpu-0 is in use by claim default/train ({uid(a)}))" in error
    assert smi_calls(node)[before:] == []  # the GPU still runs Long
    assert uid(b) not in store.load().claims and not (node.cdi / f"k8s.{GPU}-claim_{uid(b)}.json").exists()
    assert applied_interval(store, a, "gpu-0") == "Long"

    assert unprepare(kubelet, b) == ""
    assert smi_calls(node)[before:] == []  # B's unprepare reset nothing
    assert applied_interval(store, a, "gpu-0") == "Long"

    assert unprepare(kubelet, a) == ""
    assert smi_calls(node)[before:] == [f"compute-policy --set-timeslice=0 -i {uuid}"]


def test_admin_claim_without_settings_shares_and_its_unprepare_changes_nothing(driver):
    kube, node, kubelet, store = driver
    a, error = prepare(kube, kubelet, "gpu-1", "train-1", interval="Medium")
    assert error == ""
    uuid = gpu_uuid(store, a, "gpu-1")
    before = len(smi_calls(node))
    b, error = prepare(kube, kubelet, "gpu-1", "watch-1", admin=True)
    assert error == ""
    assert unprepare(kubelet, b) == ""
    assert smi_calls(node)[before:] == []
    assert applied_interval(store, a, "gpu-1") == "Medium"
    assert unprepare(kubelet, a) == ""
    assert smi_calls(node)[before:] == [f"compute-policy --set-timeslice=0 -i {uuid}"]


def test_revert_waits_until_the_last_holder_is_unprepared(driver):
    kube, node, kubelet, store = driver
    a, error = prepare(kube, kubelet, "gpu-2", "train-2", interval="Long")
    assert error == ""
    uuid = gpu_uuid(store, a, "gpu-2")
    b, error = prepare(kube, kubelet, "gpu-2", "watch-2", admin=True)
    assert error == ""
    before = len(smi_calls(node))

    assert unprepare(kubelet, a) == ""
    assert smi_calls(node)[before:] == []  # B still holds the GPU: nothing changes under it
    inherited = store.load().claims[uid(b)].settings["inherited"]
    assert [p["devices"]["gpu-2"]["timeSliceInterval"] for p in inherited] == ["Long"]

    assert unprepare(kubelet, b) == ""  # the last holder: now back to Default
    assert smi_calls(node)[before:] == [f"compute-policy --set-timeslice=0 -i {uuid}"]
    assert uid(b) not in store.load().claims


def test_no_claim_sets_the_interval_of_a_gpu_an_admin_claim_holds(driver):
    kube, node, kubelet, store = driver
    b, error = prepare(kube, kubelet, "gpu-3", "watch-3", admin=True)
    assert error == ""
    before = len(smi_calls(node))

    a, error = prepare(kube, kubelet, "gpu-3", "train-3", interval="Long")
    assert error == (f"{GPU}: claim default/train-3 ({uid(a)}): request req sets timeSliceInterval Long on device "
                     f"gpu-3, which claim {MONITORING}/watch-3 ({uid(b)}) also holds with adminAccess: a device's "
                     "settings belong to the one claim holding it, and this would change them under that claim's "
                     "workload; retry once that claim is unprepared (its pods gone), or remove the setting from "
                     "this claim's config")
    assert smi_calls(node)[before:] == [] and uid(a) not in store.load().claims

    # Without a setting the workload shares the GPU with the adminAccess claim (not a double allocation).
    plain, error = prepare(kube, kubelet, "gpu-3", "plain-3")
    assert error == ""
    assert unprepare(kubelet, plain) == "" and unprepare(kubelet, b) == ""
    assert smi_calls(node)[before:] == []


def test_admin_claim_may_not_set_the_interval_of_a_free_gpu(driver):
    kube, node, kubelet, store = driver
    before = len(smi_calls(node))
    b, error = prepare(kube, kubelet, "gpu-4", "watch-4", interval="Default", admin=True)
    assert "request req has adminAccess and its config sets timeSliceInterval Default on device gpu-4" in error
    assert "in use by" not in error
    assert smi_calls(node)[before:] == [] and uid(b) not in store.load().claims


def test_holder_gets_its_interval_back_from_a_checkpoint_of_the_old_rule(driver):
    """A checkpoint written before this rule: adminAccess claim B set Short over A's Long. B's unprepare puts
    back what A, the remaining holder, asked for; A's unprepare then resets to Default."""
    kube, node, kubelet, store = driver
    a, error = prepare(kube, kubelet, "gpu-5", "train-5", interval="Long")
    assert error == ""
    b, error = prepare(kube, kubelet, "gpu-5", "watch-5", admin=True)
    assert error == ""
    uuid = gpu_uuid(store, a, "gpu-5")
    with NodeLock(node.plugins / GPU).held():
        cp = store.load()
        rec = cp.claims[uid(b)]
        rec.settings["requested"] = {"gpu-5": {"timeSliceInterval": "Short"}}
        rec.settings["applied"] = {"mode": "nvidia-smi", "devices": {"gpu-5": {"timeSliceInterval": "Short",
                                                                                "uuid": uuid}}}
        store.save(cp)
    before = len(smi_calls(node))
    assert unprepare(kubelet, b) == ""
    assert smi_calls(node)[before:] == [f"compute-policy --set-timeslice=3 -i {uuid}"]  # Long again, not Default
    assert unprepare(kubelet, a) == ""
    assert smi_calls(node)[-1] == f"compute-policy --set-timeslice=0 -i {uuid}"
    assert set(smi_calls(node)[before + 1:]) == {f"compute-policy --set-timeslice=0 -i {uuid}"}


def test_plan_predicts_the_admin_refusal_with_the_drivers_text(tmp_path, driver):
    kube, node, kubelet, _ = driver
    doc = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": "watch", "namespace": MONITORING},
           "spec": {"devices": {
               "requests": [{"name": "req", "exactly": {"deviceClassName": names.DEFAULT_DRIVER_NAMES.class_name("gpu"),
                                                        "adminAccess": True}}],
               "config": ts_config("Short")}}}
    path = tmp_path / "watch.yaml"
    path.write_text(yaml.safe_dump(doc))
    env = CelEnvironment()
    manifests = load_manifests([path], env, builtin_classes=tuple(DeviceClasses({}, names.DEFAULT_DRIVER_NAMES).all()))
    result = Planner(env, nodes_for_instance_type("p5.48xlarge", 1),
                     config_drivers={GPU: "gpu"}).run(manifests.pods)
    (claim,) = result.claims
    assert not claim.allocated
    prefix = f"prepare would fail: {GPU}: request req has adminAccess and its config sets timeSliceInterval Short on "
    assert claim.reason.startswith(prefix + "device gpu-0:"), claim.reason
    _, error = prepare(kube, kubelet, "gpu-0", "watch-plan", interval="Short", admin=True)
    assert error.split(": ", 2)[2] == claim.reason.split(": ", 2)[2], (error, claim.reason)
