"""The 1.34 scheduler's DRA filter timeout, predicted from the allocator's walk.

The 1.34 allocator (k8s.io/dynamic-resource-allocation v0.34, structured/internal/experimental
`allocateOne`) tries the orderings of a request's candidates: S(m) = 1 + m * S(m - 1) invocations for m
candidates that cannot give the count, S(9) = 986,410 and S(10) = 9,864,101. One invocation costs
0.8 + 0.17 * (devices on the node) microseconds, plus 0.15 per free candidate under a matchAttribute
constraint, as measured on the real 1.34.12 scheduler (tests/e2e/test_filter_timeout_134.py runs these cases
there). Each case below is worked by hand in its
comment; the e2e tier imports CASES and compares the scheduler's answer with the planner's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from eks_dra.planner.cel_env import CelEnvironment
from eks_dra.planner.claims import load_manifests
from eks_dra.planner.plan import Planner, PlanResult
from eks_dra.planner.simulate import nodes_for_instance_type, nodes_from_slices

DRIVER = "timeout.e2e.example.com"
CLASS = "timeout-devices"
NODE = "timeout-node"


@dataclass(frozen=True)
class Case:
    """One claim on one node whose devices d00, d01, ... carry the given attributes (besides `index`);
    `allocated` is the (request, device) results, None where the filter times out."""

    name: str
    attributes: tuple[dict, ...]  # one per device d0, d1, ...
    requests: tuple[dict, ...]  # deviceClassName CLASS; DRIVER in selectors
    allocated: tuple[tuple[str, str], ...] | None
    constraints: tuple[str, ...] = ()  # matchAttribute of DRIVER/<name> over all requests


def sub(name: str, count: int, *selectors: str) -> dict:
    body = {"name": name, "deviceClassName": CLASS, "count": count}
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return body


def first_available(name: str, *subs: dict) -> dict:
    return {"name": name, "firstAvailable": list(subs)}


def exactly(name: str, count: int, *selectors: str) -> dict:
    body = sub(name, count, *selectors)
    del body["name"]
    return {"name": name, "exactly": body}


def side(value: str) -> str:
    return f"device.attributes['{DRIVER}'].side == '{value}'"


def plain(n: int) -> tuple[dict, ...]:
    return tuple({} for _ in range(n))


def grouped(*sizes: int) -> tuple[dict, ...]:
    return tuple({"grp": {"int": g}} for g, size in enumerate(sizes) for _ in range(size))


# The timeout cases share one claim, so the e2e tier times them out together (one 10 s, the scheduler
# filters nodes in parallel): 11 devices of one matchAttribute group, or else one.
ELEVEN_OF_ONE_GROUP = (first_available("r", sub("big", 11), sub("one", 1)),)

CASES = [
    # 33 > 32: allocateOne returns errAllocationResultMaxSizeExceeded before any walk; next subrequest.
    Case("over-the-claim-limit", plain(16), (first_available("r", sub("big", 33), sub("one", 1)),),
         (("r/one", "d00"),)),
    # The same limit counts the claim's earlier devices: 16 (base) + 17 = 33 > 32 at once.
    Case("over-the-limit-after-base", tuple({"side": {"string": "a" if i < 16 else "b"}} for i in range(32)),
         (exactly("base", 16, side("a")), first_available("r", sub("big", 17, side("b")), sub("one", 1, side("b")))),
         tuple(("base", f"d{i:02}") for i in range(16)) + (("r/one", "d16"),)),
    # 9 candidates: S(9) = 986,410 invocations x (0.8 + 0.17 * 9) us = 2.3 s < 10 s; next subrequest.
    Case("nine-candidates", plain(9), (first_available("r", sub("big", 10), sub("one", 1)),), (("r/one", "d00"),)),
    # 10 candidates: S(10) = 9,864,101 x (0.8 + 0.17 * 10 + 0.15 * 10) us = 39.5 s: the filter times out.
    Case("ten-candidates", grouped(10), ELEVEN_OF_ONE_GROUP, None, constraints=("grp",)),
    # matchAttribute splits 16 into 8 + 8: 1 + 2 (S(8) - 1) = 219,201 x (0.8 + 0.17 * 16 + 0.15 * 16) us = 1.3 s.
    Case("groups-of-eight", grouped(8, 8), (first_available("r", sub("big", 9), sub("one", 1)),),
         (("r/one", "d00"),), constraints=("grp",)),
    # 10 + 6: 1 + (S(10) - 1) + (S(6) - 1) = 9,866,057 x 5.92 us = 58 s, though 11 <= 16 candidates.
    Case("groups-of-ten-and-six", grouped(10, 6), ELEVEN_OF_ONE_GROUP, None, constraints=("grp",)),
    # 8 + 12 devices, 9 asked: the walk starts a sequence at each of the first group's 8 devices, 1 + 8 S(7) =
    # 109,601 invocations x (0.8 + 0.17 * 20 + 0.15 * 20) us = 0.8 s, then meets the count in the second group.
    Case("small-group-walked-in-time", grouped(8, 12), (first_available("r", sub("big", 9), sub("one", 1)),),
         tuple(("r/big", f"d{i:02}") for i in range(8, 17)), constraints=("grp",)),
    # 10 + 12, 11 asked: 11 fit in the second group, but the walk first starts a sequence at each of the first
    # group's 10 devices: 1 + 10 S(9) = 9,864,101 x (0.8 + 0.17 * 22 + 0.15 * 22) us = 77.3 s.
    Case("small-group-first", grouped(10, 12), ELEVEN_OF_ONE_GROUP, None, constraints=("grp",)),
    # The later request overflows the limit (8 + 25 = 33): errAllocationResultMaxSizeExceeded unwinds the
    # walk of r/eight at once; r/one leaves room for 25.
    Case("later-request-over-the-limit", plain(26), (first_available("r", sub("eight", 8), sub("one", 1)),
                                                     exactly("rest", 25)),
         (("r/one", "d00"),) + tuple(("rest", f"d{i:02}") for i in range(1, 26))),
    # r/two takes 2 of 8 and `seven` cannot follow (6 left): each of the 8 * 7 = 56 sequences of r/two is
    # followed by the walk of `seven`, S(6) = 1,957 invocations: 109,592 + 65 x (0.8 + 0.17 * 8) us = 0.24 s.
    Case("backtracks-in-time", plain(8), (first_available("r", sub("two", 2), sub("one", 1)), exactly("seven", 7)),
         (("r/one", "d00"),) + tuple(("seven", f"d{i:02}") for i in range(1, 8))),
    # 10 devices, r/three then `nine`: 10 * 9 * 8 = 720 sequences, each followed by S(7) = 13,700 invocations:
    # 9,864,000 x (0.8 + 0.17 * 10) us = 24.7 s.
    Case("backtracks-too-long", plain(10), (first_available("r", sub("three", 3), sub("one", 1)),
                                            exactly("nine", 9)), None),
]
CASES_BY_NAME = {c.name: c for c in CASES}


def materialize(case: Case, driver: str = DRIVER, device_class: str = CLASS,
                node: str = NODE) -> tuple[dict, dict, dict]:
    """(DeviceClass, ResourceSlice, ResourceClaim) of a case under the given names."""
    def named(obj):
        return yaml.safe_load(yaml.safe_dump(obj).replace(DRIVER, driver).replace(CLASS, device_class))

    klass = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": device_class},
             "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]}}
    slice_ = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-slice"},
              "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                      "resourceSliceCount": 1},
                       "devices": [{"name": f"d{i:02}", "attributes": {"index": {"int": i}, **attrs}}
                                   for i, attrs in enumerate(case.attributes)]}}
    devices_spec: dict = {"requests": named(list(case.requests))}
    if case.constraints:
        devices_spec["constraints"] = [{"matchAttribute": f"{driver}/{c}"} for c in case.constraints]
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": case.name, "namespace": "default"}, "spec": {"devices": devices_spec}}
    return klass, slice_, claim


def plan_objects(tmp_path, objects: list[dict], slices: list[dict], version: str = "1.34") -> PlanResult:
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    env = CelEnvironment()
    pods = load_manifests([path], env).pods
    return Planner(env, nodes_from_slices([(s, "slices.yaml") for s in slices]), kubernetes_version=version).run(pods)


def planned(tmp_path, case: Case, version: str = "1.34") -> tuple[tuple[tuple[str, str], ...] | None, str]:
    """The case's (request, device) results, or None and the reason it is not allocated."""
    klass, slice_, claim = materialize(case)
    result = plan_objects(tmp_path, [klass, claim], [slice_], version)
    found = next(c for c in result.claims if c.name == case.name)
    if not found.allocated:
        return None, found.reason or ""
    return tuple((d.request, d.device) for d in found.devices), ""


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_1_34_scheduler_times_out_or_falls_through(tmp_path, case):
    got, reason = planned(tmp_path, case)
    assert got == case.allocated, reason
    if case.allocated is None:
        assert "never scheduled on node timeout-node" in reason and "filter timeout" in reason


