"""The plan as a table for people and as JSON for tools (the shape DESIGN.md fixes).

People get the allocations, then one paragraph per workload (the same reason of its pods said once, with a
count), then the devices used and free per node group. Tools get the same as JSON: per claim its pod and
workload, and a summary.
"""

from __future__ import annotations

import re
import textwrap
from collections import Counter
from dataclasses import dataclass, field

from .fit_hint import (
    MAX_HINT_WORKLOADS,
    MAX_SIZE_FACTOR,
    MAX_SIZE_STEP,
    NEW_GROUP_MAX_NODES,
    Hint,
    WorkloadKey,
    pod_fits,
    workload_key,
)
from .model import AllocatedDevice, PlanClaim, PlanPod, Source
from .plan import PlanResult, device_plugin_share
from .simulate import SimDevice

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple:
    """neurondevice2 before neurondevice10: digit runs compare as numbers."""
    return tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(name))


def shown_devices(claim: PlanClaim) -> list[AllocatedDevice]:
    """A claim's devices grouped by request (in request order), each group in natural name order."""
    order = {r: i for i, r in enumerate(dict.fromkeys(d.request for d in claim.devices))}
    return sorted(claim.devices, key=lambda d: (order[d.request], d.driver, natural_key(d.device)))




# --- workloads: the pods of one object (a Deployment's replicas), said once --------------------------

@dataclass
class Findings:
    """What planning again found (fit_hint.py): None hints when they were not looked for (not env mode)."""

    hints: dict[WorkloadKey, Hint | None] | None = None
    gang_starts: dict[str, int] = field(default_factory=dict)


@dataclass
class Workload:
    kind: str
    namespace: str
    name: str
    pods: list[PlanPod] = field(default_factory=list)  # none for a claim no pod uses
    claims: list[PlanClaim] = field(default_factory=list)  # of a claim no pod uses

    @property
    def key(self) -> WorkloadKey:
        return (self.kind, self.namespace, self.name)

    @property
    def ref(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}" if self.namespace else f"{self.kind} {self.name}"

    @property
    def placed(self) -> int:
        return sum(1 for p in self.pods if pod_fits(p))

    @property
    def allocated(self) -> bool:
        return all(pod_fits(p) for p in self.pods) and all(c.allocated for c in self.claims)


def workloads(result: PlanResult) -> list[Workload]:
    """The plan's workloads in the order their first pod was planned."""
    found: dict[WorkloadKey, Workload] = {}
    for pod in result.pods:
        key = workload_key(pod)
        workload = found.setdefault(key, Workload(*key))
        if pod.implicit:
            workload.claims.extend(pod.claims)
        else:
            workload.pods.append(pod)
    return list(found.values())


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def pod_reason(pod: PlanPod, workload_name: str) -> str:
    """Why the pod does not fit, with its own name (and so its claims' names) written as the workload's
    `name-*`, so that the same reason of every replica reads the same."""
    reason = pod.reason
    if reason is None:
        claim = next(c for c in pod.claims if not c.allocated)
        reason = claim.reason or "not allocated"
        if len(pod.claims) > 1:
            reason = f"claim {claim.name}: {reason}"
    if pod.name == workload_name:
        return reason
    return re.sub(rf"(?<![\w.-]){re.escape(pod.name)}(?![0-9A-Za-z])", f"{workload_name}-*", reason)


def _pod_lines(workload: Workload, pods: list[PlanPod], findings: Findings) -> list[tuple[str, int]]:
    """(text, indent) lines of some pods of one workload: one gang, or the pods without one."""
    unfit = [p for p in pods if not pod_fits(p)]
    gang = pods[0].gang
    if gang is not None and unfit:
        start = findings.gang_starts.get(gang.name, len(pods) - len(unfit))
        if start < gang.min_available:
            return [(f"{gang.name}: would start {start} of {_plural(gang.size, 'pod')} and wait", 0)]
    fit = len(pods) - len(unfit)
    head = f"{workload.ref}: {fit} of {_plural(len(pods), 'pod')} {'fits' if fit == 1 else 'fit'}"
    if not unfit:
        return [(head, 0)]
    reasons = Counter(pod_reason(p, workload.name) for p in unfit)
    verb = "does not" if len(unfit) == 1 else "do not"
    if len(reasons) == 1:
        return [(f"{head}; {len(unfit)} {verb}: {next(iter(reasons))}", 0)]
    return [(f"{head}; {len(unfit)} {verb}:", 0),
            *((f"{_plural(count, 'pod')}: {reason}", 1) for reason, count in reasons.items())]


