"""The structured-parameters allocator of Kubernetes 1.34 (`resource.k8s.io/v1`), for one pod on one node.

Semantics follow `k8s.io/dynamic-resource-allocation/structured` (the allocator that 1.34 runs with its
default feature gates, i.e. with DRAAdminAccess and DRAPrioritizedList): the pod's unallocated claims are
allocated together; claims, requests and the devices of a request are taken in order; a device must match
the DeviceClass selectors and then the request selectors, must not be in use (admin access excepted) and
must keep every `matchAttribute` constraint; `firstAvailable` subrequests are tried in order; `All` takes
every matching device of the node and a constraint that one of them breaks is an error, as is a CEL
evaluation error or a claim needing more than 32 devices. The search is exhaustive with backtracking, so
an allocation is found whenever one exists, and it returns the same first solution as the upstream search:
the pruning below only cuts branches that cannot lead to a solution.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from .cel_env import CelEnvironment, Selector, SelectorRuntimeError
from .model import DeviceRequest, MatchAttribute, PlanClaim, Request, tolerates
from .simulate import SimDevice, SimNode

MAX_RESULTS_PER_CLAIM = 32  # AllocationResultsMaxSize
MAX_SEARCH_STEPS = 1_000_000  # stands in for kube-scheduler's DRA filter timeout (10 s)


class AllocationError(Exception):
    """An error, not a mismatch: kube-scheduler stops trying to schedule the pod (on any node)."""


_MISSING = ("missing", None)
_NO_SUCH_KEY = "no such key: "


def _read(device: SimDevice, ref: tuple[str, str, str | None]) -> object:
    """The part of a device that one static reference of a selector reads."""
    kind, domain, ident = ref
    if kind == "attributes":
        if ident is None:
            return tuple(sorted(k.rpartition("/")[2] for k in device.qualified if k.rpartition("/")[0] == domain))
        return device.qualified.get(f"{domain}/{ident}", _MISSING)
    if ident is None:
        return tuple(sorted(k.rpartition("/")[2] for k in _qualified_capacity(device) if k.startswith(domain + "/")))
    return _qualified_capacity(device).get(f"{domain}/{ident}", _MISSING)


def _qualified_capacity(device: SimDevice) -> dict[str, str]:
    return {(k if "/" in k else f"{device.driver}/{k}"): v for k, v in device.capacity.items()}


@dataclass
class Candidates:
    """The devices of a node that a request selects, in walk order; CEL errors kept where they occur."""

    devices: list[SimDevice]  # matching devices and devices whose evaluation failed
    errors: dict[int, str] = field(default_factory=dict)  # device index -> message

    @property
    def matching(self) -> list[SimDevice]:
        return [d for d in self.devices if d.index not in self.errors]


class Matcher:
    """Evaluates selectors on the devices of one plan (device uids unique), each pair at most once."""

    def __init__(self, env: CelEnvironment) -> None:
        self.env = env
        self._results: dict[tuple[str, int], bool | str] = {}
        self._candidates: dict[tuple[tuple, int], Candidates] = {}
        self._contexts: dict[int, tuple[int, object]] = {}  # device uid -> (env generation, CEL context)
        self._shared: dict[tuple, bool | SelectorRuntimeError] = {}

    def _context(self, device: SimDevice):
        cached = self._contexts.get(device.uid)
        if cached is None or cached[0] != self.env.generation:
            cached = (self.env.generation, self.env.context(device.driver, device.attributes, device.capacity))
            self._contexts[device.uid] = cached
        return cached[1]

    def _eval(self, selector: Selector, device: SimDevice) -> bool | str:
        key = (selector.expression, device.uid)
        result = self._results.get(key)
        if result is None:
            # Devices that agree on everything the expression reads share one evaluation (the same GPU
            # of every node of a node group differs only in its uuid).
            shared_key = None if selector.references is None else \
                (selector.expression, device.driver, tuple(_read(device, ref) for ref in sorted(
                    selector.references, key=lambda r: (r[0], r[1], r[2] or ""))))
            raw = self._shared.get(shared_key) if shared_key is not None else None
            if raw is None:
                try:
                    raw = self.env.evaluate(selector, self._context(device))
                except SelectorRuntimeError as exc:
                    raw = exc
                if shared_key is not None:
                    self._shared[shared_key] = raw
            result = raw if isinstance(raw, bool) else (f"{selector.where}: CEL runtime error on device "
                                                         f"{device.name} of node {device.pool}: "
                                                         f"{explain_missing_key(str(raw), selector, device)}")
            self._results[key] = result
        return result

    def selects(self, selectors, device: SimDevice) -> bool | str:
        """True, False, or the error message of the first failing selector (in order, like Kubernetes)."""
        for selector in selectors:
            result = self._eval(selector, device)
            if result is not True:
                return result
        return True

    def candidates(self, request: DeviceRequest, node: SimNode) -> Candidates:
        key = (request.match_key, node.index)
        found = self._candidates.get(key)
        if found is None:
            found = Candidates([])
            for device in node.devices:
                # A device taint (DRADeviceTaints) keeps every request off the device that does not tolerate it.
                if any(effect in ("NoSchedule", "NoExecute") and not tolerates(request.tolerations, key, value, effect)
                       for key, value, effect in device.taints):
                    continue
                result = self.selects(request.device_class.selectors, device)
                if result is True:
                    result = self.selects(request.selectors, device)
                if result is False:
                    continue
                found.devices.append(device)
                if result is not True:
                    found.errors[device.index] = result
            self._candidates[key] = found
        return found


@dataclass(eq=False)
class _Slot:
    claim: int
    request: Request


# Kubernetes 1.34 runs the "experimental" allocator of k8s.io/dynamic-resource-allocation v0.34
# (structured/allocator.go NewAllocator takes the first implementation that supports every enabled gate, and
# DRAResourceClaimDeviceStatus, beta and on in 1.34, is supported by structured/internal/experimental only).
# Its search, structured/internal/experimental/allocator_experimental.go `allocateOne`, picks each device of
# an ExactCount request by walking every device of the node's pools from the first one, so it tries the
# ordered sequences (permutations) of the candidates, not their combinations, and nothing checks beforehand
# that a request has enough candidates. When a request (or `firstAvailable` subrequest) asks for N devices:
#   - if the claim's devices so far plus N exceed 32 (AllocationResultsMaxSize), `allocateOne` returns
#     errAllocationResultMaxSizeExceeded at once and the subrequest loop tries the next subrequest: no search;
#   - otherwise, with M usable candidates (matching, not in use, keeping the `matchAttribute` values fixed so
#     far) split into groups by the values of the constraints still open (the first device fixes them), the
#     walk visits 1 + sum over groups of (S(m) - 1) invocations before it gives up when no group holds N,
#     where S(m) = 1 + m * S(m - 1), S(0) = 1 counts the sequences of m devices (S(9) ~ 1e6, S(10) ~ 1e7).
#     A satisfiable request first exhausts the groups too small that it meets, then takes N devices;
#   - a request that is met but whose later requests then fail is walked in full (every sequence of up to N
#     devices, each full one followed by the next request's walk: 720 x S(7) for 3 of 10 devices followed by
#     a request of 9), unless the failure is errAllocationResultMaxSizeExceeded, which unwinds at once;
#   - allocationMode All takes its devices in one fixed order: no search.
# Each invocation loops over all devices of the node (in-use and selector checks are cached map lookups).
# The scheduler (pkg/scheduler/framework/plugins/dynamicresources Filter, DRASchedulerFilterTimeout, beta and
# on in 1.34) cancels Allocate after 10 s: the node is unschedulable, "timed out trying to allocate devices",
# and the next subrequest is never tried. Later allocators (v0.36 source) start each next pick after the
# previous device (`allocateOne`'s startLocation): combinations, 2^M at most; the planner takes that from 1.35.
PERMUTATION_SEARCH_FIXED_IN = (1, 35)
FILTER_TIMEOUT_S = 10.0
# Cost of one `allocateOne` invocation on the real 1.34.12 scheduler (tests/e2e control plane), timed with
# unsatisfiable requests over 8 or 9 candidates (S(8) = 109,601, S(9) = 986,410 invocations), the least loaded
# of repeated runs: 2.1, 3.2, 5.0, 9.0, 17 and 23 us on nodes of 9, 16, 32, 64, 96 and 128 devices, and with
# a matchAttribute constraint over 16 candidates (two groups of 8) 6.0, 7.5 and 12 us on 16, 32 and 64 devices:
# each free candidate costs a constraint check more. The timings vary by about 2x with the machine's load.
INVOCATION_US = 0.8
INVOCATION_US_PER_DEVICE = 0.17
INVOCATION_US_PER_CONSTRAINED_CANDIDATE = 0.15


def _sequences(m: int) -> int:
    """The number of ordered sequences of distinct devices out of m, the empty one included."""
    count = 1
    for k in range(1, m + 1):
        count = 1 + k * count
    return count


def _ordered_prefixes(m: int, n: int) -> int:
    """The non-empty ordered sequences of at most n distinct devices out of m."""
    count, term = 0, 1
    for k in range(1, min(m, n) + 1):
        term *= m - k + 1
        count += term
    return count


@dataclass
class _Walk:
    """The 1.34 walk of one request in one state of the search, in `allocateOne` invocations."""

    candidates: int  # usable devices
    groups: int  # groups of equal values of the constraints still open
    met: bool  # some group holds the count
    first: int  # until the request is met or given up
    full: int  # its whole tree: every sequence of up to `count` devices
    complete: int  # the sequences of `count` devices, each followed by the next request
    taken: list[SimDevice]  # the devices of the first one
    invocation_us: float  # the cost of one invocation on this node


class FilterTimeout(AllocationError):
    """The scheduler's filter would time out on this node: the pod is never scheduled there."""


