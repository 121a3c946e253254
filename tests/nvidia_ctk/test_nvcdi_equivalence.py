"""Our GPU claims' CDI specs against NVIDIA's own generator on the same fixture driver root.

The reference is `nvcdi-fixture` (tests/nvidia_ctk/main.go): nvidia-container-toolkit v1.20's pkg/nvcdi
driven by go-nvml's mock NVML adapted to the fixture's GPUs, configured and combined as the upstream DRA
driver does (common edits per spec, device spec per GPU, MIG = parent spec + capability nodes). Our
specs come from a running gpu driver preparing claims through the kubelet's gRPC API.

Compared per device, normalised for names and order: host paths, container paths and options of mounts,
device-node paths, hooks (lifecycle, path, arguments, env) and env entries.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import pytest
from drivers.fake_kube import FakeKube
from drivers.harness import DRIVERS, Node, kubelet_for, make_claim, short_tmp, start_driver
from test_discovery_fakes import FakeNvml

from eks_dra.devices import node_facts
from eks_dra.devices.gpu import DEFAULT_DRIVER_VERSION
from eks_dra.drivers import families
from eks_dra.drivers.fixture import write_fixture
from eks_dra.drivers.gpu import discovery as gpu_discovery
from eks_dra.drivers.gpu import elf, gpu_check
from eks_dra.drivers.gpu.cdi_edits import DEFAULT_HOOK_PATH
from eks_dra.drivers.gpu.equivalence import build_reference, compare, differences, normalise, run_reference
from eks_dra.drivers.gpu.host import GpuHost

GPU = DRIVERS["gpu"]


def _can_mknod() -> bool:
    probe = short_tmp() / "node"
    try:
        os.mknod(probe, 0o600 | 0o020000, os.makedev(1, 3))
        return True
    except OSError:
        return False
    finally:
        shutil.rmtree(probe.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def nvcdi_binary() -> Path:
    if shutil.which("go") is None:
        pytest.skip("nvidia-ctk tier: Go toolchain not found on PATH; install Go >= 1.24 to build NVIDIA's "
                    "pkg/nvcdi reference (tests/nvidia_ctk/build.sh)")
    if not (shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")):
        pytest.skip("nvidia-ctk tier: no C compiler (gcc/cc) on PATH; go-nvml's bindings need cgo "
                    "(apt-get install build-essential)")
    if not _can_mknod():
        pytest.skip("nvidia-ctk tier: no CAP_MKNOD here; nvcdi finds device nodes only as character devices, "
                    "which the reference program creates with mknod")
    try:
        return build_reference()
    except RuntimeError as exc:
        pytest.fail(str(exc))


def host_gpus(root: Path) -> list[dict]:
    """The fixture's GPUs as the host shows them (procfs, the fixture's MIG file), not as we discover them."""
    migs = json.loads((root / gpu_discovery.FIXTURE_MIG_FILE).read_text())["gpus"] if \
        (root / gpu_discovery.FIXTURE_MIG_FILE).exists() else {}
    out = []
    for info in sorted((root / gpu_discovery.NVIDIA_GPUS_DIR).glob("*/information")):
        fields = gpu_discovery.parse_nvidia_information(info.read_text())
        bdf = info.parent.name
        out.append({"uuid": fields["GPU UUID"], "minor": int(fields["Device Minor"]), "pciBusID": bdf,
                    "migs": [{"uuid": m["uuid"], "gi": m["gpuInstanceId"], "ci": m["computeInstanceId"]}
                             for m in migs.get(bdf, [])]})
    return sorted(out, key=lambda g: g["minor"])


def nvcdi(binary: Path, root: Path) -> dict:
    version = gpu_discovery.parse_nvidia_version((root / gpu_discovery.NVIDIA_VERSION_FILE).read_text())
    return run_reference(binary, {"driverRoot": str(root), "hookPath": DEFAULT_HOOK_PATH, "driverVersion": version,
                                  "gpus": host_gpus(root)})


def _assert_same(ours: dict, theirs: dict) -> None:
    diff = differences(ours, theirs)
    assert not diff, "\n".join(diff)


@pytest.fixture(scope="module", params=[("p5.48xlarge", None, "al2023"), ("p5.48xlarge", None, "bottlerocket"),
                                        ("p4d.24xlarge", "3g.20gb", "al2023")],
                ids=["p5-al2023", "p5-bottlerocket", "p4d-mig-al2023"])
def node(request):
    instance_type, mig_profile, layout = request.param
    base = short_tmp()
    kube = FakeKube()
    n = Node(base / "a", instance_type, "node-a", mig_profile, os_layout=layout)
    kube.add_node("node-a")
    driver = start_driver(kube, n, "gpu", reconcile_interval_s=3600)
    kubelet = kubelet_for(n, "gpu")
    yield kube, n, driver, kubelet
    kubelet.close()
    driver.stop()
    shutil.rmtree(base, ignore_errors=True)


def _prepare(kube, kubelet, node: Node, devices: list[str], name: str) -> dict:
    claim = kube.put_claim(make_claim(GPU, "node-a", devices, name=name))
    entry = kubelet.prepare([claim])[claim["metadata"]["uid"]]
    assert entry.error == ""
    return json.loads((node.cdi / f"k8s.{GPU}-claim_{claim['metadata']['uid']}.json").read_text())


def _device(spec: dict, device: str) -> dict:
    return next(d["containerEdits"] for d in spec["devices"] if d["name"].endswith("-" + device))


def test_specs_equal_nvcdis_per_device_and_for_a_two_claim_container(nvcdi_binary, node):
    kube, n, driver, kubelet = node
    theirs = nvcdi(nvcdi_binary, n.host)
    published = {d.device.name: d for d in driver.inventory.devices.values()}
    uuids = {name: d.device.attributes["uuid"] for name, d in published.items()}
    names = sorted(published)
    first, second = names[0], names[-1]
    is_mig = published[first].parent is not None

    one = _prepare(kube, kubelet, n, [first], "one")
    # the spec-level edits equal nvcdi's GetCommonEdits(), the device's equal its device spec
    _assert_same(normalise(one["containerEdits"]), normalise(theirs["common"]))
    _assert_same(normalise(_device(one, first)), normalise(theirs["devices"][uuids[first]]))
    if is_mig:
        assert len({p for _, p in normalise(_device(one, first))["deviceNodes"]}) == 3  # GPU, GI and CI caps

    # one container, two claims: both GPUs, one consistent environment, and nothing nvcdi would not add
    two = _prepare(kube, kubelet, n, [second], "two")
    together = normalise(one["containerEdits"], _device(one, first), two["containerEdits"], _device(two, second))
    _assert_same(together, normalise(theirs["common"], theirs["devices"][uuids[first]],
                                     theirs["devices"][uuids[second]]))
    env = [*one["containerEdits"]["env"], *two["containerEdits"]["env"]]
    values = {e.split("=", 1)[0]: set() for e in env}
    for e in env:
        values[e.split("=", 1)[0]].add(e.split("=", 1)[1])
    assert all(len(v) == 1 for v in values.values()), values  # a later claim's env cannot undo an earlier one's
    assert values["NVIDIA_VISIBLE_DEVICES"] == {"void"}


def test_the_comparison_notices_a_missing_library(nvcdi_binary, node):
    """The tier can fail: drop one library mount from our edits and the difference is named."""
    kube, n, driver, kubelet = node
    theirs = nvcdi(nvcdi_binary, n.host)
    ours = json.loads(json.dumps(driver.inventory.common_edits))
    dropped = next(m for m in ours["mounts"] if "/libcuda.so." in m["hostPath"])
    ours["mounts"].remove(dropped)
    diff = differences(normalise(ours), normalise(theirs["common"]))
    assert diff == [f"mounts: only nvcdi: {(dropped['hostPath'], dropped['containerPath'], tuple(dropped['options']))}"]


def test_gpu_checks_comparison_on_the_fixture(nvcdi_binary, node):
    """`make gpu-check`'s comparison (one spec with every device) on the fixture: no difference."""
    kube, n, driver, kubelet = node
    assert compare(families.discover("gpu", n.host, n.name), nvcdi(nvcdi_binary, n.host)) == []