def workload_lines(workload: Workload, findings: Findings) -> list[tuple[str, int]]:
    lines: list[tuple[str, int]] = []
    if not workload.pods:
        missing = [c for c in workload.claims if not c.allocated]
        if not missing:
            lines.append((f"{workload.ref}: allocated", 0))
        else:
            lines.append((f"{workload.ref}: not allocated: {missing[0].reason or 'no reason given'}", 0))
    gangs: dict[str | None, list[PlanPod]] = {}
    for pod in workload.pods:
        gangs.setdefault(pod.gang.name if pod.gang else None, []).append(pod)
    for pods in gangs.values():
        lines.extend(_pod_lines(workload, pods, findings))
    if not workload.allocated and findings.hints is not None:
        if workload.key not in findings.hints:
            lines.append((f"no hint: only the first {MAX_HINT_WORKLOADS} workloads that do not fit are planned again",
                          1))
        elif findings.hints[workload.key] is None:
            lines.append((f"no single change makes it fit: one DRA group's maxSize up to {MAX_SIZE_FACTOR}x or "
                          f"+{MAX_SIZE_STEP} (whichever is more), or one new group of up to {NEW_GROUP_MAX_NODES} "
                          "nodes", 1))
        else:
            lines.append((f"would fit with {findings.hints[workload.key].text}", 1))
    return lines


# --- node groups: devices used and free ------------------------------------------------------------

def device_kind(device: SimDevice) -> str:
    """`gpu.nvidia.com/gpu`, `gpu.nvidia.com/mig`, `dra.net`: the driver, and the device type where it has one."""
    value = device.attribute(f"{device.driver}/type")
    return f"{device.driver}/{value[1]}" if value is not None else device.driver


def claimless_pods(result: PlanResult) -> list[PlanPod]:
    """Pods that ask for extended resources and have no claim in the plan: device plugins serve them (or would)."""
    listed = {id(c) for c in result.claims}
    return [p for p in result.pods if p.extended_resources and not any(id(c) in listed for c in p.claims)]


def node_groups(result: PlanResult) -> list[dict]:
    """Per node group (the group label in env mode, the instance type otherwise): nodes, devices used/free;
    the extended resources of device plugins count under their resource name (nvidia.com/gpu)."""
    plugin_used: dict[str, Counter] = {}
    by_name = {n.name: n for n in result.nodes}
    for pod in result.pods:
        if pod.node is not None and pod.node in by_name:
            plugin_used.setdefault(pod.node, Counter()).update(device_plugin_share(pod, by_name[pod.node]))
    groups: dict[str, dict] = {}
    for node in result.nodes:
        group = groups.setdefault(node.group or node.instance_type,
                                  {"name": node.group or node.instance_type, "nodes": 0, "devices": {}})
        group["nodes"] += 1
        for device in node.devices:
            counts = group["devices"].setdefault(device_kind(device), {"used": 0, "free": 0})
            counts["used" if device.owner is not None else "free"] += 1
        for name, total in node.extended.items():
            counts = group["devices"].setdefault(name, {"used": 0, "free": 0})
            used = plugin_used.get(node.name, Counter())[name]
            counts["used"] += used
            counts["free"] += total - used
    return list(groups.values())


# --- JSON ------------------------------------------------------------------------------------------

def _workload_ref(source: Source) -> dict:
    return {"kind": source.kind, "namespace": source.namespace, "name": source.name}


