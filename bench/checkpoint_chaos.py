"""The long kill -9 chaos run (tests/e2e/chaos.py) on the real Kubernetes 1.34 control plane of tests/e2e.

Runs tests/e2e/test_checkpoint_chaos.py with EKS_DRA_CHAOS_OPS operations per seed (default 1,000) and
prints, per seed, the operation and kill counts and the violations (target: >= 100 kills, 0 violations).

    python bench/checkpoint_chaos.py [--ops 1000] [--seeds 1,2]

Needs Go (the control plane is built by tests/e2e/build.sh on first use).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=1000)
    p.add_argument("--seeds", default="1")
    args = p.parse_args()
    env = {**os.environ, "EKS_DRA_CHAOS_OPS": str(args.ops), "EKS_DRA_CHAOS_SEEDS": args.seeds}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                           "tests/e2e/test_checkpoint_chaos.py"], cwd=REPO, env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("seed ")]
    print(f"== kill -9 chaos, {args.ops} operations per seed, seeds {args.seeds}: pytest exit {proc.returncode}, "
          f"{time.monotonic() - t0:.0f} s")
    for line in lines:
        print(f"  {line}")
    if proc.returncode != 0:
        print(proc.stdout[-6000:], proc.stderr[-2000:], sep="\n")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
