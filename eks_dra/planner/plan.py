"""Schedule the plan's pods node by node, like kube-scheduler's DynamicResources filter.

Pods go in file order (the scheduler's queue order for pods of equal priority); for each pod the nodes are
tried in a stable order and the first one where all its unallocated claims fit together wins. kube-scheduler
would score the feasible nodes and may pick another one: the plan shows one valid placement, and which claims
can be allocated at all. A claim shared by several pods is allocated once; every later pod using it must run
on that claim's node. Allocations only ever take devices away, so a pod shape that failed on a node fails
there again: such nodes are skipped without another search.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from eks_dra.drivers.families import get_family
from eks_dra.drivers.framework.configs import ConfigError, settings_per_request
from eks_dra.drivers.framework.device_setup import admin_access_refusal, hardware_changes

from .allocator import AllocationError, FilterTimeout, Matcher, NodeSearch
from .cel_env import CelEnvironment
from .diagnose import explain_static
from .model import AllocatedDevice, DeviceRequest, PlanClaim, PlanPod, tolerates
from .simulate import SimDevice, SimNode

_ATTRIBUTE_REF = re.compile(
    r"attributes\s*\[\s*[\"']([^\"']+)[\"']\s*\]\s*(?:\.\s*([A-Za-z_]\w*)|\[\s*[\"']([^\"']+)[\"']\s*\])")


@dataclass
class PlanResult:
    claims: list[PlanClaim]
    pods: list[PlanPod]
    nodes: list[SimNode]
    warnings: list[str] = field(default_factory=list)
    unplanned: list[str] = field(default_factory=list)  # workloads whose pods are not in the plan

    @property
    def all_allocated(self) -> bool:
        return all(c.allocated for c in self.claims) and not any(p.reason for p in self.pods) and not self.unplanned


# --- node placement (nodeSelector, required node affinity, taints) ------------------------------------

def placement_problem(pod: PlanPod, node: SimNode) -> str | None:
    """Why the pod may not run on the node (labels and taints); None when it may."""
    if pod.implicit:
        return None
    for key, value in pod.node_selector.items():
        if node.labels.get(key) != value:
            return f"nodeSelector {key}={value} does not match"
    if pod.affinity_terms and not any(_term_matches(term, node) for term in pod.affinity_terms):
        return "required node affinity does not match"
    for key, value, effect in node.taints:
        if effect in ("NoSchedule", "NoExecute") and not tolerates(pod.tolerations, key, value, effect):
            return f"taint {key}={value}:{effect} is not tolerated"
    return None


def _term_matches(term, node: SimNode) -> bool:
    if not term:
        return False  # an empty node selector term matches no node
    for req in term:
        actual = node.name if req.key == "metadata.name" else node.labels.get(req.key)
        op = req.operator
        if op == "In" and actual not in req.values:
            return False
        if op == "NotIn" and actual in req.values:
            return False
        if op == "Exists" and actual is None:
            return False
        if op == "DoesNotExist" and actual is not None:
            return False
        if op in ("Gt", "Lt"):
            try:
                a, b = int(actual or ""), int(req.values[0])
            except (ValueError, IndexError):
                return False
            if (op == "Gt" and not a > b) or (op == "Lt" and not a < b):
                return False
    return True


# --- the attributes that mattered --------------------------------------------------------------------

def _referenced_attributes(request: DeviceRequest, constraint_attrs: list[str]) -> list[str]:
    names = list(constraint_attrs)
    for selector in (*request.device_class.selectors, *request.selectors):
        for domain, ident, indexed in _ATTRIBUTE_REF.findall(selector.expression):
            name = f"{domain}/{ident or indexed}"
            if name not in names:
                names.append(name)
    return names


def _plain(value: tuple[str, object]) -> object:
    return value[1]


def allocated_device(claim: PlanClaim, request: DeviceRequest, device: SimDevice) -> AllocatedDevice:
    constraint_attrs = [c.attribute for c in claim.spec.constraints if c.applies(request)]
    attributes = {}
    for name in _referenced_attributes(request, constraint_attrs):
        value = device.attribute(name)
        if value is not None:
            attributes[name] = _plain(value)
    return AllocatedDevice(request.result_name, device.driver, device.pool, device.name, attributes)


# --- the scheduling loop -----------------------------------------------------------------------------

class Planner:
    def __init__(self, env: CelEnvironment, nodes: list[SimNode], config_drivers: dict[str, str] | None = None,
                 kubernetes_version: str = "1.34") -> None:
        """`config_drivers`: driver name -> family of the drivers whose opaque configs are decoded here with
        the drivers' own decoder (eks-dra's drivers; a vendor driver decodes its own). `kubernetes_version`:
        the scheduler to predict where it differs from the documented semantics."""
        self.nodes = nodes
        major, minor = kubernetes_version.split(".")[:2]
        self.kubernetes_version = (int(major), int(minor))
        self.config_drivers = config_drivers or {}
        self.matcher = Matcher(env)
        self._failed: dict[tuple, set[int]] = {}
        self._gang_claims: list[PlanClaim] = []  # the claims the gang being scheduled was given
        self._layout_errors: dict[tuple, str | None] = {}

    def run(self, pods: list[PlanPod]) -> PlanResult:
        """Schedule the pods in order; the result lists every claim once, in the order pods first use them.
        A gang's pods (consecutive in the list) are settled together once its last pod was tried."""
        scheduled: list[PlanPod] = []
        claims: list[PlanClaim] = []
        listed: set[int] = set()
        gang: list[PlanPod] = []
        for prototype in pods:
            for pod in self._expand(prototype):
                if gang and pod.gang is not gang[0].gang:
                    self._settle(gang)
                    gang = []
                scheduled.append(pod)
                for claim in pod.claims:
                    if id(claim) not in listed:
                        listed.add(id(claim))
                        claims.append(claim)
                if pod.gang is not None:
                    if not gang:
                        self._gang_claims = []
                    gang.append(pod)
                self.schedule(pod)
        if gang:
            self._settle(gang)
        warnings = [f"pod {pod.namespace}/{pod.name}: {pod.reason}" for pod in scheduled
                    if pod.reason and all(c.allocated for c in pod.claims)]
        return PlanResult(claims, scheduled, self.nodes, warnings)

    def _settle(self, pods: list[PlanPod]) -> None:
        """All or nothing, as a gang scheduler (Volcano, Kueue, the coscheduling plugin) admits a gang: when
        fewer than min_available of its pods can be placed, none of them runs and the devices its claims were
        given go back to the pool for the pods after it. Pods of the gang without claims always count as placed."""
        gang = pods[0].gang
        if gang is None:
            return
        waiting = [p for p in pods if p.node is None]
        started = gang.size - len(waiting)
        if started >= gang.min_available:
            return
        needs = "all of them" if gang.min_available == gang.size else f"minAvailable {gang.min_available}"
        message = (f"gang {gang.name} would start {started} of {gang.size} pods and wait ({needs}); "
                   "none of its pods runs, their devices stay free")
        freed = {id(c) for c in self._gang_claims}
        for node in self.nodes:
            for device in node.devices:
                if device.owner is not None and id(device.owner) in freed:
                    device.owner = None
        for claim in self._gang_claims:
            claim.allocated, claim.node, claim.devices = False, None, []
        for pod in pods:
            reason = message if pod.node is not None else f"{pod.reason}; {message}"
            pod.node = None
            self._fail(pod, [c for c in pod.claims if id(c) in freed or not c.allocated], reason)
        self._failed.clear()  # devices came back: a shape that failed on a node may fit there now

    def _expand(self, pod: PlanPod) -> list[PlanPod]:
        """A DaemonSet prototype becomes one pod per node it may run on, bound to that node."""
        if pod.daemon_templates is None:
            return [pod]
        out = []
        for node in self.nodes:
            if placement_problem(pod, node) is not None:
                continue
            name = f"{pod.name}-{node.name}"
            claims = list(pod.claims) + [PlanClaim(f"{name}-{entry}", pod.namespace, spec, source)
                                         for entry, spec, source in pod.daemon_templates]
            out.append(replace(pod, name=name, claims=claims, node_name=node.name, daemon_templates=None))
        return out

    def schedule(self, pod: PlanPod) -> None:
        pending = [c for c in pod.claims if not c.allocated]
        pinned = sorted({c.node for c in pod.claims if c.allocated and c.node})
        if len(pinned) > 1:
            self._fail(pod, pending, f"its shared claims are allocated on different nodes ({', '.join(pinned)})")
            return
        placeable = self.nodes if pod.implicit else [n for n in self.nodes if placement_problem(pod, n) is None]
        if pod.node_name:
            pinned = sorted({*pinned, pod.node_name})
            if len(pinned) > 1:
                self._fail(pod, pending, f"it is bound to node {pod.node_name}, its shared claims are on "
                                         f"{', '.join(n for n in pinned if n != pod.node_name)}")
                return
        candidates = [n for n in placeable if not pinned or n.name == pinned[0]]
        if not candidates:
            self._fail(pod, pending, self._placement_reason(pod, pinned))
            return
        if not pending:
            pod.node = candidates[0].name
            return
        shape = (tuple(c.spec.key for c in pending), pod.scheduling_key, tuple(pinned))
        error = self._error_on_any_layout(shape, pending, candidates)
        if error:
            self._fail(pod, pending, error)
            return
        failed = self._failed.setdefault(shape, set())
        timeout = None
        for node in candidates:
            if node.index in failed:
                continue
            try:
                found = NodeSearch(self.matcher, node, pending, kubernetes_version=self.kubernetes_version).run()
            except FilterTimeout as exc:
                timeout, found = str(exc), None
            except AllocationError as exc:
                self._fail(pod, pending, str(exc))
                return
            if found is None:
                failed.add(node.index)
                continue
            self._commit(pod, node, pending, found)
            return
        if timeout:
            self._fail(pod, pending, timeout)
            return
        self._fail(pod, pending, self._capacity_reason(pending, candidates, pinned))

    def _error_on_any_layout(self, shape: tuple, claims: list[PlanClaim], candidates: list[SimNode]) -> str | None:
        """kube-scheduler filters every node (below 100 nodes, and a large share above) and an allocator error
        on any of them stops the pod's scheduling, even where another node would fit. Errors that an empty node
        of a layout raises (a CEL evaluation error, a claim over 32 devices, `All` breaking a constraint) are
        checked once per pod shape and layout."""
        representatives: dict[tuple, SimNode] = {}
        for node in candidates:
            representatives.setdefault(node.layout, node)
        for node in representatives.values():
            key = (shape, node.layout)
            if key not in self._layout_errors:
                try:
                    NodeSearch(self.matcher, node, claims, ignore_owners=True).run()
                    self._layout_errors[key] = None
                except AllocationError as exc:
                    self._layout_errors[key] = str(exc)
            if self._layout_errors[key]:
                return self._layout_errors[key]
        return None

    def _commit(self, pod: PlanPod, node: SimNode, claims: list[PlanClaim],
                found: list[list[tuple[DeviceRequest, SimDevice]]]) -> None:
        pod.node = node.name
        if pod.gang is not None:
            self._gang_claims.extend(claims)
        for claim, results in zip(claims, found, strict=True):
            claim.allocated, claim.node, claim.reason = True, node.name, None
            claim.devices = [allocated_device(claim, req, dev) for req, dev in results]
            for req, dev in results:
                if not req.admin_access:
                    dev.owner = claim
            problem = self._config_problem(claim, results)
            if problem:  # the scheduler allocates it, the driver then refuses to prepare it
                claim.allocated, claim.reason = False, f"prepare would fail: {problem}"

    def _config_problem(self, claim: PlanClaim, results: list[tuple[DeviceRequest, SimDevice]]) -> str | None:
        """The error our driver's prepare would report for the claim's opaque configs (same text)."""
        for driver, family in self.config_drivers.items():
            mine = [(req, dev) for req, dev in results if dev.driver == driver]
            if not mine or not claim.spec.configs:
                continue
            types: dict[str, set[str]] = {}
            for req, dev in mine:
                value = dev.attribute(f"{driver}/type")
                if value is not None:
                    types.setdefault(req.result_name, set()).add(str(_plain(value)))
            try:
                settings = settings_per_request(get_family(family), driver, list(claim.spec.configs),
                                                sorted({r.result_name for r, _ in mine}), types, claim.spec.config_path)
            except ConfigError as exc:
                return f"{driver}: {exc}"
            # The driver's one-owner rule for device settings, as far as it depends on this claim alone: which
            # other claims hold a device when this one is prepared is known only on the node.
            for req, dev in mine:
                changes = hardware_changes(settings[req.result_name], get_family(family).hardware_settings)
                if req.admin_access and changes:
                    return f"{driver}: {admin_access_refusal(req.result_name, dev.name, changes)}"
        return None

    @staticmethod
    def _fail(pod: PlanPod, claims: list[PlanClaim], reason: str) -> None:
        pod.reason = reason
        for claim in claims:
            claim.reason = reason if pod.implicit or len(pod.claims) == 1 else f"pod {pod.name}: {reason}"

    def _placement_reason(self, pod: PlanPod, pinned: list[str]) -> str:
        if pinned:
            node = next((n for n in self.nodes if n.name == pinned[0]), None)
            if node is None:
                return f"it is bound to node {pinned[0]}, which is not in the plan"
            return (f"it must run on node {node.name} (bound there, or its shared claim is), where it may not run: "
                    f"{placement_problem(pod, node)}")
        seen: dict[tuple, str] = {}
        for node in self.nodes:
            seen.setdefault(node.layout, f"{node.group or node.kind}: {placement_problem(pod, node)}")
        return f"no node may run pod {pod.name} ({'; '.join(seen.values()) or 'the plan has no nodes'})"

    def _capacity_reason(self, claims: list[PlanClaim], candidates: list[SimNode], pinned: list[str]) -> str:
        groups: dict[tuple, list[SimNode]] = {}
        for node in candidates:
            groups.setdefault(node.layout, []).append(node)
        parts = []
        for nodes in groups.values():
            rep = nodes[0]
            try:
                possible = NodeSearch(self.matcher, rep, claims, ignore_owners=True).run() is not None
            except AllocationError as exc:
                parts.append(str(exc))
                continue
            if not possible:
                parts.append(explain_static(self.matcher, rep, claims))
                continue
            if pinned:
                where = f"node {pinned[0]} of the shared claim already holds"
            elif len(nodes) == 1:
                where = f"the only {rep.kind} node already holds"
            else:
                where = f"all {len(nodes)} {rep.kind} nodes already hold"
            parts.append(f"{where} other claims' devices" + self._free_detail(claims, nodes))
        return "; ".join(parts)

    def _free_detail(self, claims: list[PlanClaim], nodes: list[SimNode]) -> str:
        """The first group of requests (same class and selectors) that no node has enough free devices for."""
        needs: dict[tuple, tuple[DeviceRequest, list[str], int]] = {}
        for claim in claims:
            for request in claim.spec.requests:
                alt = request.alternatives[0]
                if alt.all_devices or alt.admin_access:
                    continue
                first, names, total = needs.get(alt.match_key, (alt, [], 0))
                needs[alt.match_key] = (first, [*names, alt.result_name], total + alt.count)
        for alt, names, total in needs.values():
            most = max(sum(1 for d in self.matcher.candidates(alt, n).matching if d.owner is None) for n in nodes)
            if most < total:
                who = f"request {names[0]} needs" if len(names) == 1 else f"requests {'+'.join(names)} need"
                devices = "1 matching device" if total == 1 else f"{total} matching devices"
                free = "is" if most == 1 else "are"
                return f": {who} {devices}, at most {most} {free} free on one node"
        return ""
