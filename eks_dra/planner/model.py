"""The planner's view of the input: DeviceClasses, claims (with parsed requests) and the pods that use them."""

from __future__ import annotations

from dataclasses import dataclass, field

from .cel_env import Selector


@dataclass(frozen=True)
class Source:
    """Where an object came from, for messages: `claims.yaml: ResourceClaim default/foo`."""

    file: str
    kind: str
    name: str
    namespace: str | None = None

    def __str__(self) -> str:
        ref = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.file}: {self.kind} {ref}"


@dataclass(frozen=True)
class DeviceClass:
    name: str
    selectors: tuple[Selector, ...]
    source: Source


@dataclass(frozen=True, eq=False)
class DeviceRequest:
    """An `exactly` request or one `firstAvailable` subrequest: what one result entry is allocated for."""

    request: str  # the main request's name
    subrequest: str | None
    device_class: DeviceClass
    selectors: tuple[Selector, ...]
    all_devices: bool  # allocationMode: All
    count: int  # ExactCount only
    admin_access: bool
    field: str  # spec path, for messages
    tolerations: tuple[Toleration, ...] = ()  # of device taints (DRADeviceTaints)

    @property
    def result_name(self) -> str:
        """The name in allocation results: `req` or `req/sub`."""
        return f"{self.request}/{self.subrequest}" if self.subrequest else self.request

    @property
    def match_key(self) -> tuple:
        """Requests with equal keys select the same devices (class and request selectors)."""
        return (self.device_class.name, tuple(s.expression for s in self.selectors), self.tolerations)


@dataclass(frozen=True, eq=False)
class Request:
    name: str
    alternatives: tuple[DeviceRequest, ...]  # one for `exactly`, in order for `firstAvailable`
    first_available: bool


@dataclass(frozen=True)
class MatchAttribute:
    """`matchAttribute` over some requests (all of the claim's when `requests` is empty)."""

    attribute: str  # fully qualified
    requests: tuple[str, ...]
    index: int

    def applies(self, request: DeviceRequest) -> bool:
        if not self.requests:
            return True
        return request.request in self.requests or (
            request.subrequest is not None and request.result_name in self.requests)

    def label(self, claim_requests: tuple[Request, ...]) -> str:
        names = self.requests or tuple(r.name for r in claim_requests)
        return f"[{', '.join(names)}]"


@dataclass(frozen=True, eq=False)
class ClaimSpec:
    requests: tuple[Request, ...]
    constraints: tuple[MatchAttribute, ...]
    key: str  # canonical JSON of spec.devices: identical claims share one parsed spec
    configs: tuple = ()  # spec.devices.config as written: the drivers decode it at prepare time
    config_path: str = "spec.devices.config"
    # The scheduler's claim of a pod's extended resources (DRAExtendedResource): per request, the resource.
    served_resources: tuple[str, ...] = ()


@dataclass(frozen=True)
class AllocatedDevice:
    request: str  # result name
    driver: str
    pool: str
    device: str
    attributes: dict


@dataclass(eq=False)
class PlanClaim:
    """One ResourceClaim of the plan: given in the files, or instantiated from a template for one pod."""

    name: str
    namespace: str
    spec: ClaimSpec
    source: Source
    allocated: bool = False
    node: str | None = None
    devices: list[AllocatedDevice] = field(default_factory=list)
    reason: str | None = None


@dataclass(frozen=True)
class Toleration:
    key: str | None
    operator: str  # Equal | Exists
    value: str | None
    effect: str | None


def tolerates(tolerations: tuple[Toleration, ...], key: str, value: str, effect: str) -> bool:
    """Whether one of the tolerations (of a pod, or of a device request) tolerates the taint."""
    for t in tolerations:
        if t.effect and t.effect != effect:
            continue
        if t.operator == "Exists" and (not t.key or t.key == key):
            return True
        if t.operator == "Equal" and t.key == key and (t.value or "") == value:
            return True
    return False


@dataclass(frozen=True)
class NodeSelectorRequirement:
    key: str
    operator: str  # In NotIn Exists DoesNotExist Gt Lt
    values: tuple[str, ...]


@dataclass(frozen=True)
class Gang:
    """Pods a controller starts together: the workload runs only when `min_available` of its `size` pods are
    placed (a JobSet, a LeaderWorkerSet group, a PyTorchJob with a min-available scheduling policy)."""

    name: str  # what the report calls it, e.g. "PyTorchJob ml/llama-ft"
    size: int
    min_available: int


@dataclass(eq=False)
class PlanPod:
    """A pod whose claims must all be allocated on one node (implicit pods stand in for unused claims)."""

    name: str
    namespace: str
    claims: list[PlanClaim]
    source: Source
    implicit: bool = False
    node_selector: dict[str, str] = field(default_factory=dict)
    # requiredDuringScheduling node affinity: OR of terms, each an AND of requirements.
    affinity_terms: tuple[tuple[NodeSelectorRequirement, ...], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    node_name: str | None = None  # spec.nodeName: bound to one node
    # DaemonSet: one pod per node it may run on; these claims come from templates, one per pod.
    daemon_templates: tuple[tuple[str, ClaimSpec, Source], ...] | None = None
    gang: Gang | None = None  # None: the pod is placed on its own
    # Extended resources asked for in its containers (nvidia.com/gpu: 2), counted as the scheduler counts them.
    extended_resources: dict[str, int] = field(default_factory=dict)
    node: str | None = None
    reason: str | None = None

    @property
    def scheduling_key(self) -> tuple:
        return (tuple(sorted(self.node_selector.items())), self.affinity_terms, self.tolerations, self.node_name,
                tuple(self.extended_resources.items()))
