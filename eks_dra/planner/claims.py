"""Load manifests (multi-document YAML or JSON, List kinds) into DeviceClasses, claims and pods.

Kinds read: DeviceClass, ResourceClaim, ResourceClaimTemplate (resource.k8s.io v1, v1beta2, and the flat
v1beta1 request shape), Pod, and the pod templates of Deployment, ReplicaSet, StatefulSet, Job, CronJob and
DaemonSet (one pod per node it may run on, expanded by the planner), and of the ML workload kinds in
workloads.py (Kubeflow, JobSet, LeaderWorkerSet, Ray, Volcano), checked against their CRDs' schemas.
Kinds that create no pods (Services, RBAC, ...) are skipped; any other kind is reported in
Manifests.unknown, and the templates it uses are not planned. Every problem raises UserError naming the
file, the object and the field.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Container
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from eks_dra.devices.classes import DeviceClassDefinition
from eks_dra.devices.names import COMPUTE_DOMAIN_API_VERSION, COMPUTE_DOMAIN_KIND
from eks_dra.errors import UserError, shown
from eks_dra.input_files import MAX_MANIFEST_BYTES, load_documents, load_stream

from .cel_env import CelEnvironment, Selector
from .model import (
    ClaimSpec,
    DeviceClass,
    DeviceRequest,
    MatchAttribute,
    NodeSelectorRequirement,
    PlanClaim,
    PlanPod,
    Request,
    Source,
    Toleration,
)
from .workloads import (
    NON_WORKLOAD_KINDS,
    RUNTIME_KINDS,
    NotPlanned,
    PodGroup,
    Workload,
    expand,
    group_of,
    has_pod_template,
    template_names,
)
from .workloads import check as workload_of

RESOURCE_API_VERSIONS = ("resource.k8s.io/v1", "resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1")
MAX_REQUESTS = 32  # DeviceRequestsMaxSize
MAX_CONSTRAINTS = 32
MAX_SELECTORS = 32
MAX_SUBREQUESTS = 8  # FirstAvailableDeviceRequestMaxSize
MAX_CONFIGS = 32  # DeviceConfigMaxSize
# Pods per cluster that Kubernetes is tested for (kubernetes.io/docs/setup/best-practices/cluster-large): no
# workload has more, and the simulation's time and memory grow with the pod count.
MAX_WORKLOAD_PODS = 150_000
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z_][A-Za-z0-9_]*$")
_WORKLOAD_KINDS = ("Deployment", "ReplicaSet", "StatefulSet", "Job", "CronJob", "DaemonSet")
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
DEVICE_CLASS_RESOURCE_PREFIX = "deviceclass.resource.kubernetes.io/"
MAX_NAME_LENGTH = 253  # a DNS subdomain: the longest object name the API server accepts
MAX_NAMESPACE_LENGTH = 63  # a DNS label


@dataclass
class Manifests:
    classes: dict[str, DeviceClass] = field(default_factory=dict)
    pods: list[PlanPod] = field(default_factory=list)  # in plan order; they hold the claims
    # Why claims or pods were left out of the plan, and how a workload's pod count was chosen (warnings).
    skipped: list[str] = field(default_factory=list)
    # Workloads whose pods are not planned: kinds the planner does not understand, and understood ones whose
    # pods cannot be known from the files (a TrainJob without its runtime). Either makes the plan incomplete.
    unknown: list[str] = field(default_factory=list)
    not_planned: list[str] = field(default_factory=list)


@dataclass
class _Doc:
    obj: dict
    file: str
    order: int

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind", ""))

    @property
    def meta(self) -> dict:
        meta = self.obj.get("metadata")
        return meta if isinstance(meta, dict) else {}

    @property
    def name(self) -> str:
        return str(self.meta.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.meta.get("namespace") or "default")

    def source(self, namespaced: bool = True) -> Source:
        return Source(self.file, self.kind, self.name or "<unnamed>", self.namespace if namespaced else None)


STDIN = Path("-")
STDIN_NAME = "<stdin>"


def _expand(paths: list[Path]) -> list[Path]:
    """Files as given; a directory stands for its *.yaml, *.yml and *.json files (like kubectl apply -f)."""
    out: list[Path] = []
    for path in paths:
        if path != STDIN and path.is_dir():
            out.extend(sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml", ".json") and p.is_file()))
        else:
            out.append(path)
    return out


def read_documents(paths: list[Path]) -> list[_Doc]:
    """Every object in the files, List kinds flattened, in file and document order."""
    docs: list[_Doc] = []
    if paths.count(STDIN) > 1:
        raise UserError("- (stdin) is given more than once; give it once")
    for given in _expand(paths):
        # `-` is stdin, as in `kubectl apply -f -`; messages name it <stdin>.
        path = STDIN_NAME if given == STDIN else given
        if given == STDIN:
            loaded = load_stream(sys.stdin.buffer, STDIN_NAME, MAX_MANIFEST_BYTES)
        else:
            loaded = load_documents(given, MAX_MANIFEST_BYTES)
        for i, obj in enumerate(loaded):
            if obj is None:
                continue
            if not isinstance(obj, dict) or "kind" not in obj:
                raise UserError(f"{path}: document {i + 1} is not a Kubernetes object (a mapping with a kind)")
            items = obj.get("items") if str(obj["kind"]).endswith("List") else None
            for item in items if isinstance(items, list) else [obj]:
                if not isinstance(item, dict) or "kind" not in item:
                    raise UserError(f"{path}: document {i + 1}: a List item is not a Kubernetes object")
                _check_metadata(item, f"{path}: document {i + 1}")
                docs.append(_Doc(item, str(path), len(docs)))
    return docs


def _object_name(value: Any, where: str, limit: int = MAX_NAME_LENGTH) -> str:
    if not isinstance(value, str) or not value or len(value) > limit:
        raise UserError(f"{where}: {shown(value)} must be an object name of at most {limit} characters")
    return value


def _check_metadata(obj: dict, where: str) -> None:
    """Names the API server would refuse are refused here, before they are echoed in other messages."""
    meta = obj.get("metadata")
    if meta is None:
        return
    if not isinstance(meta, dict):
        raise UserError(f"{where}: metadata: must be a mapping")
    if meta.get("name") is not None:
        _object_name(meta["name"], f"{where}: metadata.name")
    if meta.get("namespace") is not None:
        _object_name(meta["namespace"], f"{where}: metadata.namespace", MAX_NAMESPACE_LENGTH)


class _Loader:
    def __init__(self, env: CelEnvironment) -> None:
        self.env = env
        self.classes: dict[str, DeviceClass] = {}
        self._specs: dict[str, ClaimSpec] = {}  # canonical key -> parsed spec (shared by identical claims)
        self._seen: set[tuple[str, str, str]] = set()

    # -- helpers ---------------------------------------------------------------------------------
    def _unique(self, doc: _Doc, namespaced: bool) -> None:
        if not doc.name:
            raise UserError(f"{doc.file}: {doc.kind} without metadata.name")
        key = (doc.kind, doc.namespace if namespaced else "", doc.name)
        if key in self._seen:
            raise UserError(f"{doc.source(namespaced)}: defined twice; each object may appear once")
        self._seen.add(key)

    @staticmethod
    def _mapping(value: Any, where: str, required: bool = True) -> dict:
        if value is None and not required:
            return {}
        if not isinstance(value, dict):
            raise UserError(f"{where}: must be a mapping")
        return value

    @staticmethod
    def _list(value: Any, where: str, limit: int | None = None) -> list:
        if value is None:
            return []
        if not isinstance(value, list):
            raise UserError(f"{where}: must be a list")
        if limit is not None and len(value) > limit:
            raise UserError(f"{where}: has {len(value)} entries, at most {limit} are allowed")
        return value

    def _selectors(self, value: Any, where: str) -> tuple[Selector, ...]:
        out = []
        for i, sel in enumerate(self._list(value, where, MAX_SELECTORS)):
            cel_part = self._mapping(sel, f"{where}[{i}]").get("cel")
            if cel_part is None:
                raise UserError(f"{where}[{i}].cel: missing (the only selector type is cel)")
            expr = self._mapping(cel_part, f"{where}[{i}].cel").get("expression")
            out.append(self.env.compile(expr, f"{where}[{i}].cel.expression"))
        return tuple(out)

    # -- DeviceClass ---------------------------------------------------------------------------
    def device_class(self, doc: _Doc) -> None:
        self._unique(doc, namespaced=False)
        where = str(doc.source(namespaced=False))
        spec = self._mapping(doc.obj.get("spec"), f"{where}: spec", required=False)
        selectors = self._selectors(spec.get("selectors"), f"{where}: spec.selectors")
        self.classes[doc.name] = DeviceClass(doc.name, selectors, doc.source(namespaced=False))

    # -- claims ------------------------------------------------------------------------------------
    def claim_spec(self, spec: Any, where: str, path: str, api_version: str) -> ClaimSpec:
        spec = self._mapping(spec, f"{where}: {path}", required=False)
        devices = self._mapping(spec.get("devices"), f"{where}: {path}.devices", required=False)
        key = json.dumps([api_version, devices], sort_keys=True, default=str)
        cached = self._specs.get(key)
        if cached is not None:
            return cached
        dpath = f"{path}.devices"
        raw_requests = self._list(devices.get("requests"), f"{where}: {dpath}.requests", MAX_REQUESTS)
        requests: list[Request] = []
        names: set[str] = set()
        for i, raw in enumerate(raw_requests):
            rpath = f"{dpath}.requests[{i}]"
            raw = self._mapping(raw, f"{where}: {rpath}")
            name = raw.get("name")
            if not isinstance(name, str) or not _DNS_LABEL.match(name) or len(name) > 63:
                raise UserError(f"{where}: {rpath}.name: {shown(name)} must be a DNS label (lower case, digits, '-')")
            if name in names:
                raise UserError(f"{where}: {rpath}.name: duplicate request name {shown(name)}")
            names.add(name)
            requests.append(self.request(raw, name, where, rpath, api_version))
        valid_refs = {r.name for r in requests} | {
            a.result_name for r in requests if r.first_available for a in r.alternatives}
        constraints = []
        for i, raw in enumerate(self._list(devices.get("constraints"), f"{where}: {dpath}.constraints",
                                           MAX_CONSTRAINTS)):
            cpath = f"{dpath}.constraints[{i}]"
            raw = self._mapping(raw, f"{where}: {cpath}")
            refs = self._list(raw.get("requests"), f"{where}: {cpath}.requests")
            for j, ref in enumerate(refs):
                if ref not in valid_refs:
                    raise UserError(f"{where}: {cpath}.requests[{j}]: {shown(ref)} is not a request of this claim "
                                    f"(requests: {', '.join(sorted(valid_refs)) or 'none'})")
            if raw.get("distinctAttribute") is not None:
                raise UserError(f"{where}: {cpath}.distinctAttribute: needs the alpha feature gate "
                                "DRAConsumableCapacity, which is off in Kubernetes 1.34; use matchAttribute")
            attr = raw.get("matchAttribute")
            if not isinstance(attr, str) or not _QUALIFIED.match(attr):
                raise UserError(f"{where}: {cpath}.matchAttribute: {shown(attr)} must be a fully qualified attribute "
                                "name <domain>/<name>, e.g. resource.kubernetes.io/pcieRoot")
            constraints.append(MatchAttribute(attr, tuple(refs), i))
        configs = self._list(devices.get("config"), f"{where}: {dpath}.config", MAX_CONFIGS)
        parsed = ClaimSpec(tuple(requests), tuple(constraints), key, tuple(configs), f"{dpath}.config")
        self._specs[key] = parsed
        return parsed

    def request(self, raw: dict, name: str, where: str, rpath: str, api_version: str) -> Request:
        if api_version.endswith("v1beta1"):
            # v1beta1 kept the exact request's fields on the request itself.
            if "firstAvailable" in raw:
                subs = raw["firstAvailable"]
                raw = {"name": name, "firstAvailable": subs}
            else:
                raw = {"name": name, "exactly": {k: v for k, v in raw.items() if k != "name"}}
        exactly, first = raw.get("exactly"), raw.get("firstAvailable")
        if (exactly is None) == (first is None):
            raise UserError(f"{where}: {rpath}: set exactly one of exactly or firstAvailable")
        if exactly is not None:
            alt = self.device_request(self._mapping(exactly, f"{where}: {rpath}.exactly"), name, None,
                                      where, f"{rpath}.exactly")
            return Request(name, (alt,), first_available=False)
        subs = self._list(first, f"{where}: {rpath}.firstAvailable", MAX_SUBREQUESTS)
        if not subs:
            raise UserError(f"{where}: {rpath}.firstAvailable: needs at least one subrequest")
        alts, seen = [], set()
        for j, sub in enumerate(subs):
            spath = f"{rpath}.firstAvailable[{j}]"
            sub = self._mapping(sub, f"{where}: {spath}")
            sub_name = sub.get("name")
            if not isinstance(sub_name, str) or not _DNS_LABEL.match(sub_name) or sub_name in seen:
                raise UserError(f"{where}: {spath}.name: {shown(sub_name)} must be a unique DNS label")
            seen.add(sub_name)
            if "adminAccess" in sub:
                raise UserError(f"{where}: {spath}.adminAccess: not a field of a subrequest")
            alts.append(self.device_request(sub, name, sub_name, where, spath))
        return Request(name, tuple(alts), first_available=True)

    def device_request(self, raw: dict, name: str, sub: str | None, where: str, path: str) -> DeviceRequest:
        class_name = raw.get("deviceClassName")
        if class_name is None or class_name == "":
            raise UserError(f"{where}: {path}.deviceClassName: required")
        _object_name(class_name, f"{where}: {path}.deviceClassName")
        device_class = self.classes.get(class_name)
        if device_class is None:
            known = ", ".join(sorted(self.classes)) or "none in the given files"
            raise UserError(f"{where}: {path}.deviceClassName: device class {class_name} not found "
                            f"(known: {known}); add its DeviceClass to the files")
        mode = raw.get("allocationMode") or "ExactCount"
        if mode not in ("ExactCount", "All"):
            raise UserError(f"{where}: {path}.allocationMode: {shown(mode)} must be ExactCount or All")
        count = raw.get("count")
        if mode == "All" and count is not None:
            raise UserError(f"{where}: {path}.count: must not be set when allocationMode is All")
        if count is None:
            count = 1
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise UserError(f"{where}: {path}.count: {shown(count)} must be a positive integer")
        admin = raw.get("adminAccess", False)
        if not isinstance(admin, bool):
            raise UserError(f"{where}: {path}.adminAccess: must be true or false")
        selectors = self._selectors(raw.get("selectors"), f"{where}: {path}.selectors")
        tolerations = _tolerations(raw.get("tolerations"), f"{where}: {path}")
        return DeviceRequest(name, sub, device_class, selectors, mode == "All", count, admin, path, tolerations)


def _tolerations(value: Any, where: str) -> tuple[Toleration, ...]:
    out = []
    for i, t in enumerate(_Loader._list(value, f"{where}.tolerations")):
        t = _Loader._mapping(t, f"{where}.tolerations[{i}]")
        out.append(Toleration(t.get("key"), t.get("operator") or "Equal", t.get("value"), t.get("effect")))
    return tuple(out)


def _affinity(spec: dict, where: str) -> tuple[tuple[NodeSelectorRequirement, ...], ...]:
    node_affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {})
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = []
    for term in _Loader._list(required.get("nodeSelectorTerms"), f"{where}.affinity"):
        reqs = []
        for req in (term or {}).get("matchExpressions") or []:
            reqs.append(NodeSelectorRequirement(str(req.get("key")), str(req.get("operator")),
                                                tuple(str(v) for v in req.get("values") or ())))
        for req in (term or {}).get("matchFields") or []:
            if req.get("key") == "metadata.name":
                reqs.append(NodeSelectorRequirement("metadata.name", str(req.get("operator")),
                                                    tuple(str(v) for v in req.get("values") or ())))
        terms.append(tuple(reqs))
    return tuple(terms)


def _pod_groups(docs: list[_Doc], manifests: Manifests) -> list[tuple[_Doc, PodGroup | None]]:
    """Each workload's pod groups in document order; (doc, None) for a workload whose pods are not planned
    (said so in manifests.unknown or manifests.not_planned)."""
    runtimes: dict[tuple[str, str, str], dict] = {}
    workloads: list[tuple[_Doc, Workload]] = []
    out: list[tuple[_Doc, PodGroup | None]] = []
    for doc in docs:
        api = str(doc.obj.get("apiVersion", ""))
        workload = workload_of(doc.obj, doc.kind, api, str(doc.source()))
        if workload is not None and (group_of(api), doc.kind) in RUNTIME_KINDS:
            scope = "" if doc.kind == "ClusterTrainingRuntime" else doc.namespace
            runtimes[(doc.kind, scope, doc.name)] = doc.obj
        elif workload is not None:
            workloads.append((doc, workload))
    known = {id(doc): workload for doc, workload in workloads}
    for doc in docs:
        workload = known.get(id(doc))
        if workload is not None:
            try:
                groups = expand(doc.obj, workload, doc.kind, doc.name, doc.namespace, str(doc.source()), runtimes)
            except NotPlanned as exc:
                manifests.not_planned.append(str(exc))
                out.append((doc, None))
                continue
            for group in groups:
                if len(group.names) > MAX_WORKLOAD_PODS:
                    raise UserError(f"{doc.source()}: {group.path}: {len(group.names)} pods at once is more than a "
                                    f"Kubernetes cluster runs ({MAX_WORKLOAD_PODS}); write the replica count the "
                                    "workload will really have")
            out.extend((doc, group) for group in groups)
            manifests.skipped.extend(group.note for group in groups if group.note)
        elif doc.kind == "Pod" or doc.kind in _WORKLOAD_KINDS:
            pod_spec, count = _pod_count(doc)
            names = (doc.name,) if doc.kind in ("Pod", "DaemonSet") else tuple(f"{doc.name}-{i}" for i in range(count))
            out.append((doc, PodGroup(pod_spec, names, "spec" if doc.kind == "Pod" else "pod template spec")))
        elif (group_of(str(doc.obj.get("apiVersion", ""))), doc.kind) in RUNTIME_KINDS:
            continue
        elif doc.kind not in NON_WORKLOAD_KINDS or has_pod_template(doc.obj):
            manifests.unknown.append(f"{doc.source()}: kind not understood ({doc.obj.get('apiVersion')}); "
                                     "its pods are not planned")
            out.append((doc, None))
    return out


def _pod_count(doc: _Doc) -> tuple[dict, int]:
    """(pod spec, number of pods running at once) of a workload."""
    spec = doc.obj.get("spec") or {}
    if doc.kind == "Pod":
        return spec, 1
    if doc.kind == "CronJob":
        spec = ((spec.get("jobTemplate") or {}).get("spec")) or {}
    template = (spec.get("template") or {}).get("spec") or {}
    if doc.kind in ("Job", "CronJob"):
        parallelism = spec.get("parallelism", 1)
        completions = spec.get("completions")
        count = min(parallelism, completions) if isinstance(completions, int) else parallelism
    elif doc.kind == "DaemonSet":
        count = 1  # a prototype: the planner makes one pod per node
    else:
        count = spec.get("replicas", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise UserError(f"{doc.source()}: spec: replicas/parallelism must be a non-negative integer")
    if count > MAX_WORKLOAD_PODS:
        raise UserError(f"{doc.source()}: spec: {count} pods at once is more than a Kubernetes cluster runs "
                        f"({MAX_WORKLOAD_PODS}); write the replica count the workload will really have")
    return template, count


def _class_names(spec: Any) -> set[str]:
    """Every deviceClassName a claim spec asks for (exactly and firstAvailable requests)."""
    names: set[str] = set()
    requests = ((spec or {}).get("devices") or {}).get("requests") or [] if isinstance(spec, dict) else []
    for req in requests if isinstance(requests, list) else []:
        if not isinstance(req, dict):
            continue
        alternatives = req.get("firstAvailable")
        for raw in [req.get("exactly") or req, *(alternatives if isinstance(alternatives, list) else [])]:
            if isinstance(raw, dict) and isinstance(raw.get("deviceClassName"), str):
                names.add(raw["deviceClassName"])
    return names


def extended_resource_classes(docs: list[_Doc]) -> dict[str, str]:
    """Extended resource name -> DeviceClass, as the DRAExtendedResource scheduler maps them: a class's
    spec.extendedResourceName, and deviceclass.resource.kubernetes.io/<class> for every class."""
    out: dict[str, str] = {}
    for doc in docs:
        if doc.kind == "DeviceClass" and doc.obj.get("apiVersion") in RESOURCE_API_VERSIONS:
            out[f"{DEVICE_CLASS_RESOURCE_PREFIX}{doc.name}"] = doc.name
            name = (doc.obj.get("spec") or {}).get("extendedResourceName")
            if isinstance(name, str):
                out[name] = doc.name
    return out


def _whole_number(container: dict, name: str, value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        raise UserError(f"container {shown(container.get('name'))}: resources {shown(name)}: {shown(value)} is not "
                        "a whole number of devices") from None


def _asked(container: Any) -> dict:
    resources = (container or {}).get("resources") or {} if isinstance(container, dict) else {}
    # An extended resource's request defaults to its limit.
    return {**(resources.get("limits") or {}), **(resources.get("requests") or {})}


class _ExtendedResourceNames:
    """Every extended resource name, as the scheduler tells them (k8s.io/apimachinery/pkg/apis/core/helper
    IsExtendedResourceName): a prefixed name outside the kubernetes.io namespaces, not a quota `requests.` name.
    A pod asking for one that no device plugin or DeviceClass serves stays Pending: it is planned (and refused),
    never dropped."""

    def __contains__(self, name: object) -> bool:
        return (isinstance(name, str) and "/" in name and not name.startswith("requests.")
                and not name.split("/", 1)[0].endswith("kubernetes.io"))


def extended_resource_counts(pod_spec: dict, planned: Container[str]) -> dict[str, int]:
    """The pod's requests of the `planned` extended resources as the scheduler counts them
    (k8s.io/component-helpers/resource PodRequests): the sum over its containers, and at least what any init
    container needs while it runs; a sidecar (an init container with restartPolicy Always) keeps its share for
    the pod's life, so it is added to the sum and to every init container started after it."""
    total: dict[str, int] = {}
    for container in pod_spec.get("containers") or []:
        for name, value in _asked(container).items():
            if name in planned:
                total[name] = total.get(name, 0) + _whole_number(container, name, value)
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for container in pod_spec.get("initContainers") or []:
        own = {name: _whole_number(container, name, value) for name, value in _asked(container).items()
               if name in planned}
        if isinstance(container, dict) and container.get("restartPolicy") == "Always":
            for name, count in own.items():
                total[name] = total.get(name, 0) + count
                sidecars[name] = sidecars.get(name, 0) + count
            running = dict(sidecars)
        else:
            running = {name: own.get(name, 0) + sidecars.get(name, 0) for name in {*own, *sidecars}}
        for name, count in running.items():
            init_peak[name] = max(init_peak.get(name, 0), count)
    counts = {name: max(total.get(name, 0), init_peak.get(name, 0)) for name in {*total, *init_peak}}
    return {name: counts[name] for name in sorted(counts) if counts[name] > 0}


