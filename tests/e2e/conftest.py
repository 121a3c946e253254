"""Fixtures of the real-control-plane tier (see tests/e2e/README.md).

The Go binary is built once per session, after collection and outside any per-test timeout,
and only when e2e tests are selected. Without Go every e2e test skips with one line.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import realnode
from controlplane import (
    MIN_GO,
    TIER_VERSION,
    ControlPlane,
    KubeletStandIn,
    ensure_binary,
    go_available,
    go_version,
    sa_kubeconfig,
)
from ff_helpers import NodeFactory, ensure_driver_rbac
from kubernetes import client, config

E2E_DIR = Path(__file__).resolve().parent
NO_GO = "e2e: Go toolchain not found on PATH; install Go >= 1.24 to run the real-control-plane tier"

_build: dict = {}


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "e2e: end-to-end tests against a real Kubernetes 1.34 control plane built from Go modules"
    )
    # Tests of features that are off before 1.36 use the 1.36 fixtures below, whatever the tier's version.
    config.addinivalue_line("markers", "k8s136: needs Kubernetes 1.36 (its own control plane unless E2E_KUBERNETES=1.36)")


def _is_e2e(item) -> bool:
    return E2E_DIR in Path(str(item.fspath)).resolve().parents


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _is_e2e(item):
            item.add_marker(pytest.mark.e2e)


def pytest_collection_finish(session):
    # A cold build takes minutes; doing it here keeps it out of the first test's timeout.
    version = go_version() if go_available() else None
    if version is not None and version >= MIN_GO and any(_is_e2e(item) for item in session.items):
        try:
            _build["binary"] = ensure_binary()
        except Exception as exc:  # reported by the fixture, in the test that needs it
            _build["error"] = exc
        if TIER_VERSION != "1.36" and any("control_plane_136" in item.fixturenames for item in session.items):
            try:
                _build["binary-1.36"] = ensure_binary("1.36")
            except Exception as exc:
                _build["error-1.36"] = exc
        if "binary" in _build and any(Path(str(item.fspath)).name == "test_real_node.py" for item in session.items):
            realnode.prebuild()  # the real-node tier's kubelet, containerd and images
        if "binary" in _build and any("ml_controller_builds" in item.fixturenames for item in session.items):
            try:
                _build["controllers"] = {name: ensure_controller(name) for name in ML_CONTROLLERS}
            except Exception as exc:
                _build["error-controllers"] = exc


@pytest.fixture(scope="session")
def e2e_binary() -> Path:
    if not go_available():
        pytest.skip(NO_GO)
    version = go_version()
    if version is not None and version < MIN_GO:
        pytest.skip(f"e2e: Go {version[0]}.{version[1]} found; the Kubernetes 1.34.12 modules need Go >= 1.25")
    if "error" in _build:
        raise _build["error"]
    return _build.get("binary") or ensure_binary()


ML_CONTROLLERS = ("jobset", "lws")


def ensure_controller(name: str) -> Path:
    """The directory of an ML workload controller built by build_controllers.sh (cached by module version)."""
    run = subprocess.run(["bash", str(E2E_DIR / "build_controllers.sh"), name], capture_output=True, text=True,
                         timeout=1800)
    if run.returncode != 0:
        raise RuntimeError(f"tests/e2e/build_controllers.sh {name} failed:\n{run.stderr[-3000:]}")
    return Path(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def ml_controller_builds(e2e_binary) -> dict[str, Path]:
    """name -> directory (manager binary, CRDs, webhook configurations) of the JobSet and LWS controllers."""
    if "error-controllers" in _build:
        raise _build["error-controllers"]
    return _build.get("controllers") or {name: ensure_controller(name) for name in ML_CONTROLLERS}


@pytest.fixture(scope="session")
def e2e_binary_136(request) -> Path:
    """The e2e-cluster binary built against Kubernetes 1.36 (tests/e2e/cluster/go-1.36.mod)."""
    if TIER_VERSION == "1.36":
        return request.getfixturevalue("e2e_binary")
    request.getfixturevalue("e2e_binary")  # the same Go checks and skip lines
    version = go_version()
    if version is not None and version < (1, 26):
        pytest.skip(f"e2e: Go {version[0]}.{version[1]} found; the Kubernetes 1.36.3 modules need Go >= 1.26")
    if "error-1.36" in _build:
        raise _build["error-1.36"]
    return _build.get("binary-1.36") or ensure_binary("1.36")


@pytest.fixture(scope="session")
def control_plane_136(e2e_binary_136, tmp_path_factory, request):
    """A Kubernetes 1.36 control plane: the tier's own on a 1.36 run, else a second one next to it."""
    if TIER_VERSION == "1.36":
        yield request.getfixturevalue("control_plane")
        return
    root = tmp_path_factory.mktemp("control-plane-136")
    cp = ControlPlane(e2e_binary_136, root / "state", etcd_dir=root / "etcd")
    cp.start()
    yield cp
    cp.stop()


@pytest.fixture(scope="session")
def control_plane(e2e_binary, tmp_path_factory):
    root = tmp_path_factory.mktemp("control-plane")
    cp = ControlPlane(e2e_binary, root / "state", etcd_dir=root / "etcd")
    cp.start()
    yield cp
    cp.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.e2e_call_failed = report.failed
    return report


@pytest.fixture
def kubelet_factory(e2e_binary, control_plane, request):
    """Start kubelet stand-ins for simulated nodes; all are stopped at the end of the test.

    Their directories (short /tmp paths, for unix socket limits) are removed when the test passed
    and kept, with kubelet.log and report.jsonl, when it failed.
    """
    started: list[KubeletStandIn] = []

    def start(node: str) -> KubeletStandIn:
        k = KubeletStandIn(e2e_binary, control_plane.kubeconfig, node)
        started.append(k)
        return k.start()

    yield start
    for k in started:
        k.stop()
    if getattr(request.node, "e2e_call_failed", True) is False:
        for k in started:
            shutil.rmtree(k.root, ignore_errors=True)


@pytest.fixture
def sa_kubeconfig_factory(e2e_binary, control_plane, tmp_path):
    """make(namespace, serviceaccount, node) -> kubeconfig of a token bound to a placeholder pod on node."""

    def make(namespace: str, serviceaccount: str, node: str) -> Path:
        out = tmp_path / f"{namespace}-{serviceaccount}-{node}.kubeconfig"
        return sa_kubeconfig(e2e_binary, control_plane.kubeconfig, namespace, serviceaccount, node, out)

    return make


# The field-failure modules' API client (with the drivers' RBAC) and their simulated nodes.
@pytest.fixture(scope="module")
def api(control_plane) -> client.ApiClient:
    api = config.new_client_from_config(str(control_plane.kubeconfig))
    ensure_driver_rbac(api)
    return api


@pytest.fixture
def nodes(api, kubelet_factory, sa_kubeconfig_factory):
    factory = NodeFactory(api, kubelet_factory, sa_kubeconfig_factory)
    yield factory
    factory.close()  # drivers stopped before kubelet_factory stops the stand-ins