def test_the_timeout_names_the_subrequest_and_the_search(tmp_path):
    _, reason = planned(tmp_path, CASES_BY_NAME["ten-candidates"])
    assert reason == (
        "request r: on Kubernetes 1.34 never scheduled on node timeout-node: subrequest r/big asks for 11 of the 10 "
        "devices that match it, and the allocator tries their orderings (an estimated 39.5 s) until the "
        "scheduler's 10 s filter timeout instead of trying the next subrequest (kubernetes/kubernetes#131730, "
        "fixed in 1.35); put a subrequest that fits first")
    _, reason = planned(tmp_path, CASES_BY_NAME["groups-of-ten-and-six"])
    assert "subrequest r/big asks for 11 of the 16 devices that match it (in 2 groups of equal matchAttribute " \
           "values), and the allocator tries their orderings (an estimated 58.4 s)" in reason
    _, reason = planned(tmp_path, CASES_BY_NAME["small-group-first"])
    assert "asks for 11 of the 22 devices that match it (in 2 groups" in reason and "(an estimated 77.3 s)" in reason
    _, reason = planned(tmp_path, CASES_BY_NAME["backtracks-too-long"])
    assert "subrequest r/three takes 3 of the 10 devices that match it, the later requests cannot follow, and the " \
           "allocator tries every ordering of those devices (an estimated 24.7 s)" in reason


