"""Our published vocabulary against the upstream drivers', per family: attribute names and types, and values
on fixture nodes, as the drivers discover them (the planner simulates the same devices, test_discovery).

The tables below are recorded from the upstream sources, not from our code:
- NVIDIA: kubernetes-sigs/dra-driver-nvidia-gpu v0.4.1 (764900e7), cmd/gpu-kubelet-plugin/deviceinfo.go
  (GpuInfo.Attributes, GetDevice), mig.go (CommonAttributesMig, CommonCapacitiesMig), partitions.go.
- EFA: kubernetes-sigs/dranet (f258477c) pkg/apis/attributes.go, pkg/inventory/db.go; values as DRANET
  publishes them on EFA (aws/karpenter-provider-aws pkg/providers/drametadata/zz_generated_efa_metadata.go).
- Neuron: aws-neuron/aws-neuron-sdk deploy/eks/dra.rst @ 3afa0fdf (the driver's source is not public).
- DeviceClass selectors: the charts' deviceclass templates (dra-driver-nvidia-gpu v0.4.1
  deviceclass-{gpu,mig}.yaml, aws/eks-charts stable/aws-dranet/templates/deviceclass.yaml @ 79203dcc,
  neuron-helm-charts dra-driver-deviceclass.yaml).
"""

from __future__ import annotations

import pytest
from charts.cel_device import Selector

from eks_dra.catalog import get_instance_type
from eks_dra.devices import DEFAULT_DRIVER_NAMES, Device, Version
from eks_dra.devices.classes import DeviceClasses
from eks_dra.devices.neuron import neuron_device_name
from eks_dra.drivers.families import discover
from eks_dra.drivers.fixture import write_fixture

NODE = "vocab-node"
STRING, INT, BOOL, VERSION = str, int, bool, Version

# name -> type; "resource.kubernetes.io/..." names are qualified, the rest are in the driver's domain.
UPSTREAM_GPU = {
    "type": STRING, "uuid": STRING, "productName": STRING, "brand": STRING, "architecture": STRING,
    "cudaComputeCapability": VERSION, "driverVersion": VERSION, "cudaDriverVersion": VERSION,
    "resource.kubernetes.io/pciBusID": STRING, "resource.kubernetes.io/pcieRoot": STRING,
}
UPSTREAM_GPU_OPTIONAL = {"addressingMode": STRING}  # only where NVML reports one (coherent-memory systems)
UPSTREAM_GPU_CAPACITY = {"memory"}
UPSTREAM_MIG = {**UPSTREAM_GPU, "parentUUID": STRING, "profile": STRING}
UPSTREAM_MIG_CAPACITY = {"multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines",
                         "memory"}  # plus memorySlice<i>
UPSTREAM_EFA = {
    "pciDevice": STRING, "pciVendor": STRING, "pciSubsystem": STRING, "rdma": BOOL, "rdmaDevice": STRING,
    "pciAddress": STRING, "numaNode": INT, "resource.kubernetes.io/pcieRoot": STRING,
}
DEVICE_GROUPS = {f"resource.aws.com/devicegroup{n}_id": STRING for n in (1, 4, 8, 16)}
UPSTREAM_NEURON = {
    "deviceId": INT, "instanceType": STRING, "neuronDriverVersion": STRING, "draDriverVersion": STRING,
    "resourceType": STRING, "topology_x": INT, "topology_y": INT, "topology4_id": INT, "topology8_id": INT,
}
# Upstream attributes we do not publish, and why (the report and README say so too).
NOT_PUBLISHED = {
    "neuron": {"networkNodeLayer1", "networkNodeLayer2", "networkNodeLayer3"},  # EC2 network topology: not on the node
    "mig-capacity": {"copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines"},  # NVML only, not in fixtures
}
# Ours beyond upstream's.
EXTRAS = {"gpu": {"numaNode"}, "mig": {"numaNode"}, "efa": set(),
          "neuron": {"coreCount", "numaNode", "resource.kubernetes.io/pcieRoot"}}

UPSTREAM_CLASS_SELECTORS = {
    "gpu.nvidia.com": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
    "mig.nvidia.com": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
    "efa.networking.k8s.aws": "device.driver == \"dra.net\" &&\ndevice.attributes[\"dra.net\"].pciDevice == 'Elastic Fabric Adapter (EFA)'\n",
    "neuron.aws.com": 'device.driver == "neuron.aws.com"',
}


def _discovered(instance_type: str, family: str, tmp_path, mig_profile: str | None = None) -> list[Device]:
    root = write_fixture(instance_type, tmp_path / f"{instance_type}-{family}", node_name=NODE, mig_profile=mig_profile)
    return [d.device for d in discover(family, root, NODE).devices]


def _assert_vocabulary(devices: list[Device], upstream: dict, optional: dict, extras: set[str],
                       not_published: set[str] = frozenset()) -> None:
    assert devices
    for d in devices:
        missing = set(upstream) - set(d.attributes) - not_published
        assert not missing, (d.name, missing)
        for name, kind in {**upstream, **optional}.items():
            if name in d.attributes:
                value = d.attributes[name]
                assert type(value) is kind, (d.name, name, type(value).__name__, kind.__name__)
        unknown = set(d.attributes) - set(upstream) - set(optional) - extras
        assert not unknown, (d.name, unknown)


