"""Bad opaque configs in the forms of the EKS guide and the vendors' docs get a per-claim error naming the field,
at plan time (`eks-dra plan`) and at prepare time (our driver over the kubelet's gRPC), with the same text."""

from __future__ import annotations

import shutil

import pytest
import yaml
from drivers.fake_kube import FakeKube
from drivers.harness import DRIVERS, Node, kubelet_for, make_claim, short_tmp, start_driver

from eks_dra.devices import names
from eks_dra.devices.classes import DeviceClasses
from eks_dra.devices.neuron import neuron_device_name
from eks_dra.drivers.families import get_family
from eks_dra.drivers.framework import configs
from eks_dra.planner.cel_env import CelEnvironment
from eks_dra.planner.claims import load_manifests
from eks_dra.planner.plan import Planner
from eks_dra.planner.simulate import nodes_for_instance_type

GPU_CONFIG = {"apiVersion": names.GPU_CONFIG_API_VERSION, "kind": names.GPU_CONFIG_KIND}
MIG_CONFIG = {"apiVersion": names.GPU_CONFIG_API_VERSION, "kind": names.MIG_CONFIG_KIND}
NEURON_CONFIG = {"apiVersion": names.NEURON_CONFIG_API_VERSION, "kind": names.NEURON_CONFIG_KIND}

# (id, family, instance type, MIG profile, device to prepare, parameters, the field the error names)
CASES = [
    ("lnc-3", "neuron", "trn2.48xlarge", None, neuron_device_name(0), {**NEURON_CONFIG, "logicalNeuronCore": 3},
     "logicalNeuronCore: 3 is not 1 or 2"),
    ("mps", "gpu", "p5.48xlarge", None, "gpu-0", {**GPU_CONFIG, "sharing": {"strategy": "MPS"}},
     "sharing.strategy: MPS is not supported by this driver yet"),
    ("misplaced-field", "gpu", "p5.48xlarge", None, "gpu-0",
     {**GPU_CONFIG, "timeSlicingConfig": {"interval": "Long"}}, "timeSlicingConfig: unknown field"),
    ("interval", "gpu", "p5.48xlarge", None, "gpu-0",
     {**GPU_CONFIG, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "long"}}},
     "sharing.timeSlicingConfig.interval: 'long' is not one of Default, Short, Medium, Long"),
    ("gpu-config-on-mig", "gpu", "p4d.24xlarge", "1g.5gb", "gpu-0-mig-1g-5gb-0",
     {**GPU_CONFIG, "sharing": {"strategy": "TimeSlicing"}},
     "cannot apply GpuConfig to the mig devices of request req"),
]


def _plan_reason(tmp_path, family, instance_type, mig_profile, parameters) -> str:
    cls = names.DEFAULT_DRIVER_NAMES.class_name("mig" if mig_profile else family)
    doc = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c", "namespace": "ml"},
           "spec": {"devices": {
               "requests": [{"name": "req", "exactly": {"deviceClassName": cls}}],
               "config": [{"requests": ["req"], "opaque": {"driver": DRIVERS[family], "parameters": parameters}}]}}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    env = CelEnvironment()
    classes = tuple(DeviceClasses({}, names.DEFAULT_DRIVER_NAMES).all())
    manifests = load_manifests([path], env, builtin_classes=classes)
    nodes = nodes_for_instance_type(instance_type, 1, mig_profile=mig_profile)
    result = Planner(env, nodes, config_drivers={DRIVERS[f]: f for f in ("gpu", "efa", "neuron")}).run(manifests.pods)
    (claim,) = result.claims
    assert not claim.allocated
    return claim.reason or ""


@pytest.fixture(scope="module")
def nodes():
    base = short_tmp()
    kube = FakeKube()
    running = {}
    for key, instance_type, mig_profile, family in (("p5", "p5.48xlarge", None, "gpu"),
                                                    ("p4d", "p4d.24xlarge", "1g.5gb", "gpu"),
                                                    ("trn2", "trn2.48xlarge", None, "neuron")):
        node = Node(base / key, instance_type, f"node-{key}", mig_profile=mig_profile)
        kube.add_node(node.name)
        running[instance_type] = (node, start_driver(kube, node, family, reconcile_interval_s=3600),
                                  kubelet_for(node, family))
    yield kube, running
    for _node, driver, kubelet in running.values():
        kubelet.close()
        driver.stop(0.5)
    kube.close()
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize(("case", "family", "instance_type", "mig_profile", "device", "parameters", "field"), CASES,
                         ids=[c[0] for c in CASES])
def test_plan_and_prepare_refuse_with_the_same_text(tmp_path, nodes, case, family, instance_type, mig_profile,
                                                    device, parameters, field):
    kube, running = nodes
    node, _, kubelet = running[instance_type]
    driver = DRIVERS[family]
    planned = _plan_reason(tmp_path, family, instance_type, mig_profile, parameters)
    assert planned.startswith(f"prepare would fail: {driver}: spec.devices.config[0]"), planned
    claim = kube.put_claim(make_claim(driver, node.name, [device], configs=[
        {"source": "FromClaim", "requests": ["req"], "opaque": {"driver": driver, "parameters": parameters}}]))
    error = kubelet.prepare([claim])[claim["metadata"]["uid"]].error
    assert error.startswith(f"{driver}: claim ") and "status.allocation.devices.config[0]" in error, error
    plan_tail = planned.split("spec.devices.config[0]", 1)[1]
    prepare_tail = error.split("status.allocation.devices.config[0]", 1)[1]
    assert plan_tail == prepare_tail and field in plan_tail, (plan_tail, prepare_tail)


def test_mig_device_config_applies_to_mig_devices_only():
    gpu = names.DEFAULT_DRIVER_NAMES.gpu
    ts = {**MIG_CONFIG, "sharing": {"strategy": "TimeSlicing"}}
    entry = {"source": "FromClaim", "requests": ["mig"], "opaque": {"driver": gpu, "parameters": ts}}
    assert configs.settings_per_request(get_family("gpu"), gpu, [entry], ["mig"], {"mig": {"mig"}})["mig"] == configs.DeviceSettings()
    with pytest.raises(configs.ConfigError, match=r"config\[0\]: cannot apply MigDeviceConfig to the gpu devices of "
                                                  r"request mig \(a MigDeviceConfig configures mig devices\)"):
        configs.settings_per_request(get_family("gpu"), gpu, [entry], ["mig"], {"mig": {"gpu"}})
    # A config that names no request configures the devices of its kind and skips the others.
    everyone = {**entry, "requests": []}
    gpu_ts = {"source": "FromClaim", "requests": [], "opaque": {"driver": gpu, "parameters": {
        **GPU_CONFIG, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}}}}
    out = configs.settings_per_request(get_family("gpu"), gpu, [gpu_ts, everyone], ["g", "m"], {"g": {"gpu"}, "m": {"mig"}})
    assert out["g"].get("timeSliceInterval") == "Short" and out["m"] == configs.DeviceSettings()
    with pytest.raises(configs.ConfigError, match=r"sharing.timeSlicingConfig: unknown field; known fields: "
                                                  r"mpsConfig, strategy"):
        configs.settings_per_request(get_family("gpu"), gpu, [{**entry, "opaque": {"driver": gpu, "parameters": {
            **ts, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {}}}}}], ["mig"], {"mig": {"mig"}})