def test_later_requests_that_cannot_follow_make_the_walk_try_every_ordering(tmp_path):
    # r/eight takes 8 of 16, `nine` then needs 9 of the 8 left: 16!/8! = 518,918,400 sequences, each followed
    # by S(8) = 109,601 invocations: 5.7e13 x (0.8 + 0.17 * 16) us = 2e8 s.
    case = Case("cannot-follow", plain(16), (first_available("r", sub("eight", 8), sub("one", 1)), exactly("nine", 9)),
                None)
    assert_timeout(tmp_path, case, "subrequest r/eight takes 8 of the 16 devices", "(an estimated 2e+08 s)")
    # The planner's own search enters `nine` after each combination it tries (a firstAvailable request is not
    # looked ahead to): those walks count once, not again in the branch's estimate. C(10, 3) = 120 entries.
    entered = Case("cannot-follow", plain(10), (first_available("r", sub("three", 3), sub("one", 1)),
                                                first_available("n", sub("nine", 9), sub("none", 9))), None)
    assert_timeout(tmp_path, entered, "subrequest r/three takes 3 of the 10 devices", "(an estimated 49.3 s)")


def test_the_claim_limit_counts_the_earlier_requests(tmp_path):
    # 15 (base) + 17 = 32 is within the limit: the walk runs over the 16 candidates of side b, S(16) ~ 5.7e13.
    case = Case("within-the-limit", tuple({"side": {"string": "a" if i < 16 else "b"}} for i in range(32)),
                (exactly("base", 15, side("a")), first_available("r", sub("big", 17, side("b")),
                                                                  sub("one", 1, side("b")))), None)
    assert_timeout(tmp_path, case, "subrequest r/big asks for 17 of the 16 devices that match it")


