"""Schedule the plan's pods node by node, like kube-scheduler's DynamicResources filter.

Pods go in file order (the scheduler's queue order for pods of equal priority); for each pod the nodes are
tried in a stable order and the first one where all its unallocated claims fit together wins. kube-scheduler
would score the feasible nodes and may pick another one: the plan shows one valid placement, and which claims
can be allocated at all. A claim shared by several pods is allocated once; every later pod using it must run
on that claim's node. Allocations only ever take devices away, so a pod shape that failed on a node fails
there again: such nodes are skipped without another search. A pod's extended resources (nvidia.com/gpu: 2)
are served by the device plugins of device-plugin nodes, counted against what each node advertises, and from
1.36 also by DRA through the DeviceClass that maps them (see `Planner._dra_claims`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from eks_dra.devices.device_plugins import DEVICE_PLUGIN_RESOURCES
from eks_dra.drivers.families import get_family
from eks_dra.drivers.framework.configs import ConfigError, settings_per_request
from eks_dra.drivers.framework.device_setup import admin_access_refusal, hardware_changes
from eks_dra.versions import DRA_EXTENDED_RESOURCE, VERSIONS

from .allocator import AllocationError, FilterTimeout, Matcher, NodeSearch
from .cel_env import CelEnvironment
from .diagnose import explain_static
from .model import AllocatedDevice, ClaimSpec, DeviceRequest, PlanClaim, PlanPod, tolerates
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


# --- extended resources -----------------------------------------------------------------------------

def device_plugin_share(pod: PlanPod, node: SimNode) -> dict[str, int]:
    """The pod's extended resources that the node's device plugins serve (the rest, if any, DRA serves)."""
    return {name: count for name, count in pod.extended_resources.items() if name in node.extended}


# The first Kubernetes version whose scheduler serves extended resources by DRA (DeviceClass extendedResourceName).
EXTENDED_RESOURCE_VERSION = next((v for v, row in VERSIONS.items() if row.gate(DRA_EXTENDED_RESOURCE)), None)


# --- the scheduling loop -----------------------------------------------------------------------------

class Planner:
    def __init__(self, env: CelEnvironment, nodes: list[SimNode], config_drivers: dict[str, str] | None = None,
                 kubernetes_version: str = "1.34", extended_resource_classes: dict[str, str] | None = None,
                 environment: bool = False) -> None:
        """`config_drivers`: driver name -> family of the drivers whose opaque configs are decoded here with
        the drivers' own decoder (eks-dra's drivers; a vendor driver decodes its own). `kubernetes_version`:
        the scheduler to predict where it differs from the documented semantics. `extended_resource_classes`:
        extended resource -> the DeviceClass that maps it where DRAExtendedResource is on, and `environment`:
        the nodes are an environment's node groups; both only word the reason of a pod nothing serves."""
        self.nodes = nodes
        major, minor = kubernetes_version.split(".")[:2]
        self.kubernetes_version = (int(major), int(minor))
        self.version_name = f"{major}.{minor}"
        row = VERSIONS.get(self.version_name)
        self.extended_resources_by_dra = row is not None and row.gate(DRA_EXTENDED_RESOURCE)
        self.extended_resource_classes = extended_resource_classes or {}
        self.environment = environment
        self._by_name = {n.name: n for n in nodes}
        self._plugin_used: dict[int, dict[str, int]] = {}  # node index -> extended resources given to pods
        self._originals: dict[int, PlanClaim] = {}  # id of a trimmed extended-resource claim -> the pod's claim
        self._trimmed: dict[tuple[int, tuple[int, ...]], PlanClaim] = {}
        self._not_written: set[int] = set()  # extended-resource claims that device plugins served in full
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
                    if pod.reason and pod.claims and all(c.allocated for c in pod.claims)]
        claims = [c for c in claims if id(c) not in self._not_written]
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
            self._not_written.discard(id(claim))
        for pod in pods:
            reason = message if pod.node is not None else f"{pod.reason}; {message}"
            if pod.node is not None:
                node = self._by_name[pod.node]
                used = self._plugin_used[node.index]
                for name, count in device_plugin_share(pod, node).items():
                    used[name] -= count
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
        if not pending and not pod.extended_resources:
            pod.node = candidates[0].name
            return
        shape = (tuple(c.spec.key for c in pending), pod.scheduling_key, tuple(pinned))
        error = self._error_on_any_layout(shape, pod, pending, candidates)
        if error:
            self._fail(pod, pending, error)
            return
        failed = self._failed.setdefault(shape, set())
        timeout = None
        for node in candidates:
            if node.index in failed:
                continue
            claims = self._dra_claims(pod, pending, node)
            found: list | None = []
            if claims is None or not self._plugins_fit(pod, node):
                found = None
            elif claims:
                try:
                    found = NodeSearch(self.matcher, node, claims, kubernetes_version=self.kubernetes_version).run()
                except FilterTimeout as exc:
                    timeout, found = str(exc), None
                except AllocationError as exc:
                    self._fail(pod, pending, str(exc))
                    return
            if found is None:
                failed.add(node.index)
                continue
            self._commit(pod, node, pending, claims or [], found)
            return
        if timeout:
            self._fail(pod, pending, timeout)
            return
        self._fail(pod, pending, self._capacity_reason(pod, pending, candidates, pinned))

    def _dra_claims(self, pod: PlanPod, pending: list[PlanClaim], node: SimNode) -> list[PlanClaim] | None:
        """The claims DRA allocates for the pod on this node; None when the node serves one of the pod's
        extended resources in no way.

        The scheduler's rule for extended resources (KEP-5004 DRAExtendedResource; kube-scheduler's
        noderesources/fit.go and dynamicresources/extendeddynamicresources.go): a node whose allocatable
        lists the resource, because its device plugin advertises it, serves it from that allocatable; on a
        node without it, the claim the scheduler writes from the DeviceClass that maps the name is allocated
        by DRA there, so that claim loses the requests of the resources the node's plugins serve and is not
        written at all when none is left. Without the gate (1.34, 1.35) no class maps a name: device plugins
        alone serve extended resources."""
        if not pod.extended_resources:
            return pending
        by_class = {name for claim in pod.claims for name in claim.spec.served_resources}
        if any(name not in node.extended and name not in by_class for name in pod.extended_resources):
            return None
        out = []
        for claim in pending:
            served = claim.spec.served_resources
            keep = tuple(i for i, name in enumerate(served) if name not in node.extended)
            if len(keep) == len(served):
                out.append(claim)
            elif keep:
                out.append(self._trimmed_claim(claim, keep))
        return out

    def _trimmed_claim(self, claim: PlanClaim, keep: tuple[int, ...]) -> PlanClaim:
        """The pod's extended-resource claim with only the requests at `keep` (those DRA serves on a node)."""
        key = (id(claim), keep)
        if key not in self._trimmed:
            spec = claim.spec
            trimmed = ClaimSpec(tuple(spec.requests[i] for i in keep), (), f"{spec.key}{list(keep)}",
                                served_resources=tuple(spec.served_resources[i] for i in keep))
            self._trimmed[key] = PlanClaim(claim.name, claim.namespace, trimmed, claim.source)
            self._originals[id(self._trimmed[key])] = claim
        return self._trimmed[key]

    def _plugins_fit(self, pod: PlanPod, node: SimNode) -> bool:
        used = self._plugin_used.get(node.index, {})
        return all(node.extended[name] - used.get(name, 0) >= count
                   for name, count in device_plugin_share(pod, node).items())

    def _error_on_any_layout(self, shape: tuple, pod: PlanPod, pending: list[PlanClaim],
                             candidates: list[SimNode]) -> str | None:
        """kube-scheduler filters every node (below 100 nodes, and a large share above) and an allocator error
        on any of them stops the pod's scheduling, even where another node would fit. Errors that an empty node
        of a layout raises (a CEL evaluation error, a claim over 32 devices, `All` breaking a constraint) are
        checked once per pod shape and layout."""
        representatives: dict[tuple, SimNode] = {}
        for node in candidates:
            representatives.setdefault(node.layout, node)
        for node in representatives.values():
            claims = self._dra_claims(pod, pending, node)
            if not claims:
                continue
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

    def _commit(self, pod: PlanPod, node: SimNode, pending: list[PlanClaim], claims: list[PlanClaim],
                found: list[list[tuple[DeviceRequest, SimDevice]]]) -> None:
        """`claims` are what DRA allocated (`found`) for the `pending` claims on the node (_dra_claims)."""
        pod.node = node.name
        used = self._plugin_used.setdefault(node.index, {})
        for name, count in device_plugin_share(pod, node).items():
            used[name] = used.get(name, 0) + count
        if pod.gang is not None:
            self._gang_claims.extend(pending)
        for claim in pending:
            # Until found below: the extended-resource claim that the node's device plugins served in full.
            claim.allocated, claim.node, claim.reason, claim.devices = True, node.name, None, []
            self._not_written.add(id(claim))
        for allocated, results in zip(claims, found, strict=True):
            claim = self._originals.get(id(allocated), allocated)
            self._not_written.discard(id(claim))
            claim.devices = [allocated_device(allocated, req, dev) for req, dev in results]
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

    def _capacity_reason(self, pod: PlanPod, pending: list[PlanClaim], candidates: list[SimNode],
                         pinned: list[str]) -> str:
        groups: dict[tuple, list[SimNode]] = {}
        for node in candidates:
            groups.setdefault(node.layout, []).append(node)
        parts = []
        for nodes in groups.values():
            rep = nodes[0]
            claims = self._dra_claims(pod, pending, rep)
            if claims is None:
                continue  # said below when no layout serves the extended resources
            plugins = self._plugin_shortage(pod, nodes, pinned)
            if plugins:
                parts.append(plugins)
                continue
            if not claims:
                continue
            try:
                possible = NodeSearch(self.matcher, rep, claims, ignore_owners=True).run() is not None
            except AllocationError as exc:
                parts.append(str(exc))
                continue
            if not possible:
                parts.append(explain_static(self.matcher, rep, claims))
                continue
            parts.append(f"{self._nodes_holding(nodes, pinned)} other claims' devices" + self._free_detail(claims, nodes))
        if parts or not pod.extended_resources:
            return "; ".join(parts)
        return self._unserved_reason(pod, candidates)

    @staticmethod
    def _nodes_holding(nodes: list[SimNode], pinned: list[str]) -> str:
        if pinned:
            return f"node {pinned[0]} of the shared claim already holds"
        if len(nodes) == 1:
            return f"the only {nodes[0].kind} node already holds"
        return f"all {len(nodes)} {nodes[0].kind} nodes already hold"

    def _plugin_shortage(self, pod: PlanPod, nodes: list[SimNode], pinned: list[str]) -> str | None:
        """Why nodes of one layout lack the device-plugin resources the pod asks for; None when one has them."""
        share = device_plugin_share(pod, nodes[0])
        for name, count in share.items():
            if count > nodes[0].extended[name]:
                return f"asks for {name}: {count}, a {nodes[0].kind} node advertises {nodes[0].extended[name]}"
        if any(self._plugins_fit(pod, node) for node in nodes):
            return None
        for name, count in share.items():
            most = max(node.extended[name] - self._plugin_used.get(node.index, {}).get(name, 0) for node in nodes)
            if most < count:
                return (f"{self._nodes_holding(nodes, pinned)} other pods' {name}: it asks for {count}, at most "
                        f"{most} {'is' if most == 1 else 'are'} free on one node")
        return None

    def _unserved_reason(self, pod: PlanPod, candidates: list[SimNode]) -> str:
        """No node the pod may run on serves all of its extended resources: which version or group would."""
        by_class = {name for claim in pod.claims for name in claim.spec.served_resources}
        unserved = [name for name in pod.extended_resources
                    if name not in by_class and not any(name in node.extended for node in candidates)]
        if not unserved:
            kinds: dict[str, list[str]] = {}
            for node in candidates:
                kinds.setdefault(node.group or node.kind, [n for n in pod.extended_resources
                                                           if n not in node.extended and n not in by_class])
            return ("no node serves all of its extended resources together (" +
                    "; ".join(f"{kind} has no {', '.join(names)}" for kind, names in kinds.items()) + ")")
        name = unserved[0]
        asks = f"asks for {name}: {pod.extended_resources[name]}"
        mapping = self.extended_resource_classes.get(name)
        if name not in DEVICE_PLUGIN_RESOURCES and not mapping:
            return (f"{asks}, which no device plugin eks-dra deploys advertises and no DeviceClass maps "
                    "(spec.extendedResourceName); no node of this plan has it, so the scheduler leaves the pod "
                    "Pending; check the resource name")
        if self.extended_resources_by_dra:
            served = (f"which no DeviceClass maps (spec.extendedResourceName) and only device-plugin "
                      f"{'node groups' if self.environment else 'nodes'} serve")
        else:
            served = (f"which only device-plugin {'node groups' if self.environment else 'nodes'} serve on "
                      f"Kubernetes {self.version_name}")
        elsewhere = [node for node in self.nodes if name in node.extended]
        if elsewhere:
            groups = ", ".join(dict.fromkeys(node.group or node.kind for node in elsewhere))
            problem = placement_problem(pod, elsewhere[0]) or "it is bound to another node"
            where = f"{groups}, where it may not run: {problem}"
        else:
            where = "none in this environment" if self.environment else "none in this plan"
        fixes = ["add a group with deviceMode: device-plugin" if self.environment else
                 "plan an environment with a deviceMode: device-plugin group (-c env=NAME)", "or use a ResourceClaim"]
        if mapping and not self.extended_resources_by_dra and EXTENDED_RESOURCE_VERSION:
            fixes.append(f"or Kubernetes {EXTENDED_RESOURCE_VERSION}+ where DeviceClass {mapping} maps it")
        return f"{asks}, {served} ({where}); {', '.join(fixes)}"

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
