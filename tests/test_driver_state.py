"""Prepare/unprepare semantics: claim checks, strict configs, device settings, double allocation,
hostile requests, concurrency."""

from __future__ import annotations

import json
import shutil
import threading
import uuid

import pytest
from drivers.fake_kube import FakeKube
from drivers.harness import DRIVERS, Node, kubelet_for, make_claim, short_tmp, start_driver

from eks_dra.devices.neuron import neuron_device_name
from eks_dra.drivers.families import get_family
from eks_dra.drivers.framework import configs
from eks_dra.drivers.gpu.fixture_root import FIXTURE_SMI_LOG

GPU, EFA, NEURON = DRIVERS["gpu"], DRIVERS["efa"], DRIVERS["neuron"]


@pytest.fixture(scope="module")
def p5():
    """One p5 node with gpu and efa drivers and their kubelet clients (shared: each test uses fresh claims)."""
    base = short_tmp()
    kube = FakeKube()
    node = Node(base / "a", "p5.48xlarge", "node-a")
    kube.add_node("node-a")
    drivers = {f: start_driver(kube, node, f, reconcile_interval_s=3600) for f in ("gpu", "efa")}
    kubelets = {f: kubelet_for(node, f) for f in drivers}
    yield kube, node, drivers, kubelets
    for k in kubelets.values():
        k.close()
    for d in drivers.values():
        d.stop(0.5)
    kube.close()
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def trn2():
    base = short_tmp()
    kube = FakeKube()
    node = Node(base / "t", "trn2.48xlarge", "node-t")
    kube.add_node("node-t")
    driver = start_driver(kube, node, "neuron", reconcile_interval_s=3600)
    kubelet = kubelet_for(node, "neuron")
    yield kube, node, driver, kubelet
    kubelet.close()
    driver.stop(0.5)
    kube.close()
    shutil.rmtree(base, ignore_errors=True)


def prepare_one(kube, kubelet, claim):
    claim = kube.put_claim(claim)
    out = kubelet.prepare([claim])
    return claim, out[claim["metadata"]["uid"]]


def ts_config(interval="Long", source="FromClaim", requests=None, driver=GPU, **extra):
    params = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
              "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}, **extra}
    return {"source": source, "requests": requests or [], "opaque": {"driver": driver, "parameters": params}}


def _smi_calls(node) -> list[str]:
    log = node.host / FIXTURE_SMI_LOG
    return log.read_text().splitlines() if log.exists() else []


def test_time_slicing_runs_the_driver_roots_nvidia_smi_and_later_config_wins(p5):
    kube, node, drivers, kubelets = p5
    before = len(_smi_calls(node))
    claim, entry = prepare_one(kube, kubelets["gpu"], make_claim(
        GPU, "node-a", ["gpu-0", "gpu-1"], requests=["a", "b"],
        configs=[ts_config("Short", "FromClaim", ["a"]), ts_config("Medium", "FromClass")]))
    assert entry.error == ""
    rec = drivers["gpu"].store.load().claims[claim["metadata"]["uid"]]
    # class config (Medium) for all requests first, then the claim's (Short) for request a
    assert rec.settings["requested"] == {"gpu-0": {"timeSliceInterval": "Short"},
                                         "gpu-1": {"timeSliceInterval": "Medium"}}
    applied = rec.settings["applied"]
    assert applied["mode"] == "nvidia-smi"  # the fixture driver root's nvidia-smi (records its arguments)
    assert applied["devices"]["gpu-0"]["timeSliceInterval"] == "Short"
    uuids = [applied["devices"][d]["uuid"] for d in ("gpu-0", "gpu-1")]
    assert _smi_calls(node)[before:] == [f"compute-policy --set-timeslice=1 -i {uuids[0]}",
                                         f"compute-policy --set-timeslice=2 -i {uuids[1]}"]
    kubelets["gpu"].unprepare([claim])
    assert _smi_calls(node)[before + 2:] == [f"compute-policy --set-timeslice=0 -i {u}" for u in uuids]