def test_devices_in_use_leave_fewer_candidates(tmp_path):
    # 16 devices, 7 held by another pod's claim: 9 candidates left, S(9) x 3.52 us = 3.5 s; 6 held: 10 left, 35 s.
    for held, allocated in ((7, True), (6, False)):
        case = Case("after-others", plain(16), (first_available("r", sub("big", 10 if held == 7 else 11),
                                                                sub("one", 1)),), None)
        klass, slice_, claim = materialize(case)
        holder = materialize(Case("holder", plain(16), (exactly("held", held),), None))[2]
        result = plan_objects(tmp_path, [klass, holder, claim], [slice_])
        found = next(c for c in result.claims if c.name == "after-others")
        assert found.allocated == allocated, found.reason
        if allocated:
            assert [(d.request, d.device) for d in found.devices] == [("r/one", f"d{held:02}")]
        else:
            assert "asks for 11 of the 10 devices that match it" in found.reason


def test_an_exactly_request_times_out_too(tmp_path):
    # No next subrequest: the pod is unschedulable either way, the scheduler says it timed out.
    _, reason = planned(tmp_path, Case("ten", plain(10), (exactly("all-but", 11),), None))
    assert "request all-but asks for 11 of the 10 devices" in reason and "no more devices than the node has" \
        in reason and "next subrequest" not in reason
    _, reason = planned(tmp_path, Case("nine", plain(9), (exactly("all-but", 10),), None))
    assert "filter timeout" not in reason and reason


@pytest.mark.parametrize("name", ["ten-candidates", "groups-of-ten-and-six"])
def test_from_1_35_the_next_subrequest_is_tried(tmp_path, name):
    got, reason = planned(tmp_path, CASES_BY_NAME[name], version="1.35")
    assert got == (("r/one", "d00"),), reason


def test_a_node_that_times_out_leaves_the_pod_to_another(tmp_path):
    # Two trn2.48xlarge nodes (16 Neuron devices each): the first holds 6 for another claim, so 11 of its 10
    # free ones time out there (the 1.35 answer, n/one on the first node, is never tried); the second fits 11.
    neurons = [{"name": "n", "firstAvailable": [
        {"name": "eleven", "deviceClassName": "neuron.aws.com", "count": 11},
        {"name": "one", "deviceClassName": "neuron.aws.com", "count": 1}]}]
    holder = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "holder"},
              "spec": {"devices": {"requests": [{"name": "six", "exactly": {"deviceClassName": "neuron.aws.com",
                                                                             "count": 6}}]}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "holder"},
           "spec": {"nodeName": "trn2.48xlarge-0", "resourceClaims": [{"name": "c", "resourceClaimName": "holder"}],
                    "tolerations": [{"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [{"name": "c", "image": "x"}]}}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "eleven"},
             "spec": {"devices": {"requests": neurons}}}
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all([holder, pod, claim]))
    env = CelEnvironment()
    pods = load_manifests([Path(__file__).parent / "planner" / "classes.yaml", path], env).pods
    result = Planner(env, nodes_for_instance_type("trn2.48xlarge", 2)).run(pods)
    found = next(c for c in result.claims if c.name == "eleven")
    assert found.allocated and found.node == "trn2.48xlarge-1", found.reason
    assert {d.request for d in found.devices} == {"n/eleven"}
    holder_claim = next(c for c in result.claims if c.name == "holder")
    assert holder_claim.allocated and holder_claim.node == "trn2.48xlarge-0", holder_claim.reason


def assert_timeout(tmp_path: Path, case: Case, *texts: str) -> None:
    got, reason = planned(tmp_path, case)
    assert got is None, got
    for text in texts:
        assert text in reason, reason