def _extended_resource_requests(pod_spec: dict, classes: dict[str, str]) -> list[tuple[str, dict]]:
    """The requests of the claim the 1.36 scheduler writes for a pod's extended resources backed by DRA, each
    with its resource: one per container and resource, named container-<index>-request-<index in the
    container's sorted requests> (pkg/scheduler/framework/plugins/dynamicresources/extendeddynamicresources.go).
    Init containers are counted in the index but their devices are not modelled."""
    requests = []
    offset = len(pod_spec.get("initContainers") or [])
    for i, container in enumerate(pod_spec.get("containers") or []):
        asked = _asked(container)
        names = sorted(asked)
        for name in names:
            if name not in classes:
                continue
            count = _whole_number(container, name, asked[name])
            if count > 0:
                requests.append((name, {"name": f"container-{offset + i}-request-{names.index(name)}",
                                        "exactly": {"deviceClassName": classes[name], "count": count}}))
    return requests


def load_manifests(paths: list[Path], env: CelEnvironment, builtin_classes: tuple[DeviceClassDefinition, ...] = (),
                   external_classes: dict[str, str] | None = None, compute_domains: str | None = None,
                   extended_resources: bool = False) -> Manifests:
    """Parse every DeviceClass, claim, template and claim-using workload in the files.

    `builtin_classes` are the cluster's own DeviceClasses (a class in the files replaces one of them).
    A claim asking for one of `external_classes` (class name -> who serves it) is left out of the plan and
    said so in `Manifests.skipped`: its devices come from a controller eks-dra does not simulate. With
    `compute_domains` (who serves them), the channel ResourceClaimTemplate that a ComputeDomain in the files
    names is that controller's too: a pod's claim of it is reported, the pod's other claims are planned.

    A pod asking for a device plugin's extended resource (nvidia.com/gpu: 2) is planned with it, claims or
    not: PlanPod.extended_resources. With `extended_resources` (the DRAExtendedResource gate, on from 1.36) a
    pod that asks for a DeviceClass's extended resource also gets the claim the scheduler would write for it,
    used on nodes where no device plugin advertises the resource.
    """
    docs = read_documents(paths)
    skipped: list[str] = []
    skipped_refs: set[tuple[str, str, str]] = set()  # (kind, namespace, name)
    external_classes = external_classes or {}
    loader = _Loader(env)
    for definition in builtin_classes:
        source = Source("built-in", "DeviceClass", definition.name, None)
        where = f"{source}: spec.selectors[0].cel.expression"
        loader.classes[definition.name] = DeviceClass(definition.name, (env.compile(definition.expression, where),),
                                                      source)
    extended_classes = extended_resource_classes(docs) if extended_resources else {}
    if extended_resources:
        for definition in builtin_classes:  # a class in the files replaces a built-in one of the same name
            extended_classes.setdefault(f"{DEVICE_CLASS_RESOURCE_PREFIX}{definition.name}", definition.name)
            if definition.extended_resource_name and definition.extended_resource_name not in extended_classes:
                extended_classes[definition.extended_resource_name] = definition.name
    for doc in docs:  # classes first: claims may come before their class in the files
        if doc.kind == "DeviceClass" and doc.obj.get("apiVersion") in RESOURCE_API_VERSIONS:
            loader.device_class(doc)
    channels = {} if compute_domains is None else {
        (d.namespace, ((d.obj.get("spec") or {}).get("channel") or {}).get("resourceClaimTemplate", {}).get("name")): d
        for d in docs if d.kind == COMPUTE_DOMAIN_KIND and d.obj.get("apiVersion") == COMPUTE_DOMAIN_API_VERSION}
    namespaces_with_admin = {d.name for d in docs if d.kind == "Namespace"
                             and (d.meta.get("labels") or {}).get(ADMIN_ACCESS_LABEL) == "true"}
    known_namespaces = {d.name for d in docs if d.kind == "Namespace"}

    claims: dict[tuple[str, str], tuple[_Doc, PlanClaim]] = {}
    templates: dict[tuple[str, str], tuple[_Doc, ClaimSpec]] = {}
    for doc in docs:
        api = str(doc.obj.get("apiVersion", ""))
        if doc.kind not in ("ResourceClaim", "ResourceClaimTemplate"):
            continue
        if api not in RESOURCE_API_VERSIONS:
            raise UserError(f"{doc.source()}: apiVersion {shown(api)} is not one of {', '.join(RESOURCE_API_VERSIONS)}")
        loader._unique(doc, namespaced=True)
        where = str(doc.source())
        raw_spec = doc.obj.get("spec") if doc.kind == "ResourceClaim" else (doc.obj.get("spec") or {}).get("spec")
        external = sorted(_class_names(raw_spec) & set(external_classes))
        if external:
            skipped.append(f"{where}: not planned: DeviceClass {external[0]} is served by "
                           f"{external_classes[external[0]]}, whose devices eks-dra does not simulate")
            skipped_refs.add((doc.kind, doc.namespace, doc.name))
            continue
        if doc.kind == "ResourceClaim":
            spec = loader.claim_spec(doc.obj.get("spec"), where, "spec", api)
            claims[(doc.namespace, doc.name)] = (doc, PlanClaim(doc.name, doc.namespace, spec, doc.source()))
        else:
            inner = _Loader._mapping(doc.obj.get("spec"), f"{where}: spec")
            spec = loader.claim_spec(inner.get("spec"), where, "spec.spec", api)
            templates[(doc.namespace, doc.name)] = (doc, spec)
        for req in spec.requests:
            for alt in req.alternatives:
                if alt.admin_access and doc.namespace in known_namespaces \
                        and doc.namespace not in namespaces_with_admin:
                    raise UserError(f"{where}: {alt.field}.adminAccess: namespace {doc.namespace} needs the label "
                                    f"{ADMIN_ACCESS_LABEL}: \"true\" for admin access")

    # Pods in document order; each unreferenced claim or template stands in as one implicit pod.
    units: list[tuple[int, PlanPod]] = []
    manifests = Manifests()
    used_claims: set[tuple[str, str]] = set()
    used_templates: set[tuple[str, str]] = set()
    unplanned_templates: set[tuple[str, str]] = set()  # used by workloads whose pods are not planned
    for doc, group in _pod_groups(docs, manifests):
        if group is None:
            unplanned_templates.update((doc.namespace, t) for t in template_names(doc.obj))
            continue
        pod_spec = group.spec
        where = f"{doc.source()}: {group.path}"
        entries = _Loader._list(pod_spec.get("resourceClaims") or [], f"{where}.resourceClaims")
        try:
            extended = _extended_resource_requests(pod_spec, extended_classes) if extended_classes else []
            extended_counts = extended_resource_counts(pod_spec, _ExtendedResourceNames())
        except UserError as exc:
            raise UserError(f"{where}: {exc}") from None
        extended_spec = replace(loader.claim_spec({"devices": {"requests": [r for _, r in extended]}}, where,
                                                  "extended resources", "resource.k8s.io/v1"),
                                served_resources=tuple(name for name, _ in extended)) if extended else None
        if not entries and extended_spec is None and not extended_counts:
            continue
        # only well-formed references here: the entries are checked one by one below, with their field named
        refs = {("ResourceClaim" if "resourceClaimName" in e else "ResourceClaimTemplate", doc.namespace,
                 e.get("resourceClaimName") or e.get("resourceClaimTemplateName"))
                for e in entries if isinstance(e, dict)
                and isinstance(e.get("resourceClaimName") or e.get("resourceClaimTemplateName"), str)}
        if refs & skipped_refs:
            skipped.append(f"{doc.source()}: not planned: it uses a claim left out of the plan")
            unplanned_templates.update((doc.namespace, t) for t in template_names(doc.obj))
            continue
        for i, pod_name in enumerate(group.names):
            pod_claims: list[PlanClaim] = []
            if extended_spec is not None:
                pod_claims.append(PlanClaim(f"{pod_name}-extended-resources", doc.namespace, extended_spec,
                                            doc.source()))
            daemon_templates: list[tuple[str, ClaimSpec, Source]] = []
            for j, entry in enumerate(_Loader._list(entries, f"{where}.resourceClaims")):
                entry = _Loader._mapping(entry, f"{where}.resourceClaims[{j}]")
                claim_name, template_name = entry.get("resourceClaimName"), entry.get("resourceClaimTemplateName")
                if (claim_name is None) == (template_name is None):
                    raise UserError(f"{where}.resourceClaims[{j}]: set exactly one of resourceClaimName or "
                                    "resourceClaimTemplateName")
                if claim_name is not None:
                    _object_name(claim_name, f"{where}.resourceClaims[{j}].resourceClaimName")
                    found = claims.get((doc.namespace, claim_name))
                    if found is None:
                        raise UserError(f"{where}.resourceClaims[{j}].resourceClaimName: ResourceClaim "
                                        f"{doc.namespace}/{claim_name} is not in the given files")
                    used_claims.add((doc.namespace, claim_name))
                    if found[1] not in pod_claims:
                        pod_claims.append(found[1])
                elif (doc.namespace, _object_name(template_name, f"{where}.resourceClaims[{j}]"
                                                                 ".resourceClaimTemplateName")) in channels:
                    if i == 0:
                        domain = channels[(doc.namespace, template_name)]
                        skipped.append(f"{doc.source()}: claim {entry.get('name')} (ResourceClaimTemplate "
                                       f"{template_name}, the channel of ComputeDomain {domain.name}) is served by "
                                       f"{compute_domains}; not simulated")
                else:
                    found_t = templates.get((doc.namespace, template_name))
                    if found_t is None:
                        raise UserError(f"{where}.resourceClaims[{j}].resourceClaimTemplateName: "
                                        f"ResourceClaimTemplate {doc.namespace}/{template_name} is not in the given files")
                    used_templates.add((doc.namespace, template_name))
                    tdoc, tspec = found_t
                    if doc.kind == "DaemonSet":
                        daemon_templates.append((str(entry.get("name")), tspec, tdoc.source()))
                    else:
                        pod_claims.append(PlanClaim(f"{pod_name}-{entry.get('name')}", doc.namespace, tspec,
                                                    tdoc.source()))
            pod = PlanPod(pod_name, doc.namespace, pod_claims, doc.source(),
                          node_selector={str(k): str(v) for k, v in (pod_spec.get("nodeSelector") or {}).items()},
                          affinity_terms=_affinity(pod_spec, where),
                          tolerations=_tolerations(pod_spec.get("tolerations"), where),
                          node_name=pod_spec.get("nodeName") if doc.kind == "Pod" else None,
                          daemon_templates=tuple(daemon_templates) if doc.kind == "DaemonSet" else None,
                          gang=group.gang, extended_resources=extended_counts)
            units.append((doc.order, pod))
    for key, (doc, claim) in claims.items():
        if key not in used_claims:
            units.append((doc.order, PlanPod(claim.name, claim.namespace, [claim], doc.source(), implicit=True)))
    for key, (doc, tspec) in templates.items():
        if key not in used_templates and key not in unplanned_templates:
            claim = PlanClaim(doc.name, doc.namespace, tspec, doc.source())
            units.append((doc.order, PlanPod(doc.name, doc.namespace, [claim], doc.source(), implicit=True)))
    units.sort(key=lambda u: u[0])
    manifests.classes, manifests.pods = loader.classes, [pod for _, pod in units]
    manifests.skipped.extend(skipped)
    return manifests
