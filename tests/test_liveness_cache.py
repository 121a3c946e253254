"""The liveness verdict is computed off the request path, and a stale one counts as unhealthy."""

from __future__ import annotations

import threading
import time

from eks_dra.drivers.framework.health import LivenessCache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_request_never_waits_for_the_check():
    release = threading.Event()
    cache = LivenessCache(lambda: "" if release.wait(10) else "timed out", interval_s=0.05).start()
    try:
        t0 = time.monotonic()
        assert cache.verdict() == (False, "not checked yet")  # the first check is still blocked
        assert time.monotonic() - t0 < 0.1
        release.set()
        deadline = time.monotonic() + 5
        while not cache.verdict()[0] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cache.verdict()[0]
    finally:
        cache.stop()
        release.set()


def test_verdict_reports_the_problem_and_its_age_and_goes_stale():
    clock, problems = Clock(), ["UNAVAILABLE: no socket", ""]
    cache = LivenessCache(lambda: problems.pop(0), stale_after_s=8, clock=clock)
    cache.refresh()
    clock.now += 1.5
    assert cache.verdict() == (False, "UNAVAILABLE: no socket (checked 1.5 s ago)")
    cache.refresh()
    clock.now += 7.9
    assert cache.verdict() == (True, "ok (checked 7.9 s ago)")
    clock.now += 0.2  # no refresh came: the checker is stuck, and a stuck checker vouches for nothing
    alive, why = cache.verdict()
    assert not alive and "older than 8 s" in why


def test_a_check_that_raises_is_a_failed_check():
    def broken() -> str:
        raise RuntimeError("boom")

    cache = LivenessCache(broken)
    cache.refresh()
    assert cache.verdict()[0] is False and "RuntimeError: boom" in cache.verdict()[1]
