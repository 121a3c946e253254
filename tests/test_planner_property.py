"""Property tests of the allocator on random small nodes and claims.

1. Whatever the planner allocates satisfies every selector and constraint, and no device goes to two claims.
2. Against an exhaustive search without pruning (every combination of devices, in the upstream search order,
   with the same error rule for allocationMode All): the same outcome, and the same first solution.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eks_dra.planner.allocator import AllocationError, Matcher, NodeSearch
from eks_dra.planner.cel_env import CelEnvironment
from eks_dra.planner.model import ClaimSpec, DeviceClass, DeviceRequest, MatchAttribute, PlanClaim, Request, Source
from eks_dra.planner.plan import Planner
from eks_dra.planner.simulate import number_nodes, sim_device, sim_node

DRIVERS = ("a.example.com", "b.example.com")
ROOT = "resource.kubernetes.io/root"
ENV = CelEnvironment()
SRC = Source("test.yaml", "ResourceClaim", "x", "default")
# name -> (CEL expression, the same predicate in Python)
CLASS_SELECTORS = {
    "class-a": ("device.driver == 'a.example.com'", lambda d: d.driver == "a.example.com"),
    "class-b": ("device.driver == 'b.example.com'", lambda d: d.driver == "b.example.com"),
    "any": ("true", lambda d: True),
}
REQUEST_SELECTORS = {
    "root0": ("device.attributes['resource.kubernetes.io'].root == 'r0'", lambda d: d.attributes[ROOT] == "r0"),
    "a-at-least-1": ("'a' in device.attributes[device.driver] && device.attributes[device.driver].a >= 1",
                     lambda d: d.attributes.get("a", -1) >= 1),
}
CLASSES = {name: DeviceClass(name, (ENV.compile(expr, f"DeviceClass {name}"),), Source("c.yaml", "DeviceClass", name))
           for name, (expr, _) in CLASS_SELECTORS.items()}
SELECTORS = {name: ENV.compile(expr, f"selector {name}") for name, (expr, _) in REQUEST_SELECTORS.items()}
CONSTRAINT_ATTRS = (ROOT, "a.example.com/b")
_KEYS = itertools.count()  # every generated claim spec is distinct for the planner's failure memo


def selects(request: DeviceRequest, device) -> bool:
    if not CLASS_SELECTORS[request.device_class.name][1](device):
        return False
    return all(REQUEST_SELECTORS[next(k for k, v in SELECTORS.items() if v is s)][1](device) for s in request.selectors)


@st.composite
def devices(draw):
    out = []
    for i in range(draw(st.integers(1, 6))):
        attrs = {ROOT: draw(st.sampled_from(["r0", "r1"])), "b": draw(st.sampled_from(["x", "y"]))}
        if draw(st.booleans()):
            attrs["a"] = draw(st.integers(0, 2))
        out.append((draw(st.sampled_from(DRIVERS)), f"dev-{i}", attrs))
    return out


@st.composite
def device_requests(draw, name: str, sub: str | None):
    all_devices = draw(st.integers(0, 4)) == 0
    return DeviceRequest(
        name, sub, CLASSES[draw(st.sampled_from(sorted(CLASSES)))],
        tuple(SELECTORS[s] for s in draw(st.lists(st.sampled_from(sorted(SELECTORS)), max_size=1))),
        all_devices, 1 if all_devices else draw(st.integers(1, 3)), False, "spec")


@st.composite
def claims(draw, name: str):
    requests = []
    for i in range(draw(st.integers(1, 3))):
        rname = f"r{i}"
        if draw(st.integers(0, 3)) == 0:
            alts = tuple(draw(device_requests(rname, f"s{j}")) for j in range(2))
            requests.append(Request(rname, alts, True))
        else:
            requests.append(Request(rname, (draw(device_requests(rname, None)),), False))
    names = [r.name for r in requests] + [a.result_name for r in requests if r.first_available for a in r.alternatives]
    constraints = tuple(
        MatchAttribute(draw(st.sampled_from(CONSTRAINT_ATTRS)), tuple(draw(st.lists(st.sampled_from(names),
                                                                                    max_size=2, unique=True))), k)
        for k in range(draw(st.integers(0, 2))))
    return PlanClaim(name, "default", ClaimSpec(tuple(requests), constraints, key=f"{name}#{next(_KEYS)}"), SRC)


def make_node(specs, name="node-0"):
    return sim_node(name, "synthetic", [sim_device(drv, name, dev, attrs) for drv, dev, attrs in specs])


# --- the exhaustive reference search ------------------------------------------------------------------

class Stop(Exception):
    pass


def constraints_hold(claim: PlanClaim, chosen: list[tuple[DeviceRequest, object]]) -> bool:
    for c in claim.spec.constraints:
        values = [d.attribute(c.attribute) for r, d in chosen if c.applies(r)]
        if None in values or len(set(values)) > 1:
            return False
    return True


def exhaustive(node, pod_claims: list[PlanClaim]):
    slots = [(i, r) for i, c in enumerate(pod_claims) for r in c.spec.requests]
    chosen: list[list] = [[] for _ in pod_claims]

    def used():
        return {id(d) for picks in chosen for _, d in picks}

    def step(k: int) -> bool:
        if k == len(slots):
            return True
        ci, request = slots[k]
        for alt in request.alternatives:
            matching = [d for d in node.devices if selects(alt, d)]
            if alt.all_devices:
                if not matching:
                    continue
                before = list(chosen[ci])
                ok = True
                for d in matching:
                    if id(d) in used():
                        ok = False
                        break
                    chosen[ci].append((alt, d))
                    if not constraints_hold(pod_claims[ci], chosen[ci]):
                        raise Stop()
                if ok and step(k + 1):
                    return True
                chosen[ci][:] = before
                continue
            free = [d for d in matching if id(d) not in used()]
            for combo in itertools.combinations(free, alt.count):
                chosen[ci].extend((alt, d) for d in combo)
                if constraints_hold(pod_claims[ci], chosen[ci]) and step(k + 1):
                    return True
                del chosen[ci][-alt.count:]
        return False

    try:
        return [[(r.result_name, d.name) for r, d in picks] for picks in chosen] if step(0) else None
    except Stop:
        return "error"


def planner_outcome(node, pod_claims):
    try:
        found = NodeSearch(Matcher(ENV), node, pod_claims).run()
    except AllocationError:
        return "error"
    return None if found is None else [[(r.result_name, d.name) for r, d in picks] for picks in found]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(devices(), st.lists(st.sampled_from(["c0", "c1"]), min_size=1, max_size=2, unique=True).flatmap(
    lambda names: st.tuples(*(claims(n) for n in names))))
def test_planner_agrees_with_exhaustive_search(node_specs, pod_claims):
    node = number_nodes([make_node(node_specs)])[0]
    pod_claims = list(pod_claims)
    assert planner_outcome(node, pod_claims) == exhaustive(node, pod_claims)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(devices(), min_size=1, max_size=3),
       st.lists(st.integers(0, 9).flatmap(lambda i: claims(f"c{i}")), min_size=1, max_size=5))
def test_every_allocation_is_valid_and_exclusive(node_specs, plan_claims):
    from eks_dra.planner.model import PlanPod

    nodes = number_nodes([make_node(specs, f"node-{i}") for i, specs in enumerate(node_specs)])
    for i, c in enumerate(plan_claims):
        c.name = f"claim-{i}"
    pods = [PlanPod(c.name, "default", [c], SRC, implicit=True) for c in plan_claims]
    result = Planner(ENV, nodes).run(pods)
    owners: dict[tuple[str, str], str] = {}
    by_name = {(n.name, d.name): d for n in nodes for d in n.devices}
    for claim in result.claims:
        if not claim.allocated:
            assert claim.reason
            continue
        assert {d.pool for d in claim.devices} <= {claim.node}
        picks = []
        for allocated in claim.devices:
            key = (allocated.pool, allocated.device)
            assert key not in owners, f"{key} given to {owners.get(key)} and {claim.name}"
            owners[key] = claim.name
            request = next(a for r in claim.spec.requests for a in r.alternatives
                           if a.result_name == allocated.request)
            device = by_name[key]
            assert selects(request, device)
            picks.append((request, device))
        assert constraints_hold(claim, picks)
        for request in claim.spec.requests:
            got = [r for r, _ in picks if r.request == request.name]
            assert len({r.result_name for r in got}) == 1  # one subrequest chosen
            alt = got[0]
            node = next(n for n in nodes if n.name == claim.node)
            expected = sum(1 for d in node.devices if selects(alt, d)) if alt.all_devices else alt.count
            assert len(got) == expected
