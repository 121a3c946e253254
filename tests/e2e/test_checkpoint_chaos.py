"""Seeded kill -9 chaos (prepare, unprepare, start-up, every step of recovery) on the real control
plane; the invariants of tests/e2e/chaos.py after every restart. A short run here; the long run (1,000
operations, >= 100 kills) is `python bench/checkpoint_chaos.py` (EKS_DRA_CHAOS_OPS / EKS_DRA_CHAOS_SEEDS)."""

from __future__ import annotations

import os

import pytest
from chaos import run_chaos
from drivers.harness import short_tmp
from kubernetes import config

pytestmark = pytest.mark.e2e
OPS = int(os.environ.get("EKS_DRA_CHAOS_OPS", "60"))
SEEDS = [int(s) for s in os.environ.get("EKS_DRA_CHAOS_SEEDS", "16").split(",")]


@pytest.mark.parametrize("seed", SEEDS)
def test_kill_9_chaos_loses_no_claim_and_never_double_allocates(control_plane, seed):
    api = config.new_client_from_config(str(control_plane.kubeconfig))
    result = run_chaos(api, control_plane.kubeconfig, short_tmp(), seed, OPS)
    print(f"seed {seed}: {result.line()}")
    assert sum(result.kills.values()) >= OPS // 10, result.line()  # the run really killed the driver
    assert result.violations == [], "\n".join(result.violations[:20])
