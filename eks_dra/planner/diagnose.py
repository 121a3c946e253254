"""Why claims cannot be allocated on a node: the request or constraint that fails, in words."""

from __future__ import annotations

from collections import Counter

from .allocator import AllocationError, Matcher, NodeSearch
from .model import DeviceRequest, MatchAttribute, PlanClaim
from .simulate import SimNode

_MAX_VALUES_SHOWN = 4


def _values(values: list) -> str:
    shown = ", ".join(str(v[1]) for v in values[:_MAX_VALUES_SHOWN])
    return shown + (", …" if len(values) > _MAX_VALUES_SHOWN else "")


def _drivers_present(node: SimNode) -> str:
    counts = Counter(d.driver for d in node.devices)
    return ", ".join(f"{n} from {driver}" for driver, n in sorted(counts.items())) or "none"


def request_reason(matcher: Matcher, node: SimNode, alt: DeviceRequest) -> str | None:
    """Why one (sub)request cannot be met even on an empty node, ignoring constraints; None if it can."""
    matching = len(matcher.candidates(alt, node).matching)
    cls = alt.device_class
    if matching == 0:
        by_class = sum(1 for d in node.devices if matcher.selects(cls.selectors, d) is True)
        if by_class == 0:
            return (f"no device of {node.kind} matches DeviceClass {cls.name} "
                    f"(devices there: {_drivers_present(node)})")
        return f"{by_class} devices of {node.kind} match DeviceClass {cls.name}, none of them the request's selectors"
    if not alt.all_devices and alt.count > matching:
        return f"count {alt.count} exceeds the {matching} matching devices of {node.kind}"
    return None


def _searchable(matcher: Matcher, node: SimNode, claims: list[PlanClaim],
                constraints: list[tuple[MatchAttribute, ...]]) -> bool | str:
    try:
        return NodeSearch(matcher, node, claims, ignore_owners=True, constraints=constraints).run() is not None
    except AllocationError as exc:
        return str(exc)


def constraint_reason(matcher: Matcher, node: SimNode, claim: PlanClaim, constraint: MatchAttribute) -> str:
    names = constraint.requests or tuple(r.name for r in claim.spec.requests)
    attr = constraint.attribute
    head = (f"request {'+'.join(names)}: constraint matchAttribute {attr} over [{', '.join(names)}] "
            f"cannot be met on {node.kind}: ")
    covered = [alt for r in claim.spec.requests for alt in r.alternatives if constraint.applies(alt)]
    per_alt: list[tuple[DeviceRequest, Counter, int]] = []
    for alt in covered:
        devices = matcher.candidates(alt, node).matching
        values = Counter(d.attribute(attr) for d in devices if d.attribute(attr) is not None)
        if not values:
            return head + f"no device matching request {alt.result_name} has the attribute {attr}"
        per_alt.append((alt, values, len(devices)))
    for alt, values, total in per_alt:
        if alt.all_devices and (len(values) > 1 or sum(values.values()) < total):
            return head + (f"request {alt.result_name} asks for All {total} matching devices, which span "
                           f"{len(values)} values of {attr} ({_values(sorted(values))})")
    common = set.intersection(*(set(v) for _, v, _ in per_alt)) if per_alt else set()
    if not common:
        listing = "; ".join(f"{alt.result_name}: {_values(sorted(v))}" for alt, v, _ in per_alt)
        if len(per_alt) == 2:
            a, b = per_alt[0][0].result_name, per_alt[1][0].result_name
            return head + f"no device for {a} shares a value of {attr} with a device for {b} ({listing})"
        return head + f"no value of {attr} is shared by devices of every request ({listing})"
    # Requests selecting the same devices compete for them: compare each group's need per shared value.
    groups: dict[tuple, tuple[list[DeviceRequest], Counter]] = {}
    for alt, values, _ in per_alt:
        if not alt.all_devices:
            groups.setdefault(alt.match_key, ([], values))[0].append(alt)
    best = None
    for value in sorted(common):
        short = [(alts, values[value], sum(a.count for a in alts)) for alts, values in groups.values()
                 if values[value] < sum(a.count for a in alts)]
        if not short:
            continue
        worst = min(short, key=lambda s: s[1] / s[2])
        if best is None or worst[1] / worst[2] > best[0]:
            best = (worst[1] / worst[2], value, worst)
    if best is not None:
        _, value, (alts, have, need) = best
        names = "+".join(a.result_name for a in alts)
        needs = "the request needs" if len(alts) == 1 else "together they need"
        return head + (f"at most {have} devices for {names} share one value of {attr} "
                       f"(e.g. {value[1]}), {needs} {need}")
    return head + "no combination of the requests' devices shares one value"


def explain_static(matcher: Matcher, node: SimNode, claims: list[PlanClaim]) -> str:
    """Why `claims` (of one pod) cannot be allocated on an empty node like `node`."""
    reasons = []
    for claim in claims:
        prefix = f"claim {claim.name}: " if len(claims) > 1 else ""
        reason = _claim_reason(matcher, node, claim)
        if reason:
            reasons.append(prefix + reason)
    if reasons:
        return "; ".join(reasons)
    return (f"the claims {', '.join(c.name for c in claims)} of one pod need more devices together "
            f"than one {node.kind} has")


def _claim_reason(matcher: Matcher, node: SimNode, claim: PlanClaim) -> str | None:
    for request in claim.spec.requests:
        alt_reasons = [request_reason(matcher, node, alt) for alt in request.alternatives]
        if all(alt_reasons):
            if not request.first_available:
                return f"request {request.name}: {alt_reasons[0]}"
            subs = "; ".join(f"{alt.result_name}: {why}" for alt, why in
                             zip(request.alternatives, alt_reasons, strict=True))
            return f"request {request.name}: no subrequest can be met ({subs})"
    unconstrained = _searchable(matcher, node, [claim], [()])
    if isinstance(unconstrained, str):
        return unconstrained
    if not unconstrained:
        names = "+".join(r.name for r in claim.spec.requests)
        return f"requests {names} together need more matching devices than {node.kind} has"
    for constraint in claim.spec.constraints:
        alone = _searchable(matcher, node, [claim], [(constraint,)])
        if isinstance(alone, str):
            return alone
        if not alone:
            return constraint_reason(matcher, node, claim, constraint)
    together = _searchable(matcher, node, [claim], [claim.spec.constraints])
    if isinstance(together, str):
        return together
    if not together:
        attrs = ", ".join(c.attribute for c in claim.spec.constraints)
        return f"the constraints on {attrs} cannot all be met together on {node.kind}"
    return None
