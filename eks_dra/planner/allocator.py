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


# kubernetes/kubernetes#131730: the 1.34 allocator, given a firstAvailable subrequest it cannot satisfy, searches
# the permutations of the devices that match it until kube-scheduler's 10 s filter timeout, and never tries the
# next subrequest. Measured on the real 1.34.12 scheduler with 16 candidates (17 Neuron devices asked on a
# trn2.48xlarge); from about ten candidates the search outlasts the timeout. Fixed after 1.34.
FIRST_AVAILABLE_TIMEOUT_CANDIDATES = 10
FIRST_AVAILABLE_TIMEOUT_FIXED_IN = (1, 35)


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
        if self.kubernetes_version is not None and self.kubernetes_version < FIRST_AVAILABLE_TIMEOUT_FIXED_IN:
            self._check_first_available_timeout()
        if not self._slot(0):
            return None
        return self.results

    def _check_first_available_timeout(self) -> None:
        for claim in self.claims:
            for request in claim.spec.requests:
                if not request.first_available:
                    continue
                for alt in request.alternatives[:-1]:
                    if alt.all_devices:
                        continue
                    free = [d for d in self.matcher.candidates(alt, self.node).matching
                            if self.ignore_owners or d.owner is None]
                    if alt.count > len(free) >= FIRST_AVAILABLE_TIMEOUT_CANDIDATES:
                        version = ".".join(map(str, self.kubernetes_version or ()))
                        raise FilterTimeout(
                            f"request {request.name}: on Kubernetes {version} never scheduled on {self.node.kind}: "
                            f"subrequest {alt.result_name} asks for {alt.count} of the {len(free)} devices that match "
                            "it, and the allocator searches their permutations until the scheduler's 10 s filter "
                            "timeout instead of trying the next subrequest (kubernetes/kubernetes#131730, fixed "
                            "after 1.34); put a subrequest that fits first")

    # -- search ------------------------------------------------------------------------------------
    def _slot(self, s: int) -> bool:
        if s == len(self.slots):
            return True
        slot = self.slots[s]
        for alt in slot.request.alternatives:
            if alt.all_devices:
                if self._all(s, alt):
                    return True
            elif self._lookahead(s, alt, -1, alt.count) and self._pick(s, alt, 0, alt.count):
                return True
        return False

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