def to_json(result: PlanResult, findings: Findings | None = None) -> dict:
    findings = findings or Findings()
    first_pod: dict[int, PlanPod] = {}
    for pod in result.pods:
        for claim in pod.claims:
            first_pod.setdefault(id(claim), pod)
    claims = []
    for c in result.claims:
        pod = first_pod.get(id(c))
        claims.append({
            "name": c.name,
            "namespace": c.namespace,
            "allocated": c.allocated,
            "node": c.node,
            "devices": [
                {"request": d.request, "driver": d.driver, "pool": d.pool, "device": d.device,
                 "attributes": d.attributes}
                for d in shown_devices(c)
            ],
            "reason": c.reason,
            "pod": None if pod is None or pod.implicit else pod.name,
            "workload": _workload_ref(pod.source if pod is not None else c.source),
        })
    # Pods without claims (device plugins serve their extended resources) are listed apart: every entry of
    # "claims" stays a ResourceClaim, as the scripts that read it expect.
    claimless = [{"name": pod.name, "namespace": pod.namespace, "allocated": pod_fits(pod), "node": pod.node,
                  "reason": pod.reason, "workload": _workload_ref(pod.source),
                  "extendedResources": dict(pod.extended_resources)} for pod in claimless_pods(result)]
    pods = [p for p in result.pods if not p.implicit]
    hints = findings.hints or {}
    summary = {
        "claims": {"allocated": sum(c.allocated for c in result.claims), "total": len(result.claims)},
        "pods": {"placed": sum(1 for p in pods if pod_fits(p)), "total": len(pods)},
        "workloads": [
            {"kind": w.kind, "namespace": w.namespace, "name": w.name, "pods": len(w.pods), "podsPlaced": w.placed,
             "allocated": w.allocated, "hint": hints[w.key].to_json() if hints.get(w.key) else None}
            for w in workloads(result)
        ],
        "nodeGroups": node_groups(result),
    }
    return {"claims": claims, "podsWithoutClaims": claimless, "summary": summary}


# --- the table for people --------------------------------------------------------------------------

def _attributes(device: AllocatedDevice) -> str:
    parts = []
    for name, value in device.attributes.items():
        # The driver's own domain is implied by the device; other domains stay qualified.
        short = name.split("/", 1)[1] if name.startswith(device.driver + "/") else name
        shown = str(value).lower() if isinstance(value, bool) else str(value)
        parts.append(f"{short}={shown}")
    return " ".join(parts)


def _wrapped(text: str, indent: int, width: int | None) -> list[str]:
    prefix = "  " * (indent + 1)
    if not width:
        return [prefix + text]
    # Continuation lines sit four columns deeper than their first line (deeper than a nested line); names and paths are never split.
    return textwrap.wrap(text, width, initial_indent=prefix, subsequent_indent=prefix + "    ",
                         break_long_words=False, break_on_hyphens=False)


def to_table(result: PlanResult, findings: Findings | None = None, width: int | None = None) -> str:
    """The human report; `width`: wrap its paragraphs at this many columns (None: one line each)."""
    findings = findings or Findings()
    header = ("CLAIM", "NODE", "REQUEST", "DEVICE", "ATTRIBUTES")
    rows: list[tuple[str, ...]] = []
    for claim in result.claims:
        name = f"{claim.namespace}/{claim.name}"
        if not claim.allocated:
            rows.append((name, "-", "-", "NOT ALLOCATED", ""))  # why: under its workload below
            continue
        if not claim.devices:
            rows.append((name, claim.node or "-", "-", "(no devices requested)", ""))
        for i, d in enumerate(shown_devices(claim)):
            rows.append((name if i == 0 else "", claim.node or "" if i == 0 else "", d.request,
                         f"{d.driver}/{d.device}", _attributes(d)))
    claimless = claimless_pods(result)
    for pod in claimless:
        name = f"{pod.namespace}/{pod.name} (pod)"
        if not pod_fits(pod):
            rows.append((name, "-", "-", "NOT PLACED", ""))
            continue
        for i, (resource, count) in enumerate(pod.extended_resources.items()):
            rows.append((name if i == 0 else "", pod.node or "" if i == 0 else "", resource,
                         f"{count} from the device plugin", ""))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = []
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    lines += ["", "Workloads:"]
    for workload in workloads(result):
        for text, indent in workload_lines(workload, findings):
            lines.extend(_wrapped(text, indent, width))
    lines += ["", "Node groups:"]
    for group in node_groups(result):
        devices = "; ".join(f"{kind} {c['used']} used, {c['free']} free" for kind, c in group["devices"].items())
        text = f"{group['name']}: {_plural(group['nodes'], 'node')}" + (f"; {devices}" if devices else "")
        lines.extend(_wrapped(text, 0, width))
    allocated = sum(c.allocated for c in result.claims)
    used = len({c.node for c in result.claims if c.allocated})
    lines.append("")
    total = f"{allocated} of {len(result.claims)} claims allocated, on {used} of {len(result.nodes)} nodes"
    if claimless:
        placed = sum(1 for p in claimless if pod_fits(p))
        total += f"; {placed} of {_plural(len(claimless), 'pod')} without claims placed"
    lines.append(total)
    for warning in result.warnings:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)
