"""The real NVML wrapper (eks_dra.drivers.gpu.nvml.Nvml) over pynvml, and `gpu_check`.

Without a GPU, pynvml's functions are replaced by a simulated two-GPU H100 node (one GPU in MIG mode), so
that the wrapper's calls, name matching and event draining run through pynvml's real error classes and
constants. On a machine with libnvidia-ml the real-library test also reads the real GPUs.
"""

from __future__ import annotations

import io
from types import SimpleNamespace

import pynvml
import pytest
import yaml

from eks_dra.drivers.fixture import write_fixture
from eks_dra.drivers.framework import hosttree
from eks_dra.drivers.gpu import discovery as gpu_discovery
from eks_dra.drivers.gpu import gpu_check, nvml
from eks_dra.drivers.gpu import mig as mig_marker
from eks_dra.drivers.gpu.nvml import Nvml, NvmlUnavailable, normalize_bus_id

H100 = SimpleNamespace(name="NVIDIA H100 80GB HBM3", pci_id=0x2330)
# GPU-instance profiles (index -> info) as an H100 80GB reports them; "+me" shares 1g.10gb's key.
PROFILES = {0: ("MIG 1g.10gb", 1, 9856, 16, 19), 1: ("MIG 2g.20gb", 2, 20096, 32, 14),
            2: ("MIG 3g.40gb", 3, 40320, 60, 9), 4: ("MIG 7g.80gb", 7, 80896, 132, 0),
            7: ("MIG 1g.10gb+me", 1, 9856, 16, 20)}