def test_gpu_check_prints_the_equivalence(nvcdi_binary, tmp_path):
    """`make gpu-check`'s report on a fixture (the reference then mocks NVML): EQUAL, exit 0; a changed
    driver root after discovery (a library the reference sees but our edits lack) is DIFFERENT, exit 4."""
    root = write_fixture("p4d.24xlarge", tmp_path / "h", node_name="n", mig_profile="3g.20gb")
    nvml = FakeNvml.from_facts(node_facts("p4d.24xlarge", "n", mig_profile="3g.20gb"))
    out = io.StringIO()
    assert gpu_check.check(root, "n", GPU, nvml, out=out, reference=nvcdi_binary) == 0, out.getvalue()
    assert "# nvidia-ctk equivalence (pkg/nvcdi, mock NVML): EQUAL" in out.getvalue()
    host = GpuHost.for_node(root)
    host.common_edits(["/dev/nvidia-uvm-tools", "/dev/nvidia-uvm", "/dev/nvidiactl"])  # cached from now on
    extra = root / f"usr/lib64/libnvidia-glsi.so.{DEFAULT_DRIVER_VERSION}"
    extra.write_bytes(elf.shared_object(extra.name))
    out = io.StringIO()
    assert gpu_check.check(root, "n", GPU, nvml, out=out, gpu_host=host, reference=nvcdi_binary) == 4
    assert "DIFFERENT" in out.getvalue() and f"only nvcdi: ('/usr/lib64/{extra.name}'" in out.getvalue()