def test_time_slicing_without_a_usable_nvidia_smi_fails_the_claim_naming_the_path(p5):
    kube, node, drivers, kubelets = p5
    smi = node.host / "usr/bin/nvidia-smi"
    saved = smi.read_bytes()
    smi.unlink()
    try:
        claim, entry = prepare_one(kube, kubelets["gpu"], make_claim(GPU, "node-a", ["gpu-2"],
                                                                     configs=[ts_config("Long")]))
        assert "not applied" in entry.error and str(node.host / "usr/bin/nvidia-smi") in entry.error
        assert len(entry.devices) == 0
        assert not drivers["gpu"].store.load().claims[claim["metadata"]["uid"]].completed
        assert not (node.cdi / f"k8s.{GPU}-claim_{claim['metadata']['uid']}.json").exists()
        assert drivers["gpu"].metrics.value("eks_dra_gpu_tool_unavailable_total", tool="nvidia-smi") == 1
        again, entry = prepare_one(kube, kubelets["gpu"], make_claim(GPU, "node-a", ["gpu-3"], name="again",
                                                                     configs=[ts_config("Long")]))
        assert "not applied" in entry.error
        assert drivers["gpu"].metrics.value("eks_dra_gpu_tool_unavailable_total", tool="nvidia-smi") == 1  # once
        # a claim without settings needs no nvidia-smi
        plain, entry = prepare_one(kube, kubelets["gpu"], make_claim(GPU, "node-a", ["gpu-4"], name="plain"))
        assert entry.error == ""
        kubelets["gpu"].unprepare([plain, claim, again])
    finally:
        smi.write_bytes(saved)
        smi.chmod(0o755)