class SimulatedNvml:
    """The pynvml functions the wrapper calls, over two GPUs: 0 plain, 1 with two 3g.40gb instances."""

    def __init__(self, library_present: bool = True) -> None:
        self.library_present = library_present
        self.gpus = [SimpleNamespace(uuid="GPU-aaaa", minor=0, bus="00000000:45:00.0", mig=False, migs=[]),
                     SimpleNamespace(uuid="GPU-bbbb", minor=1, bus="00000000:56:00.0", mig=True,
                                     migs=[("MIG-m1", 2, 0, 4), ("MIG-m0", 1, 0, 0)])]  # uuid, gi, ci, start
        self.pending_events: list[SimpleNamespace] = []
        self.ecc = {"GPU-aaaa": 0, "GPU-bbbb": 0}

    def install(self, monkeypatch) -> None:
        for name in dir(self):
            if name.startswith("nvml"):
                monkeypatch.setattr(pynvml, name, getattr(self, name))

    def _gpu(self, h):
        return self.gpus[h] if isinstance(h, int) else next(g for g in self.gpus for m in g.migs if m[0] == h[1])

    def nvmlInit(self):
        if not self.library_present:
            raise pynvml.NVMLError_LibraryNotFound()

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return "580.95.05"

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return next(i for i, g in enumerate(self.gpus) if g.uuid == uuid)

    def nvmlDeviceGetUUID(self, h):
        return self.gpus[h].uuid if isinstance(h, int) else h[1]

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=self.gpus[h].bus.encode(), pciDeviceId=(H100.pci_id << 16) | 0x10DE)

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return (9, 0)

    def nvmlDeviceGetMigMode(self, h):
        return [int(self.gpus[h].mig), int(self.gpus[h].mig)]

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h, p):
        if p not in PROFILES:
            raise pynvml.NVMLError_NotSupported()
        name, slices, mem, sms, pid = PROFILES[p]
        return SimpleNamespace(name=name.encode(), sliceCount=slices, memorySizeMB=mem, multiprocessorCount=sms,
                               id=pid)

    def nvmlDeviceGetMinorNumber(self, h):
        return self.gpus[h].minor

    def nvmlDeviceGetName(self, h):
        return H100.name

    def nvmlDeviceGetArchitecture(self, h):
        return pynvml.NVML_DEVICE_ARCH_HOPPER

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=81559 * (1 << 20))

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, i):
        migs = self.gpus[h].migs
        if i >= len(migs):
            raise pynvml.NVMLError_NotFound()
        return ("mig", migs[i][0])

    def _mig(self, m):
        return next(x for g in self.gpus for x in g.migs if x[0] == m[1])

    def nvmlDeviceGetAttributes(self, m):
        return SimpleNamespace(gpuInstanceSliceCount=3, memorySizeMB=40320, multiprocessorCount=60)

    def nvmlDeviceGetGpuInstanceId(self, m):
        return self._mig(m)[1]

    def nvmlDeviceGetComputeInstanceId(self, m):
        return self._mig(m)[2]

    def nvmlDeviceGetGpuInstanceById(self, h, gi):
        if gi == 2:
            raise pynvml.NVMLError_NoPermission()
        return ("gi", gi)

    def nvmlGpuInstanceGetInfo(self, gi):
        start = next(m[3] for g in self.gpus for m in g.migs if m[1] == gi[1])
        return SimpleNamespace(placement=SimpleNamespace(start=start))

    def nvmlEventSetCreate(self):
        return "event-set"

    def nvmlDeviceGetSupportedEventTypes(self, h):
        return pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError

    def nvmlDeviceRegisterEvents(self, h, types, event_set):
        assert event_set == "event-set" and types

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        assert timeout_ms == 0  # never block the poll loop
        if not self.pending_events:
            raise pynvml.NVMLError_Timeout()
        return self.pending_events.pop(0)

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        assert (error_type, counter_type) == (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
        if self.ecc[self.gpus[h].uuid] is None:
            raise pynvml.NVMLError_GpuIsLost()
        return self.ecc[self.gpus[h].uuid]

    def nvmlDeviceGetRemappedRows(self, h):
        raise pynvml.NVMLError_NotSupported()


@pytest.fixture
def simulated(monkeypatch):
    sim = SimulatedNvml()
    sim.install(monkeypatch)
    return sim


def test_wrapper_reports_gpus_and_mig_devices(simulated):
    gpus = Nvml().gpus()
    assert [(g.minor, g.uuid, g.pci_address, g.pci_device_id, g.architecture, g.cuda_compute_capability,
             g.memory_mib, g.multiprocessors, g.mig_enabled) for g in gpus] == [
        (0, "GPU-aaaa", "0000:45:00.0", 0x2330, "Hopper", "9.0", 81559, 132, False),
        (1, "GPU-bbbb", "0000:56:00.0", 0x2330, "Hopper", "9.0", 81559, 132, True)]
    assert gpus[0].migs == ()
    # The plain profile wins over its media-extension twin; a GI the driver won't describe keeps its id.
    assert [(m.uuid, m.profile, m.gpu_instance_id, m.placement_start, m.memory_mib, m.multiprocessors)
            for m in gpus[1].migs] == [("MIG-m1", "3g.40gb", 2, 2, 40320, 60), ("MIG-m0", "3g.40gb", 1, 0, 40320, 60)]
    names = [f"{p.profile}-{n}" for p, n in gpu_discovery.number_migs(gpu_discovery.nvml_migs(gpus[1]))]
    assert names == ["3g.40gb-0", "3g.40gb-1"]
    assert [m.uuid for m, _ in gpu_discovery.number_migs(gpu_discovery.nvml_migs(gpus[1]))] == ["MIG-m0", "MIG-m1"]


def test_wrapper_drains_events_without_blocking(simulated):
    n = Nvml()
    assert n.poll_events() == []
    simulated.pending_events += [
        SimpleNamespace(device=1, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=79,
                        gpuInstanceId=nvml.NO_GPU_INSTANCE, computeInstanceId=0),
        SimpleNamespace(device=("mig", "MIG-m0"), eventType=pynvml.nvmlEventTypeDoubleBitEccError, eventData=0,
                        gpuInstanceId=1, computeInstanceId=0)]
    events = n.poll_events()
    assert [(e.uuid, e.xid, e.kind, e.gpu_instance_id) for e in events] == [
        ("GPU-bbbb", 79, "xid", None), ("MIG-m0", 0, "ecc", 1)]
    assert n.poll_events() == []


def test_wrapper_health(simulated):
    n = Nvml()
    assert n.health("GPU-aaaa") == nvml.NvmlHealth(0, None, None)
    simulated.ecc["GPU-aaaa"] = 3
    assert n.health("GPU-aaaa").uncorrected_ecc_volatile == 3
    simulated.ecc["GPU-aaaa"] = None
    assert n.health("GPU-aaaa").error  # a lost GPU is reported, not raised


def test_wrapper_without_the_library(monkeypatch):
    SimulatedNvml(library_present=False).install(monkeypatch)
    with pytest.raises(NvmlUnavailable, match="nvmlInit failed"):
        Nvml()


def test_real_library_or_a_clear_refusal():
    """On this machine: either libnvidia-ml is absent and Nvml() says so, or it is present and works."""
    try:
        n = Nvml()
    except NvmlUnavailable as exc:
        assert "nvmlInit failed" in str(exc)
        return
    gpus = n.gpus()
    assert gpus and all(g.uuid.startswith("GPU-") and g.memory_mib > 0 for g in gpus)


def test_shared_nvml_retries_after_a_failure(monkeypatch, fresh_shared_nvml):
    sim = SimulatedNvml(library_present=False)
    sim.install(monkeypatch)
    assert nvml.shared_nvml()[0] is None and "nvmlInit failed" in nvml.shared_nvml()[1]
    sim.library_present = True
    assert nvml.shared_nvml()[0] is None  # not retried on every call
    monkeypatch.setattr(nvml, "_shared_failed_at", -nvml.RETRY_AFTER_S)
    assert isinstance(nvml.shared_nvml()[0], Nvml)


def test_shared_nvml_error_belongs_to_its_library(monkeypatch, tmp_path, fresh_shared_nvml):
    """A failure for one library path is not the answer for another: that one is tried at once."""
    sim = SimulatedNvml(library_present=False)
    sim.install(monkeypatch)
    assert "loader search path" in nvml.shared_nvml()[1]
    library = tmp_path / "driver/usr/lib64/libnvidia-ml.so.1"
    backend, why = nvml.shared_nvml(library)
    assert backend is None and why.startswith(f"cannot load {library}")  # tried, not the first error again
    assert nvml.shared_nvml(library)[1] == why  # and that one is not retried on every call either


def test_normalize_bus_id():
    assert normalize_bus_id("00000000:8A:00.0") == "0000:8a:00.0"
    assert normalize_bus_id("0008:01:00.0") == "0008:01:00.0"


# --- gpu_check ---------------------------------------------------------------------------------------

def _host_for_simulated_gpus(tmp_path):
    """A p5.4xlarge-like tree whose sysfs holds the simulated GPUs' PCI functions (no fixture marker)."""
    root = write_fixture("p5.48xlarge", tmp_path / "h", node_name="gpu-box")
    (root / hosttree.DMI_PRODUCT_NAME).write_text("lab-h100-box\n")
    for f in (root / hosttree.FIXTURE_DIR).iterdir():
        f.unlink()
    (root / hosttree.FIXTURE_DIR).rmdir()
    return root


def test_gpu_check_prints_the_slice(tmp_path, simulated):
    root = _host_for_simulated_gpus(tmp_path)
    mig_marker.write_marker(root)  # the simulated NVML has MIG devices: partitioning has finished
    out = io.StringIO()
    # sysfs has 8 GPUs, NVML 2: the check says so and exits 3 (not ready).
    assert gpu_check.check(root, "gpu-box", "gpu.nvidia.com", Nvml(), out=out) == 3
    text = out.getvalue()
    assert "# sysfs: 8 NVIDIA GPU PCI functions" in text and "# NVML: driver 580.95.05, 2 GPUs" in text
    assert "MISMATCH: 0000:bc:00.0 is on the PCI bus but NVML does not report it" in text
    assert "found 2 of 8 expected GPU devices" in text
    for link in (root / "sys/bus/pci/devices").iterdir():
        if (link / "vendor").read_text() == "0x10de\n" and link.name not in ("0000:45:00.0", "0000:56:00.0"):
            link.unlink()
    out = io.StringIO()
    rc = gpu_check.check(root, "gpu-box", "gpu.nvidia.com", Nvml(), out=out)
    text = out.getvalue()
    assert rc == 0, text
    assert "MISMATCH" not in text and "# inventory: ready=True" in text
    slices = [s for s in yaml.safe_load_all(text) if s]
    devices = {d["name"]: d for d in slices[0]["spec"]["devices"]}
    assert sorted(devices) == ["gpu-0", "gpu-1-mig-3g-40gb-0", "gpu-1-mig-3g-40gb-1"]
    assert devices["gpu-0"]["attributes"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:44"}
    assert devices["gpu-1-mig-3g-40gb-0"]["attributes"]["uuid"] == {"string": "MIG-m0"}
    assert slices[0]["spec"]["pool"]["name"] == "gpu-box"


def test_gpu_check_survives_a_failing_nvml(tmp_path, simulated, monkeypatch):
    root = _host_for_simulated_gpus(tmp_path)

    def broken(h):
        raise pynvml.NVMLError_Unknown()

    monkeypatch.setattr(pynvml, "nvmlDeviceGetArchitecture", broken)
    out = io.StringIO()
    rc = gpu_check.check(root, "gpu-box", "gpu.nvidia.com", Nvml(), out=out)
    text = out.getvalue()
    # The procfs fallback finds all 8 fixture GPUs: the slice is printed and the NVML failure named.
    assert rc == 0, text
    assert "# NVML FAILED: NVMLError_Unknown" in text and "NVML failed (NVMLError_Unknown" in text
    assert len([s for s in yaml.safe_load_all(text) if s][0]["spec"]["devices"]) == 8


def test_gpu_check_without_nvml_or_gpus_exits_1(tmp_path, capsys):
    root = _host_for_simulated_gpus(tmp_path)
    assert gpu_check.check(root, "n", "gpu.nvidia.com", None, out=io.StringIO()) == 1
    assert "NVML is unavailable" in capsys.readouterr().err
    assert gpu_check.main(["--host-root", str(tmp_path / "empty")]) == 1


def test_discovery_modules_import_nothing_heavy():
    """gpu-check runs on a bare GPU machine; the drivers must not pay for the CDK or a client they don't use."""
    import subprocess
    import sys

    code = ("import sys, eks_dra.drivers.gpu.gpu_check, eks_dra.drivers.fixture, eks_dra.drivers.gpu.health, eks_dra.drivers.families; [eks_dra.drivers.families.get_family(f) for f in ('gpu', 'efa', 'neuron')]; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('aws_cdk', 'jsii', 'cdk8s', 'kubernetes', 'grpc')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