class NodeSearch:
    """Allocate the given claims (of one pod) together on one node.

    `ignore_owners` looks at the node as if empty (used to tell "full" from "impossible");
    `constraints` overrides each claim's constraints (used to find the constraint that fails);
    `kubernetes_version` predicts that version's scheduler where it departs from the documented semantics
    (None: the documented semantics).
    """

    def __init__(self, matcher: Matcher, node: SimNode, claims: list[PlanClaim], *, ignore_owners: bool = False,
                 constraints: list[tuple[MatchAttribute, ...]] | None = None,
                 kubernetes_version: tuple[int, int] | None = None) -> None:
        self.matcher = matcher
        self.kubernetes_version = kubernetes_version
        self.node = node
        self.claims = claims
        self.ignore_owners = ignore_owners
        self.constraints = constraints if constraints is not None else [c.spec.constraints for c in claims]
        self.slots = [_Slot(i, r) for i, c in enumerate(claims) for r in c.spec.requests]
        self.results: list[list[tuple[DeviceRequest, SimDevice]]] = [[] for _ in claims]
        # constraint state per claim: [value or None, number of devices counted]
        self.state: list[list[list]] = [[[None, 0] for _ in cs] for cs in self.constraints]
        self.allocating: dict[int, set[int]] = {}  # device uid -> claims taking it in this attempt
        self.steps = 0
        self.permutation_search = kubernetes_version is not None and kubernetes_version < PERMUTATION_SEARCH_FIXED_IN
        self.search_us = 0.0  # the 1.34 allocator's search time up to this point of the walk (a lower bound)

    # -- public ------------------------------------------------------------------------------------
    def run(self) -> list[list[tuple[DeviceRequest, SimDevice]]] | None:
        """The first solution in upstream search order, None when there is none; AllocationError on errors."""
        for claim in self.claims:
            minimum, all_notes = 0, []
            for request in claim.spec.requests:
                needs = []
                for alt in request.alternatives:
                    cands = self.matcher.candidates(alt, self.node)
                    if alt.all_devices:
                        if cands.errors:
                            raise AllocationError(next(iter(cands.errors.values())))
                        needs.append(len(cands.devices))
                        all_notes.append(f"request {alt.result_name}: All = {len(cands.devices)} matching devices "
                                         f"of {self.node.kind}")
                    else:
                        needs.append(alt.count)
                minimum += min(needs)
            if minimum > MAX_RESULTS_PER_CLAIM:
                notes = f" ({'; '.join(all_notes)})" if all_notes else ""
                raise AllocationError(f"claim {claim.namespace}/{claim.name}: number of requested devices {minimum} "
                                      f"exceeds the claim limit of {MAX_RESULTS_PER_CLAIM}{notes}")
        if not self._slot(0):
            return None
        return self.results

    # -- search ------------------------------------------------------------------------------------
    def _slot(self, s: int) -> bool:
        if s == len(self.slots):
            return True
        slot = self.slots[s]
        for alt in slot.request.alternatives:
            if alt.all_devices:
                if self._all(s, alt):
                    return True
                continue
            walk = self._walk(s, alt) if self.permutation_search else None
            if walk is not None:
                self._charge(walk.first * walk.invocation_us, s, alt, walk, backtracked=False)
            charged = self.search_us
            if self._lookahead(s, alt, -1, alt.count) and self._pick(s, alt, 0, alt.count):
                return True
            if walk is not None and walk.met and not self._overflows_later(s, alt):
                # Met, but no later request could follow: upstream walked every sequence of this request, and
                # the next request after each full one (the planner's search counted the ones it entered).
                branch = (walk.full - walk.first) * walk.invocation_us + walk.complete * self._next_walk_us(s, alt)
                self._charge(max(0.0, branch - (self.search_us - charged)), s, alt, walk, backtracked=True)
        return False

    # -- the 1.34 allocator's search time (see PERMUTATION_SEARCH_FIXED_IN) ------------------------------
    def _walk(self, s: int, alt: DeviceRequest) -> _Walk | None:
        """The 1.34 walk of `alt` entered in the current state; None where it does not search (the claim
        limit ends it, or a CEL error does)."""
        claim = self.slots[s].claim
        if len(self.results[claim]) + alt.count > MAX_RESULTS_PER_CLAIM:
            return None
        cands = self.matcher.candidates(alt, self.node)
        if cands.errors:
            return None
        usable = self._open(claim, alt, cands.devices)
        open_constraints = [c.attribute for c, state in zip(self.constraints[claim], self.state[claim], strict=True)
                            if c.applies(alt) and state[1] == 0]
        keys = [tuple(d.attribute(a) for a in open_constraints) for d in usable]
        sizes = Counter(keys)
        full = 1 + sum(_ordered_prefixes(m, alt.count) for m in sizes.values())
        complete = sum(math.perm(m, alt.count) for m in sizes.values() if m >= alt.count)
        first, met, taken = 1, False, []
        for key in keys:
            if sizes[key] >= alt.count:
                first, met = first + alt.count, True
                taken = [d for d, k in zip(usable, keys, strict=True) if k == key][:alt.count]
                break
            first += _sequences(sizes[key] - 1)  # every sequence this device starts within its group
        # Upstream checks the constraints on every free candidate, also those whose values no longer fit.
        constrained = sum(1 for d in cands.devices if self._usable(alt, d, claim)) \
            if any(c.applies(alt) for c in self.constraints[claim]) else 0
        invocation_us = INVOCATION_US + INVOCATION_US_PER_DEVICE * len(self.node.devices) + \
            INVOCATION_US_PER_CONSTRAINED_CANDIDATE * constrained
        return _Walk(len(usable), len(sizes), met, first if met else full, full, complete, taken, invocation_us)

    def _next_walk_us(self, s: int, alt: DeviceRequest) -> float:
        """The walk of the next request (each of its subrequests in turn) after `alt` took its first devices,
        the estimate for every full sequence of `alt`."""
        if s + 1 == len(self.slots):
            return 0.0
        claim, walk = self.slots[s].claim, self._walk(s, alt)
        for device in walk.taken:
            self._constraints_add(claim, alt, device)
            self._take(claim, alt, device)
        total = 0.0
        for later in self.slots[s + 1].request.alternatives:
            after = None if later.all_devices else self._walk(s + 1, later)
            total += after.first * after.invocation_us if after else INVOCATION_US
        for device in reversed(walk.taken):
            self._constraints_remove(claim, alt, device)
            self._untake(claim, alt, device)
        return total

    def _overflows_later(self, s: int, alt: DeviceRequest) -> bool:
        """Would the claim's later requests exceed the 32-device limit whatever they pick? Then upstream's
        errAllocationResultMaxSizeExceeded unwinds the walk at its first full sequence."""
        claim = self.slots[s].claim
        total = len(self.results[claim]) + alt.count
        for slot in self.slots[s + 1:]:
            if slot.claim == claim:
                total += min(len(self.matcher.candidates(a, self.node).devices) if a.all_devices else a.count
                             for a in slot.request.alternatives)
        return total > MAX_RESULTS_PER_CLAIM

    def _charge(self, us: float, s: int, alt: DeviceRequest, walk: _Walk, *, backtracked: bool) -> None:
        self.search_us += us
        if self.search_us <= FILTER_TIMEOUT_S * 1e6:
            return
        request = self.slots[s].request
        kind = "subrequest" if request.first_available else "request"
        version = ".".join(map(str, self.kubernetes_version or ()))
        groups = f" (in {walk.groups} groups of equal matchAttribute values)" if walk.groups > 1 else ""
        if backtracked:
            what = (f"{kind} {alt.result_name} takes {alt.count} of the {walk.candidates} devices that match it, the "
                    "later requests cannot follow, and the allocator tries every ordering of those devices")
        else:
            what = (f"{kind} {alt.result_name} asks for {alt.count} of the {walk.candidates} devices that match "
                    f"it{groups}, and the allocator tries their orderings")
        later = " instead of trying the next subrequest" if request.first_available and \
            alt is not request.alternatives[-1] else ""
        fix = "put a subrequest that fits first" if request.first_available else \
            "ask for no more devices than the node has free"
        raise FilterTimeout(
            f"request {request.name}: on Kubernetes {version} never scheduled on {self.node.kind}: {what} (an "
            f"estimated {self.search_us / 1e6:.3g} s) until the scheduler's {FILTER_TIMEOUT_S:.0f} s filter "
            f"timeout{later} (kubernetes/kubernetes#131730, fixed in 1.35); {fix}")

    def _all(self, s: int, alt: DeviceRequest) -> bool:
        claim = self.slots[s].claim
        devices = self.matcher.candidates(alt, self.node).devices
        if not devices or len(self.results[claim]) + len(devices) > MAX_RESULTS_PER_CLAIM:
            return False
        taken = []
        for device in devices:
            if not self._usable(alt, device, claim):
                break
            if not self._constraints_add(claim, alt, device):
                raise AllocationError(self._all_conflict(claim, alt, device))
            self._take(claim, alt, device)
            taken.append(device)
        else:
            if self._slot(s + 1):
                return True
        for d in reversed(taken):
            self._constraints_remove(claim, alt, d)
            self._untake(claim, alt, d)
        return False

    def _all_conflict(self, claim: int, alt: DeviceRequest, device: SimDevice) -> str:
        c = self.claims[claim]
        detail = ""
        for constraint, state in zip(self.constraints[claim], self.state[claim], strict=True):
            if not constraint.applies(alt):
                continue
            value = device.attribute(constraint.attribute)
            if value is None:
                detail = f"; it has no attribute {constraint.attribute}"
                break
            if state[1] > 0 and value != state[0]:
                detail = f"; its {constraint.attribute} {value[1]} differs from {state[0][1]}"
                break
        return (f"claim {c.namespace}/{c.name}, request {alt.result_name}: cannot add device "
                f"{device.driver}/{device.pool}/{device.name} because a claim constraint would not be satisfied"
                f"{detail} (allocationMode All takes every matching device of the node, "
                f"{len(self.matcher.candidates(alt, self.node).devices)} on {self.node.kind})")

    def _pick(self, s: int, alt: DeviceRequest, start: int, remaining: int) -> bool:
        if remaining == 0:
            return self._slot(s + 1)
        claim = self.slots[s].claim
        if len(self.results[claim]) + remaining > MAX_RESULTS_PER_CLAIM:
            return False
        cands = self.matcher.candidates(alt, self.node)
        devices = cands.devices
        for pos in range(start, len(devices)):
            if len(devices) - pos < remaining and not cands.errors:
                return False  # (upstream would still walk into a failing device and stop with its error)
            device = devices[pos]
            self.steps += 1
            if self.steps > MAX_SEARCH_STEPS:
                raise AllocationError(f"the device search on node {self.node.name} gave up after {MAX_SEARCH_STEPS:,} "
                                      "steps (kube-scheduler's DRA filter would time out); simplify the claims")
            if not self._usable(alt, device, claim):
                continue
            error = cands.errors.get(device.index)
            if error is not None:
                raise AllocationError(error)
            if not self._constraints_add(claim, alt, device):
                continue
            self._take(claim, alt, device)
            if self._lookahead(s, alt, pos, remaining - 1) and self._pick(s, alt, pos + 1, remaining - 1):
                return True
            self._constraints_remove(claim, alt, device)
            self._untake(claim, alt, device)
        return False

    # -- devices and constraints -------------------------------------------------------------------
    def _usable(self, alt: DeviceRequest, device: SimDevice, claim: int) -> bool:
        taking = self.allocating.get(device.uid)
        if alt.admin_access:  # admin access shares devices, but not twice within one claim
            return not taking or claim not in taking
        return not taking and (self.ignore_owners or device.owner is None)

    def _take(self, claim: int, alt: DeviceRequest, device: SimDevice) -> None:
        self.allocating.setdefault(device.uid, set()).add(claim)
        self.results[claim].append((alt, device))

    def _untake(self, claim: int, alt: DeviceRequest, device: SimDevice) -> None:
        self.allocating[device.uid].discard(claim)
        self.results[claim].pop()

    def _constraints_add(self, claim: int, alt: DeviceRequest, device: SimDevice) -> bool:
        added = []
        for constraint, state in zip(self.constraints[claim], self.state[claim], strict=True):
            if not constraint.applies(alt):
                continue
            value = device.attribute(constraint.attribute)
            if value is None or (state[1] > 0 and value != state[0]):
                for st in added:
                    st[1] -= 1
                return False
            if state[1] == 0:
                state[0] = value
            state[1] += 1
            added.append(state)
        return True

    def _constraints_remove(self, claim: int, alt: DeviceRequest, device: SimDevice) -> None:
        for constraint, state in zip(self.constraints[claim], self.state[claim], strict=True):
            if constraint.applies(alt):
                state[1] -= 1

    def _compatible(self, claim: int, alt: DeviceRequest, device: SimDevice) -> bool:
        for constraint, state in zip(self.constraints[claim], self.state[claim], strict=True):
            if constraint.applies(alt):
                value = device.attribute(constraint.attribute)
                if value is None or (state[1] > 0 and value != state[0]):
                    return False
        return True

    def _open(self, claim: int, alt: DeviceRequest, devices: list[SimDevice]) -> list[SimDevice]:
        """Devices still usable for `alt` under the constraint values fixed so far (errors count as usable)."""
        return [d for d in devices if self._usable(alt, d, claim) and self._compatible(claim, alt, d)]

    def _lookahead(self, s: int, alt: DeviceRequest, pos: int, remaining: int) -> bool:
        """Can the current request (`remaining` more after position `pos`) and the later plain requests
        still be met? Also, for each constraint whose value is still open, is there one value that every
        such request it covers can meet? Only cuts branches without a solution, and never one in which the
        upstream search would stop with an error first: the look ahead ends at the first request that could
        raise one (`All`, a CEL evaluation error) or that has subrequests."""
        pending: list[tuple[int, DeviceRequest, list[SimDevice], int]] = []
        claim = self.slots[s].claim
        if remaining:
            cands = self.matcher.candidates(alt, self.node)
            if cands.errors:
                return True
            pending.append((claim, alt, cands.devices[pos + 1:], remaining))
        for slot in self.slots[s + 1:]:
            later = slot.request.alternatives[0]
            if slot.request.first_available or later.all_devices:
                break
            cands = self.matcher.candidates(later, self.node)
            if cands.errors:
                break
            pending.append((slot.claim, later, cands.devices, later.count))
        open_sets = []
        for c, request, devices, needed in pending:
            usable = self._open(c, request, devices)
            if len(usable) < needed:
                return False
            open_sets.append(usable)
        # Exclusive requests together need as many distinct devices as they ask for.
        exclusive = [(p, u) for p, u in zip(pending, open_sets, strict=True) if not p[1].admin_access]
        if sum(p[3] for p, _ in exclusive) > len({d.uid for _, u in exclusive for d in u}):
            return False
        for c, constraints in enumerate(self.constraints):
            for constraint, state in zip(constraints, self.state[c], strict=True):
                if state[1] > 0:
                    continue
                common: set | None = None
                for (pc, request, _, needed), usable in zip(pending, open_sets, strict=True):
                    if pc != c or not constraint.applies(request):
                        continue
                    counts = Counter(d.attribute(constraint.attribute) for d in usable)
                    values = {v for v, n in counts.items() if n >= needed}
                    common = values if common is None else common & values
                    if not common:
                        return False
        return True


def explain_missing_key(message: str, selector: Selector, device: SimDevice) -> str:
    """Turn the CEL library's "no such key: x" into what exists: the attributes of the device's domain, and
    the capacity to use when `x` is one (a user reading device.attributes[...].memory meant the capacity)."""
    if not message.startswith(_NO_SUCH_KEY):
        return message
    key = message[len(_NO_SUCH_KEY):]
    kind, domain = "attributes", device.driver
    for ref_kind, ref_domain, ident in sorted(selector.references or (), key=lambda r: (r[0], r[1], r[2] or "")):
        if ident == key:
            kind, domain = ref_kind, ref_domain
            break
    in_domain = sorted(name.rpartition("/")[2] for name in device.qualified if name.rpartition("/")[0] == domain)
    capacities = sorted(name.rpartition("/")[2] for name in device.capacity
                        if (name.rpartition("/")[0] or device.driver) == domain)
    if kind == "capacity":
        return (f"no capacity {key} on {domain} devices; their capacities: {', '.join(capacities) or 'none'}")
    hint = f" (it is a capacity: use device.capacity['{domain}'].{key})" if key in capacities else ""
    return (f"no attribute {key} on {domain} devices{hint}; their attributes: {', '.join(in_domain) or 'none'}")
