"""What would make a workload fit: the smallest single change to an environment, found by planning again.

A hint is never guessed from the reason text: each candidate change (one DRA node group's maxSize raised to
N, or one new node group of N nodes of a catalog instance type) builds the changed node set and re-plans every
pod of the input, in the same order, with the same planner. The change is the smallest in nodes added; a
raised maxSize wins a tie with a new group (one setting instead of a new group). The catalog has no prices,
so among new groups the fewest nodes win (catalog order on a tie).

The work is bounded: per candidate one re-plan at its largest N, then a binary search down to the smallest N
(about log2 of the range, assuming that more nodes never make a fitting workload stop fitting; the N shown
was itself re-planned and fits). Larger N than the best change found so far are not tried. At most
`MAX_HINT_WORKLOADS` workloads get a hint and all of them together at most `MAX_REPLANS` re-plans; a workload
past either bound is reported without one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from eks_dra.catalog import INSTANCE_TYPES

from .cel_env import CelEnvironment
from .model import PlanClaim, PlanPod
from .plan import Planner, PlanResult
from .simulate import MAX_NODES, SimNode, nodes_for_environment

if TYPE_CHECKING:
    from eks_dra.config import EnvironmentConfig, NodeGroupConfig

# A raised maxSize goes up to 4x the group's size or 16 more nodes, whichever is more; a new group to 16 nodes.
MAX_SIZE_FACTOR = 4
MAX_SIZE_STEP = 16
NEW_GROUP_MAX_NODES = 16
# New-group candidates: the instance types on which one node can run one of the workload's pods, at most this
# many (those with the most accelerators first: they need the fewest nodes).
MAX_NEW_GROUP_TYPES = 6
MAX_HINT_WORKLOADS = 8
MAX_REPLANS = 200

WorkloadKey = tuple[str, str, str]  # (kind, namespace, name)


def workload_key(pod: PlanPod) -> WorkloadKey:
    return (pod.source.kind, pod.source.namespace or "", pod.source.name)


def pod_fits(pod: PlanPod) -> bool:
    """Placed, with every claim allocated (an allocation that prepare would refuse does not count)."""
    return pod.reason is None and all(c.allocated for c in pod.claims)


@dataclass(frozen=True)
class Hint:
    text: str  # "p5-dra maxSize 3": what the report prints after "would fit with"
    node_group: str | None = None  # a raised maxSize: the group and its new maxSize
    max_size: int | None = None
    instance_type: str | None = None  # a new group: its instance type and node count
    nodes: int | None = None
    nodes_added: int = 0

    def to_json(self) -> dict:
        if self.node_group is not None:
            return {"change": "maxSize", "nodeGroup": self.node_group, "maxSize": self.max_size, "text": self.text}
        return {"change": "newNodeGroup", "instanceType": self.instance_type, "nodes": self.nodes, "text": self.text}


def fresh_pods(pods: list[PlanPod]) -> list[PlanPod]:
    """The pods as loaded, before any allocation: new claim objects (a claim shared by pods stays shared)."""
    claims: dict[int, PlanClaim] = {}

    def fresh(claim: PlanClaim) -> PlanClaim:
        if id(claim) not in claims:
            claims[id(claim)] = PlanClaim(claim.name, claim.namespace, claim.spec, claim.source)
        return claims[id(claim)]

    return [replace(p, claims=[fresh(c) for c in p.claims], node=None, reason=None) for p in pods]


def fresh_nodes(nodes: list[SimNode]) -> list[SimNode]:
    """The same nodes with every device free again (a plan marks the devices it allocates)."""
    return [replace(n, devices=[replace(d, owner=None) for d in n.devices]) for n in nodes]


class Replanner:
    """Plans the same input again on other nodes, counting the re-plans against one budget."""

    def __init__(self, env: CelEnvironment, prototypes: list[PlanPod], config_drivers: dict[str, str],
                 kubernetes_version: str, budget: int = MAX_REPLANS) -> None:
        """`prototypes`: the pods handed to the first plan (DaemonSets not yet expanded)."""
        self.env = env
        self.prototypes = prototypes
        self.config_drivers = config_drivers
        self.kubernetes_version = kubernetes_version
        self.budget = budget

    def run(self, nodes: list[SimNode], pod_change: Callable[[PlanPod], PlanPod] | None = None) -> PlanResult | None:
        """The plan on `nodes`; None once the budget is spent."""
        if self.budget <= 0:
            return None
        self.budget -= 1
        pods = fresh_pods(self.prototypes)
        if pod_change is not None:
            pods = [pod_change(p) for p in pods]
        return Planner(self.env, nodes, config_drivers=self.config_drivers,
                       kubernetes_version=self.kubernetes_version).run(pods)


def workload_fits(result: PlanResult, key: WorkloadKey) -> bool:
    pods = [p for p in result.pods if workload_key(p) == key]
    return bool(pods) and all(pod_fits(p) for p in pods)


def gang_starts(replanner: Replanner, result: PlanResult) -> dict[str, int]:
    """Per gang with a pod left unplaced: how many of its pods the scheduler would place were it not a gang
    (one re-plan per gang, in which only that gang's pods are placed on their own). The gang's pods without
    claims are not in the plan and always count as placed, as in Planner._settle."""
    out: dict[str, int] = {}
    sizes = {p.gang.name: p.gang.size for p in result.pods if p.gang is not None and not pod_fits(p)}
    for name, size in sizes.items():
        def ungang(pod: PlanPod, gang: str = name) -> PlanPod:
            return replace(pod, gang=None) if pod.gang is not None and pod.gang.name == gang else pod
        members = {(p.namespace, p.name) for p in result.pods if p.gang is not None and p.gang.name == name}
        again = replanner.run(fresh_nodes(result.nodes), ungang)
        if again is None:
            break
        out[name] = size - sum(1 for p in again.pods if (p.namespace, p.name) in members and not pod_fits(p))
    return out


class EnvironmentHints:
    """The smallest single change of one environment that makes each workload that does not fit fit."""

    def __init__(self, replanner: Replanner, environment: EnvironmentConfig) -> None:
        self.replanner = replanner
        self.environment = environment

    def _nodes(self, groups: tuple[NodeGroupConfig, ...]) -> list[SimNode]:
        return nodes_for_environment(replace(self.environment, node_groups=groups))

    def _smallest(self, low: int, high: int, fits: Callable[[int], bool | None]) -> int | None:
        """The smallest n in [low, high] with fits(n), trying high first; None when high does not fit or
        the budget ran out."""
        if low > high or not fits(high):
            return None
        while low < high:
            middle = (low + high) // 2
            answer = fits(middle)
            if answer is None:
                break  # budget spent: `high` was re-planned and fits
            if answer:
                high = middle
            else:
                low = middle + 1
        return high

    def hints(self, result: PlanResult) -> dict[WorkloadKey, Hint | None]:
        """Per workload that does not fit (the first MAX_HINT_WORKLOADS of them): its hint, or None."""
        unfit = list(dict.fromkeys(workload_key(p) for p in result.pods if not pod_fits(p)))
        return {key: self.hint(result, key) for key in unfit[:MAX_HINT_WORKLOADS]}

    def hint(self, result: PlanResult, key: WorkloadKey) -> Hint | None:
        groups = self.environment.node_groups
        total = len(result.nodes)
        best: Hint | None = None

        def fits_with(changed: tuple[NodeGroupConfig, ...]) -> bool | None:
            again = self.replanner.run(self._nodes(changed))
            return None if again is None else workload_fits(again, key)

        for i, group in enumerate(groups):
            if not group.families:
                continue  # a system group is not simulated: raising it adds no node to the plan
            base = max(group.max_size, 1)
            high = min(max(MAX_SIZE_FACTOR * base, base + MAX_SIZE_STEP), base + MAX_NODES - total)
            if best is not None:
                high = min(high, base + best.nodes_added - 1)

            def raised(n: int, i: int = i, group: NodeGroupConfig = group) -> bool | None:
                return fits_with((*groups[:i], replace(group, max_size=n), *groups[i + 1:]))

            n = self._smallest(base + 1, high, raised)
            if n is not None:
                best = Hint(f"{group.name} maxSize {n}", node_group=group.name, max_size=n, nodes_added=n - base)
        if best is not None and best.nodes_added == 1:
            return best  # no new group adds fewer nodes
        pod = next(p for p in result.pods if workload_key(p) == key and not pod_fits(p))
        for instance_type in self._new_group_types(pod):
            high = min(NEW_GROUP_MAX_NODES, MAX_NODES - total)
            if best is not None:
                high = min(high, best.nodes_added - 1)
            new = self._new_group(instance_type)

            def added(n: int, new: NodeGroupConfig = new) -> bool | None:
                return fits_with((*groups, replace(new, max_size=n)))

            n = self._smallest(1, high, added)
            if n is not None:
                noun = "node" if n == 1 else "nodes"
                best = Hint(f"a new node group of {n} {instance_type} {noun}", instance_type=instance_type, nodes=n,
                            nodes_added=n)
        return best

    def _new_group(self, instance_type: str) -> NodeGroupConfig:
        from eks_dra.config import NodeGroupConfig

        taken = {g.name for g in self.environment.node_groups}
        name = f"{instance_type.split('.')[0]}-new"
        suffix = 1
        while name in taken:
            suffix += 1
            name = f"{instance_type.split('.')[0]}-new-{suffix}"
        return NodeGroupConfig(name=name, instance_type=instance_type, max_size=1)

    def _new_group_types(self, pod: PlanPod) -> list[str]:
        """Instance types one node of which (as a new group of this environment) can run `pod` alone; these
        one-pod plans are small and bounded by the catalog's size, so they do not count as re-plans."""
        fitting = []
        ranked = sorted(INSTANCE_TYPES.values(), key=lambda it: (-it.accelerator_count, it.name))
        for it in ranked:
            nodes = self._nodes((self._new_group(it.name),))
            if not nodes:
                continue  # nothing of it is managed by DRA
            alone = fresh_pods([pod])[0]
            Planner(self.replanner.env, nodes, config_drivers=self.replanner.config_drivers,
                    kubernetes_version=self.replanner.kubernetes_version).run([alone])
            if pod_fits(alone):
                fitting.append(it.name)
                if len(fitting) == MAX_NEW_GROUP_TYPES:
                    break
        return fitting