def test_full_gpus_publish_the_nvidia_vocabulary(tmp_path):
    devices = _discovered("p5.48xlarge", "gpu", tmp_path)
    _assert_vocabulary(devices, UPSTREAM_GPU, UPSTREAM_GPU_OPTIONAL, EXTRAS["gpu"])
    gpu0 = next(d for d in devices if d.name == "gpu-0")
    assert "index" not in gpu0.attributes  # upstream removed it
    assert gpu0.attributes["type"] == "gpu" and gpu0.attributes["productName"] == "NVIDIA H100 80GB HBM3"
    gpu0_pci = get_instance_type("p5.48xlarge").accelerators[0].pci
    assert gpu0.attributes["resource.kubernetes.io/pciBusID"] == gpu0_pci.address
    assert gpu0.attributes["resource.kubernetes.io/pcieRoot"] == gpu0_pci.root == "pci0000:44"
    assert gpu0.attributes["driverVersion"] == Version("580.95.5")
    assert set(gpu0.capacity) == UPSTREAM_GPU_CAPACITY
    assert gpu0.capacity["memory"] == str(81920 * 2**20)  # bytes, as upstream publishes NVML's total


def test_mig_devices_publish_the_nvidia_vocabulary(tmp_path):
    devices = _discovered("p4d.24xlarge", "gpu", tmp_path, mig_profile="3g.20gb")
    _assert_vocabulary(devices, UPSTREAM_MIG, UPSTREAM_GPU_OPTIONAL, EXTRAS["mig"])
    first, second = sorted((d for d in devices if d.name.startswith("gpu-0-")), key=lambda d: d.name)
    assert first.attributes["profile"] == "3g.20gb" and first.attributes["parentUUID"].startswith("GPU-")
    assert first.attributes["uuid"].startswith("MIG-")
    caps = set(first.capacity)
    assert caps - UPSTREAM_MIG_CAPACITY == {"memorySlice0", "memorySlice1", "memorySlice2", "memorySlice3"}
    assert UPSTREAM_MIG_CAPACITY - caps == NOT_PUBLISHED["mig-capacity"]
    # The two 3g.20gb instances of a 40 GB A100 hold 4 of its 8 memory slices each, without overlap.
    assert {k for k in second.capacity if k.startswith("memorySlice")} == {f"memorySlice{i}" for i in range(4, 8)}
    assert first.capacity["memory"] == str(19968 * 2**20)


def test_efa_devices_publish_the_dranet_vocabulary(tmp_path):
    devices = _discovered("p5.48xlarge", "efa", tmp_path)
    _assert_vocabulary(devices, UPSTREAM_EFA, {}, EXTRAS["efa"])
    d = devices[0]
    assert (d.attributes["pciDevice"], d.attributes["pciVendor"], d.attributes["pciSubsystem"]) == (
        "Elastic Fabric Adapter (EFA)", "Amazon.com, Inc.", "efa1")
    assert d.attributes["rdma"] is True and "efaVersion" not in d.attributes
    trn = _discovered("trn2.48xlarge", "efa", tmp_path)
    _assert_vocabulary(trn, {**UPSTREAM_EFA, **DEVICE_GROUPS}, {}, EXTRAS["efa"])


def test_neuron_devices_publish_the_neuron_vocabulary(tmp_path):
    devices = _discovered("trn2.48xlarge", "neuron", tmp_path)
    _assert_vocabulary(devices, {**UPSTREAM_NEURON, **DEVICE_GROUPS}, {}, EXTRAS["neuron"],
                       NOT_PUBLISHED["neuron"])
    by_name = {d.name: d for d in devices}
    # Device names as the Neuron driver publishes them (its documented allocation: neurondevice0..3).
    assert sorted(by_name) == sorted(neuron_device_name(i) for i in range(16))
    d5 = by_name["neurondevice5"]
    assert (d5.attributes["deviceId"], d5.attributes["instanceType"], d5.attributes["resourceType"]) == (
        5, "trn2.48xlarge", "neuron_device")
    assert d5.attributes["neuronDriverVersion"] == "2.25.4.0"
    assert d5.attributes["draDriverVersion"].startswith("eks-dra")


@pytest.mark.parametrize(("class_name", "instance_type", "family", "mig_profile", "count"), [
    ("gpu.nvidia.com", "p5.48xlarge", "gpu", None, 8),
    ("mig.nvidia.com", "p4d.24xlarge", "gpu", "1g.5gb", 56),
    ("efa.networking.k8s.aws", "p5.48xlarge", "efa", None, 32),
    ("neuron.aws.com", "trn2.48xlarge", "neuron", None, 16),
])
def test_upstream_class_selectors_select_our_devices(tmp_path, class_name, instance_type, family, mig_profile, count):
    driver = DEFAULT_DRIVER_NAMES.for_family(family)
    devices = _discovered(instance_type, family, tmp_path, mig_profile)
    upstream = Selector(UPSTREAM_CLASS_SELECTORS[class_name])
    ours = Selector(next(d.expression for d in DeviceClasses({}, DEFAULT_DRIVER_NAMES).all() if d.name == class_name))
    assert sum(upstream.matches(driver, d) for d in devices) == count
    assert [upstream.matches(driver, d) for d in devices] == [ours.matches(driver, d) for d in devices]