def test_neuron_lnc_environment(trn2):
    kube, node, driver, kubelet = trn2
    cfg = {"source": "FromClaim", "requests": [], "opaque": {"driver": NEURON, "parameters": {
        "apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1}}}
    claim, entry = prepare_one(kube, kubelet, make_claim(NEURON, "node-t", [neuron_device_name(2), neuron_device_name(3)], configs=[cfg]))
    assert entry.error == ""
    spec = json.loads((node.cdi / f"k8s.{NEURON}-claim_{claim['metadata']['uid']}.json").read_text())
    env = spec["containerEdits"]["env"]
    assert "NEURON_LOGICAL_NC_CONFIG=1" in env
    assert "NEURON_RT_VISIBLE_CORES=16-31" in env  # 8 physical cores per Trainium2, devices 2 and 3
    assert [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]] == ["/dev/neuron2"]
    kubelet.unprepare([claim])
    claim, entry = prepare_one(kube, kubelet, make_claim(NEURON, "node-t", [neuron_device_name(4)]))
    spec = json.loads((node.cdi / f"k8s.{NEURON}-claim_{claim['metadata']['uid']}.json").read_text())
    assert "NEURON_LOGICAL_NC_CONFIG=2" in spec["containerEdits"]["env"]  # Trainium2 default
    assert "NEURON_RT_VISIBLE_CORES=16-19" in spec["containerEdits"]["env"]
    kubelet.unprepare([claim])


def test_double_allocation_refused_and_nothing_injected(p5):
    kube, node, drivers, kubelets = p5
    first, entry = prepare_one(kube, kubelets["gpu"], make_claim(GPU, "node-a", ["gpu-6"]))
    assert entry.error == ""
    forged, entry = prepare_one(kube, kubelets["gpu"], make_claim(GPU, "node-a", ["gpu-6"], name="forged"))
    assert "already prepared for claim default/" in entry.error and first["metadata"]["uid"] in entry.error
    assert len(entry.devices) == 0
    assert not (node.cdi / f"k8s.{GPU}-claim_{forged['metadata']['uid']}.json").exists()
    assert forged["metadata"]["uid"] not in drivers["gpu"].store.load().claims
    # adminAccess may share (monitoring)
    admin, entry = prepare_one(kube, kubelets["gpu"], make_claim(GPU, "node-a", ["gpu-6"], admin_access=True))
    assert entry.error == ""
    kubelets["gpu"].unprepare([first, admin])


def test_reprepare_rewrites_missing_spec(p5):
    kube, node, drivers, kubelets = p5
    device = sorted(drivers["efa"].inventory.devices)[0]
    claim, entry = prepare_one(kube, kubelets["efa"], make_claim(EFA, "node-a", [device]))
    assert entry.error == ""
    spec = node.cdi / f"k8s.{EFA}-claim_{claim['metadata']['uid']}.json"
    spec.unlink()
    kube.delete_claim("default", claim["metadata"]["name"])  # the recorded result must not need the API
    again = kubelets["efa"].prepare([claim])[claim["metadata"]["uid"]]
    assert again == entry
    assert spec.exists()
    assert drivers["efa"].metrics.value("eks_dra_cdi_specs_rewritten_total") >= 1
    kubelets["efa"].unprepare([claim])


def test_missing_device_node_refused_until_it_is_back(p5):
    # The host driver went away between two inventory polls: no CDI spec may name a /dev node that is gone.
    kube, node, drivers, kubelets = p5
    dev = node.host / "dev" / "nvidia7"
    saved = dev.read_bytes()
    dev.unlink()
    try:
        claim, entry = prepare_one(kube, kubelets["gpu"], make_claim(GPU, "node-a", ["gpu-7"], name="no-dev-node"))
        assert "device node /dev/nvidia7 of gpu-7 is missing on node node-a" in entry.error
        assert not (node.cdi / f"k8s.{GPU}-claim_{claim['metadata']['uid']}.json").exists()
        assert claim["metadata"]["uid"] not in drivers["gpu"].store.load().claims
    finally:
        dev.write_bytes(saved)
    again = kubelets["gpu"].prepare([claim])[claim["metadata"]["uid"]]
    assert again.error == "" and len(again.devices) == 1
    kubelets["gpu"].unprepare([claim])


def hostile_cases(node_name: str):
    """(description, claim to store or None, ref override) — each must get a per-claim error."""
    good = lambda **kw: make_claim(GPU, node_name, ["gpu-4"], **kw)  # noqa: E731
    cases = []

    def cfg_case(desc, params, driver=GPU):
        cases.append((desc, good(configs=[{"source": "FromClaim", "requests": [],
                                           "opaque": {"driver": driver, "parameters": params}}]), None))

    base = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}
    cfg_case("unknown kind", {**base, "kind": "MigConfig"})
    cfg_case("wrong apiVersion", {**base, "apiVersion": "gpu.nvidia.com/v2"})
    cfg_case("pre-upstream apiVersion", {**base, "apiVersion": "gpu.eks-dra.io/v1"})
    cfg_case("unknown top field", {**base, "sharingg": {}})
    cfg_case("unknown sharing field", {**base, "sharing": {"strategy": "TimeSlicing", "mps": {}}})
    cfg_case("MPS strategy", {**base, "sharing": {"strategy": "MPS"}})
    cfg_case("bad interval", {**base, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "X"}}})
    cfg_case("interval int", {**base, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": 5}}})
    cfg_case("unknown ts field", {**base, "sharing": {"strategy": "TimeSlicing",
                                                      "timeSlicingConfig": {"interval": "Long", "x": 1}}})
    cfg_case("sharing not object", {**base, "sharing": "TimeSlicing"})
    cfg_case("parameters list", [1, 2, 3])
    cfg_case("parameters string", "GpuConfig")
    cfg_case("parameters null", None)
    cfg_case("oversized parameters", {**base, "sharing": {"strategy": "TimeSlicing"}, "pad": "x" * 20000})
    cfg_case("deeply nested", {**base, "sharing": {"strategy": {"a": {"b": {"c": {}}}}}})
    cfg_case("neuron kind to gpu driver", {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig"})
    cfg_case("kind missing", {"apiVersion": "resource.nvidia.com/v1beta1"})
    cfg_case("empty object", {})
    bad_requests = good(configs=[{"source": "FromClaim", "requests": "all",
                                  "opaque": {"driver": GPU, "parameters": base}}])
    cases.append(("config requests not a list", bad_requests, None))
    cases.append(("config list not a list", _with(good(), ["status", "allocation", "devices", "config"], {"a": 1}),
                  None))
    cases.append(("config entry not object", _with(good(), ["status", "allocation", "devices", "config"], [7]), None))
    cases.append(("wrong driver", make_claim("other.example.com", node_name, ["gpu-4"]), None))
    cases.append(("foreign node pool", make_claim(GPU, node_name, ["gpu-4"], pool="node-z"), None))
    foreign = make_claim(GPU, node_name, ["gpu-4"])
    foreign["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] = ["node-z"]
    cases.append(("foreign node selector", foreign, None))
    cases.append(("unknown device", make_claim(GPU, node_name, ["gpu-99"]), None))
    cases.append(("path-like device", make_claim(GPU, node_name, ["../../etc/passwd"]), None))
    cases.append(("device with slash", make_claim(GPU, node_name, ["gpu-1/x"]), None))
    cases.append(("oversized device name", make_claim(GPU, node_name, ["g" * 300]), None))
    cases.append(("same device twice", make_claim(GPU, node_name, ["gpu-4", "gpu-4"]), None))
    unallocated = make_claim(GPU, node_name, ["gpu-4"])
    del unallocated["status"]["allocation"]
    cases.append(("not allocated", unallocated, None))
    no_status = make_claim(GPU, node_name, ["gpu-4"])
    del no_status["status"]
    cases.append(("no status", no_status, None))
    cases.append(("missing claim", None, ("default", str(uuid.uuid4()), "does-not-exist")))
    replaced = make_claim(GPU, node_name, ["gpu-4"])
    cases.append(("uid mismatch (re-created)", replaced, ("default", str(uuid.uuid4()), replaced["metadata"]["name"])))
    cases.append(("path-like uid", None, ("default", "../../../etc", "x")))
    cases.append(("empty uid", None, ("default", "", "x")))
    cases.append(("oversized uid", None, ("default", "a" * 5000, "x")))
    cases.append(("path-like namespace", None, ("../kube-system", str(uuid.uuid4()), "x")))
    cases.append(("empty namespace", None, ("", str(uuid.uuid4()), "x")))
    cases.append(("path-like name", None, ("default", str(uuid.uuid4()), "../../secrets")))
    cases.append(("oversized name", None, ("default", str(uuid.uuid4()), "n" * 1000)))
    cases.append(("unicode name", None, ("default", str(uuid.uuid4()), "gpü")))
    cases.append(("nul in name", None, ("default", str(uuid.uuid4()), "a\x00b")))
    results_not_list = make_claim(GPU, node_name, ["gpu-4"])
    results_not_list["status"]["allocation"]["devices"]["results"] = "gpu-4"
    cases.append(("results not a list", results_not_list, None))
    return cases


def _with(claim, path, value):
    node = claim
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return claim


def test_hostile_requests_each_get_a_per_claim_error(p5):
    kube, node, drivers, kubelets = p5
    cases = hostile_cases("node-a")
    assert len(cases) >= 40
    refs, names = [], {}
    for desc, claim, ref in cases:
        if claim is not None:
            stored = kube.put_claim(claim)
            meta = stored["metadata"]
            ref = ref or (meta["namespace"], meta["uid"], meta["name"])
        refs.append(ref)
        names[ref[1]] = desc
    good = kube.put_claim(make_claim(GPU, "node-a", ["gpu-7"]))
    good_ref = (good["metadata"]["namespace"], good["metadata"]["uid"], good["metadata"]["name"])
    out = kubelets["gpu"].prepare(refs + [good_ref])  # one request: bad claims must not fail the good one
    assert out[good_ref[1]].error == "" and len(out[good_ref[1]].devices) == 1
    for ref in refs:
        assert ref[1] in out, names[ref[1]]
        assert out[ref[1]].error, f"{names[ref[1]]}: no error"
        assert len(out[ref[1]].devices) == 0
    errors = {names[r[1]]: out[r[1]].error for r in refs}
    assert "sharingg: unknown field" in errors["unknown top field"]
    assert "timeSlicingConfig.x: unknown field" in errors["unknown ts field"]
    assert "more than the 10240 allowed" in errors["oversized parameters"]
    assert "allocated to another node" in errors["foreign node pool"]
    assert "does not exist on node node-a" in errors["unknown device"]
    assert "not found" in errors["missing claim"]
    assert "deleted and re-created" in errors["uid mismatch (re-created)"]
    for ref in refs:  # each hostile one, alone, too
        single = kubelets["gpu"].prepare([ref])
        assert single[ref[1]].error
    # the process keeps serving, nothing leaked
    assert set(drivers["gpu"].store.load().claims) == {good_ref[1]}
    assert drivers["gpu"].cdi.claim_uids() == {good_ref[1]}
    assert kubelets["gpu"].unprepare([good_ref])[good_ref[1]].error == ""
    assert kubelets["gpu"].prepare([]) == {}


def test_efa_takes_no_configuration(p5):
    kube, node, drivers, kubelets = p5
    dev = sorted(drivers["efa"].inventory.devices)[1]
    _, entry = prepare_one(kube, kubelets["efa"], make_claim(EFA, "node-a", [dev], configs=[
        {"source": "FromClass", "requests": [], "opaque": {"driver": EFA, "parameters": {"apiVersion": "v1"}}}]))
    assert "takes no configuration" in entry.error


def test_hundred_concurrent_prepares_no_deadlock(p5):
    kube, node, drivers, kubelets = p5
    devices = sorted(drivers["efa"].inventory.devices)
    claims = [kube.put_claim(make_claim(EFA, "node-a", [devices[i % len(devices)]])) for i in range(100)]
    results: dict[str, object] = {}
    errors: list[Exception] = []

    def call(c):
        try:
            results.update(kubelets["efa"].prepare([c]))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(c,)) for c in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert not errors
    assert len(results) == 100
    ok = [uid for uid, e in results.items() if not e.error]
    assert len(ok) == len(devices)  # one claim per device wins, the others are refused as double allocations
    owners: dict[str, str] = {}
    for uid in ok:
        for d in results[uid].devices:
            assert d.device_name not in owners
            owners[d.device_name] = uid
    refused = [e.error for e in results.values() if e.error]
    assert all("already prepared for claim" in e for e in refused)
    kubelets["efa"].unprepare(claims)
    assert drivers["efa"].store.load().claims == {}


def test_configs_unit_later_wins_and_subrequests():
    params = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
              "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}
    out = configs.settings_per_request(get_family("gpu"), GPU, [
        {"source": "FromClaim", "requests": ["r"], "opaque": {"driver": GPU, "parameters": params}},
        {"source": "FromClass", "requests": [], "opaque": {"driver": GPU, "parameters": {**params, "sharing": {
            "strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}}}},
        {"source": "FromClaim", "requests": [], "opaque": {"driver": "other.io", "parameters": {"junk": 1}}},
    ], ["r/fast", "s"])
    assert out["r/fast"].get("timeSliceInterval") == "Long"
    assert out["s"].get("timeSliceInterval") == "Short"


def test_time_slicing_commands_on_a_node_with_nvidia_smi():
    """The real path, with the command runner recorded instead of executed (no GPU here)."""
    from eks_dra.devices import Device
    from eks_dra.drivers.framework.configs import DeviceSettings
    from eks_dra.drivers.gpu.setup import GpuSetup

    commands: list[list[str]] = []
    setup = GpuSetup(runner=commands.append)
    gpu = Device("gpu-0", {"uuid": "GPU-aaa"})
    mig = Device("gpu-1-mig-1g-10gb-0", {"uuid": "MIG-bbb", "parentUUID": "GPU-ccc"})
    long, default = DeviceSettings.of(timeSliceInterval="Long"), DeviceSettings()
    assert setup.changes_hardware([long]) and not setup.changes_hardware([default])
    env, applied = setup.apply([(gpu, long), (mig, DeviceSettings.of(timeSliceInterval="Short"))])
    assert commands == [["nvidia-smi", "compute-policy", "--set-timeslice=3", "-i", "GPU-aaa"],
                        ["nvidia-smi", "compute-policy", "--set-timeslice=1", "-i", "GPU-ccc"]]  # MIG: its parent
    assert applied["mode"] == "nvidia-smi" and env == {}
    commands.clear()
    setup.revert(applied)
    assert commands == [["nvidia-smi", "compute-policy", "--set-timeslice=0", "-i", "GPU-aaa"],
                        ["nvidia-smi", "compute-policy", "--set-timeslice=0", "-i", "GPU-ccc"]]
