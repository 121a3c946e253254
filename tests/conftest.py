import datetime
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent

# jsii (used by the CDK and cdk8s tests) must run on the pinned, supported Node.js.
_node_bin = REPO / "node_modules" / ".bin"
if _node_bin.is_dir() and str(_node_bin) not in os.environ.get("PATH", ""):
    os.environ["PATH"] = f"{_node_bin}{os.pathsep}{os.environ.get('PATH', '')}"


@pytest.fixture(autouse=True)
def _eks_calendar_day(monkeypatch):
    """Judge the EKS support windows on a fixed day (2026-12-01, when these tests were written), so that the suite
    does not change result when a window closes; the tests of the windows pass their own dates."""
    monkeypatch.setattr("eks_dra.versions.utc_today", lambda: datetime.date(2026, 12, 1))


@pytest.fixture
def fresh_shared_nvml(monkeypatch):
    """The process-wide NVML of eks_dra.drivers.gpu.nvml as at a driver's start (nothing loaded, no failure
    remembered), restored after the test; gives the module."""
    from eks_dra.drivers.gpu import nvml

    for name, value in (("_shared", None), ("_shared_error", ""), ("_shared_failed_at", 0.0),
                        ("_shared_failed_for", None)):
        monkeypatch.setattr(nvml, name, value)
    return nvml
