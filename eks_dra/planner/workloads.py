"""The pods that ML workload controllers create: for each object, (pod template spec, pod names, gang).

One function per controller family maps a validated object (crd_schema) to PodGroups. Pod names follow the
controller's own naming where it is deterministic; where the controller adds a random suffix (a Job's pods,
RayCluster pods) the index stands in for it. Counts are the pods running at once:
- Kubeflow PyTorchJob/TFJob/XGBoostJob (kubeflow.org/v1) and MPIJob (kubeflow.org/v2beta1): each replica
  type's `replicas` (default 1), pods <job>-<type>-<index>; one gang, min runPolicy.schedulingPolicy.minAvailable.
- JobSet: replicatedJobs[].replicas Jobs of min(parallelism, completions) pods, <set>-<job>-<jobIdx>-<podIdx>;
  the whole JobSet is one gang (it fails when any Job cannot run).
- LeaderWorkerSet: `replicas` groups of `size` pods, leader <lws>-<group>, workers <lws>-<group>-<index>;
  each group is a gang.
- RayCluster/RayJob: the head and each worker group's replicas clamped to [minReplicas, maxReplicas], times
  numOfHosts (the plan's warnings say which count); no gang.
- Volcano Job: tasks[].replicas, <job>-<task>-<index>; one gang, min spec.minAvailable.
- Kubeflow Trainer TrainJob: its (Cluster)TrainingRuntime's JobSet template, the trainer Job `numNodes` wide.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from eks_dra.devices.names import COMPUTE_DOMAIN_KIND
from eks_dra.errors import UserError

from .crd_schema import validate
from .model import Gang


@dataclass(frozen=True)
class PodGroup:
    """Pods a controller creates from one pod template."""

    spec: dict  # the template's pod spec
    names: tuple[str, ...]
    path: str  # field path of the pod spec, for messages
    gang: Gang | None = None
    note: str | None = None  # how the pod count was chosen, where the object gives more than one count


class NotPlanned(Exception):  # noqa: N818 - a result, not an error: the object is reported, not refused
    """The object is understood but its pods cannot be planned from the files (e.g. its runtime is missing)."""


@dataclass(frozen=True)
class Workload:
    version: str  # the apiVersion planned (its schema is vendored)
    release: str  # whose CRD schema, for messages
    expand: Callable[..., list[PodGroup]]


@dataclass(frozen=True)
class Target:
    obj: dict
    kind: str
    name: str
    namespace: str
    where: str  # "file: Kind ns/name"

    def gang(self, size: int, min_available: int | None) -> Gang:
        return Gang(f"{self.kind} {self.namespace}/{self.name}", size, size if min_available is None else min_available)


def _count(value: object, default: int, where: str) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserError(f"{where}: must be a non-negative integer")
    return value


def _pod_spec(template: object) -> dict:
    spec = template.get("spec") if isinstance(template, dict) else None
    return spec if isinstance(spec, dict) else {}


def _with_gang(groups: list[PodGroup], gang: Gang) -> list[PodGroup]:
    return [replace(g, gang=gang) for g in groups]


def _total(groups: list[PodGroup]) -> int:
    return sum(len(g.names) for g in groups)


# --- the controllers ---------------------------------------------------------------------------------------

REPLICA_SPECS = {"PyTorchJob": "pytorchReplicaSpecs", "TFJob": "tfReplicaSpecs", "XGBoostJob": "xgbReplicaSpecs",
                 "MPIJob": "mpiReplicaSpecs"}


def kubeflow_job(t: Target, _runtimes: dict) -> list[PodGroup]:
    """training-operator and mpi-operator: spec.<kind>ReplicaSpecs.<type>.{replicas, template}; pods are named
    <job>-<lower-case type>-<index> (pkg/common/util GenGeneralName)."""
    field = REPLICA_SPECS[t.kind]
    spec = t.obj.get("spec") or {}
    groups = []
    for role, replica in (spec.get(field) or {}).items():
        path = f"spec.{field}.{role}"
        count = _count((replica or {}).get("replicas"), 1, f"{t.where}: {path}.replicas")
        names = tuple(f"{t.name}-{role.lower()}-{i}" for i in range(count))
        groups.append(PodGroup(_pod_spec((replica or {}).get("template")), names, f"{path}.template.spec"))
    policy = ((spec.get("runPolicy") or {}).get("schedulingPolicy") or {})
    return _with_gang(groups, t.gang(_total(groups), policy.get("minAvailable")))


def _jobset_groups(t: Target, spec: dict, path: str, node_job_pods: int | None = None) -> list[PodGroup]:
    groups = []
    for i, rjob in enumerate(spec.get("replicatedJobs") or []):
        rpath = f"{path}.replicatedJobs[{i}]"
        job = (rjob.get("template") or {}).get("spec") or {}
        replicas = _count(rjob.get("replicas"), 1, f"{t.where}: {rpath}.replicas")
        if node_job_pods is not None and _is_trainer_job(rjob):
            pods = node_job_pods
        else:
            parallelism = _count(job.get("parallelism"), 1, f"{t.where}: {rpath}.template.spec.parallelism")
            completions = job.get("completions")
            pods = min(parallelism, completions) if isinstance(completions, int) else parallelism
        for j in range(replicas):
            names = tuple(f"{t.name}-{rjob.get('name')}-{j}-{k}" for k in range(pods))
            groups.append(PodGroup(_pod_spec(job.get("template")), names, f"{rpath}.template.spec.template.spec"))
    return groups


def jobset(t: Target, _runtimes: dict) -> list[PodGroup]:
    """A JobSet's pods; the JobSet fails as a whole when one of its Jobs fails, so it is one gang."""
    groups = _jobset_groups(t, t.obj.get("spec") or {}, "spec")
    return _with_gang(groups, t.gang(_total(groups), None))


def leader_worker_set(t: Target, _runtimes: dict) -> list[PodGroup]:
    """`replicas` groups: leader <lws>-<g> from leaderTemplate (workerTemplate when absent), size-1 workers
    <lws>-<g>-<1..size-1> (the leader StatefulSet and one worker StatefulSet per group)."""
    spec = t.obj.get("spec") or {}
    lwt = spec.get("leaderWorkerTemplate") or {}
    replicas = _count(spec.get("replicas"), 1, f"{t.where}: spec.replicas")
    size = _count(lwt.get("size"), 1, f"{t.where}: spec.leaderWorkerTemplate.size")
    leader_field = "leaderTemplate" if lwt.get("leaderTemplate") else "workerTemplate"
    groups = []
    for g in range(replicas):
        gang = Gang(f"{t.kind} {t.namespace}/{t.name} group {g}", size, size)
        groups.append(PodGroup(_pod_spec(lwt.get(leader_field)), (f"{t.name}-{g}",),
                               f"spec.leaderWorkerTemplate.{leader_field}.spec", gang))
        if size > 1:
            groups.append(PodGroup(_pod_spec(lwt.get("workerTemplate")),
                                   tuple(f"{t.name}-{g}-{w}" for w in range(1, size)),
                                   "spec.leaderWorkerTemplate.workerTemplate.spec", gang))
    return groups


RAY_MAX_REPLICAS = 2**31 - 1  # the CRD's maxReplicas default (math.MaxInt32)


def _ray_groups(t: Target, spec: dict, path: str) -> list[PodGroup]:
    """The head and the worker groups. A group runs replicas clamped to [minReplicas, maxReplicas] (maxReplicas
    when minReplicas is above it; 0 when suspended), times numOfHosts: KubeRay's GetWorkerGroupDesiredReplicas
    (ray-operator/controllers/ray/utils/util.go). The autoscaler moves it within the bounds later; the plan
    says which count it used."""
    head = spec.get("headGroupSpec") or {}
    groups = [PodGroup(_pod_spec(head.get("template")), (f"{t.name}-head",), f"{path}.headGroupSpec.template.spec")]
    for i, group in enumerate(spec.get("workerGroupSpecs") or []):
        gpath = f"{path}.workerGroupSpecs[{i}]"
        minimum = _count(group.get("minReplicas"), 0, f"{t.where}: {gpath}.minReplicas")
        maximum = _count(group.get("maxReplicas"), RAY_MAX_REPLICAS, f"{t.where}: {gpath}.maxReplicas")
        replicas = _count(group.get("replicas"), 0, f"{t.where}: {gpath}.replicas")
        hosts = _count(group.get("numOfHosts"), 1, f"{t.where}: {gpath}.numOfHosts")
        if group.get("suspend") is True:
            desired, why = 0, "suspend is true"
        elif minimum > maximum:
            desired, why = maximum, f"maxReplicas {maximum}, as minReplicas {minimum} is above it"
        elif replicas < minimum:
            desired, why = minimum, f"minReplicas {minimum}, as replicas {replicas} is below it"
        elif replicas > maximum:
            desired, why = maximum, f"maxReplicas {maximum}, as replicas {replicas} is above it"
        else:
            desired, why = replicas, f"replicas {replicas} (minReplicas {minimum}, maxReplicas {maximum})"
        names = tuple(f"{t.name}-{group.get('groupName')}-worker-{k}" for k in range(desired * hosts))
        hosts_note = f", times numOfHosts {hosts}" if hosts != 1 else ""
        note = f"{t.where}: {gpath} ({group.get('groupName')}): {len(names)} worker pods planned: {why}{hosts_note}"
        groups.append(PodGroup(_pod_spec(group.get("template")), names, f"{gpath}.template.spec", note=note))
    return groups


def ray_cluster(t: Target, _runtimes: dict) -> list[PodGroup]:
    return _ray_groups(t, t.obj.get("spec") or {}, "spec")


def ray_job(t: Target, _runtimes: dict) -> list[PodGroup]:
    """The RayCluster a RayJob creates from spec.rayClusterSpec (none when it names an existing cluster)."""
    spec = t.obj.get("spec") or {}
    if not spec.get("rayClusterSpec"):
        return []
    return _ray_groups(t, spec["rayClusterSpec"], "spec.rayClusterSpec")


def volcano_job(t: Target, _runtimes: dict) -> list[PodGroup]:
    """tasks[].replicas pods <job>-<task>-<index>; the PodGroup needs spec.minAvailable (default: all)."""
    spec = t.obj.get("spec") or {}
    groups = []
    for i, task in enumerate(spec.get("tasks") or []):
        path = f"spec.tasks[{i}]"
        count = _count(task.get("replicas"), 0, f"{t.where}: {path}.replicas")
        names = tuple(f"{t.name}-{task.get('name')}-{k}" for k in range(count))
        groups.append(PodGroup(_pod_spec(task.get("template")), names, f"{path}.template.spec"))
    return _with_gang(groups, t.gang(_total(groups), spec.get("minAvailable")))


TRAINER_STEP_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"


def _is_trainer_job(rjob: dict) -> bool:
    """The replicated Job that numNodes sizes: labelled as the trainer step (named `node` in the runtimes)."""
    labels = ((rjob.get("template") or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(TRAINER_STEP_LABEL) == "trainer" or rjob.get("name") == "node"


def train_job(t: Target, runtimes: dict) -> list[PodGroup]:
    """The JobSet the trainer builds from the runtime's spec.template, named like the TrainJob; the trainer Job
    runs spec.trainer.numNodes pods (else the runtime's mlPolicy.numNodes). The whole JobSet is one gang."""
    spec = t.obj.get("spec") or {}
    ref = spec.get("runtimeRef") or {}
    kind = ref.get("kind") or "ClusterTrainingRuntime"
    key = (kind, "" if kind == "ClusterTrainingRuntime" else t.namespace, ref.get("name"))
    runtime = runtimes.get(key)
    if runtime is None:
        scope = "" if kind == "ClusterTrainingRuntime" else f"{t.namespace}/"
        raise NotPlanned(f"{t.where}: its pods are not planned: {kind} {scope}{ref.get('name')} (spec.runtimeRef) "
                         "is not in the given files; add the runtime's manifest")
    rspec = runtime.get("spec") or {}
    nodes = (spec.get("trainer") or {}).get("numNodes")
    if nodes is None:
        nodes = (rspec.get("mlPolicy") or {}).get("numNodes", 1)
    nodes = _count(nodes, 1, f"{t.where}: spec.trainer.numNodes")
    template = (rspec.get("template") or {}).get("spec") or {}
    groups = _jobset_groups(t, template, f"{kind} {ref.get('name')}: spec.template.spec", node_job_pods=nodes)
    return _with_gang(groups, t.gang(_total(groups), None))


_KUBEFLOW = "kubeflow/training-operator v1.9.0"
WORKLOADS: dict[tuple[str, str], Workload] = {
    ("kubeflow.org", "PyTorchJob"): Workload("kubeflow.org/v1", _KUBEFLOW, kubeflow_job),
    ("kubeflow.org", "TFJob"): Workload("kubeflow.org/v1", _KUBEFLOW, kubeflow_job),
    ("kubeflow.org", "XGBoostJob"): Workload("kubeflow.org/v1", _KUBEFLOW, kubeflow_job),
    ("kubeflow.org", "MPIJob"): Workload("kubeflow.org/v2beta1", "kubeflow/mpi-operator v0.6.0", kubeflow_job),
    ("jobset.x-k8s.io", "JobSet"): Workload("jobset.x-k8s.io/v1alpha2", "kubernetes-sigs/jobset v0.8.2", jobset),
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): Workload(
        "leaderworkerset.x-k8s.io/v1", "kubernetes-sigs/lws v0.7.0", leader_worker_set),
    ("ray.io", "RayCluster"): Workload("ray.io/v1", "ray-project/kuberay v1.4.2", ray_cluster),
    ("ray.io", "RayJob"): Workload("ray.io/v1", "ray-project/kuberay v1.4.2", ray_job),
    ("batch.volcano.sh", "Job"): Workload("batch.volcano.sh/v1alpha1", "volcano.sh/apis v1.12.2", volcano_job),
    ("trainer.kubeflow.org", "TrainJob"): Workload("trainer.kubeflow.org/v1alpha1", "kubeflow/trainer v2.0.1",
                                                   train_job),
}
# Objects read for other workloads' sake (validated, never planned themselves).
RUNTIME_KINDS = {("trainer.kubeflow.org", "TrainingRuntime"), ("trainer.kubeflow.org", "ClusterTrainingRuntime")}


# Kinds that create no pods: skipped without a word unless they hold a pod template.
NON_WORKLOAD_KINDS = frozenset({
    "Namespace", "Service", "Endpoints", "EndpointSlice", "ConfigMap", "Secret", "ServiceAccount", "Role",
    "RoleBinding", "ClusterRole", "ClusterRoleBinding", "NetworkPolicy", "Ingress", "IngressClass",
    "PersistentVolume", "PersistentVolumeClaim", "StorageClass", "CSIDriver", "PriorityClass",
    "PodDisruptionBudget", "LimitRange", "ResourceQuota", "HorizontalPodAutoscaler", "RuntimeClass", "Lease",
    "CustomResourceDefinition", "APIService", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding", "DeviceClass", "ResourceClaim", "ResourceClaimTemplate", "ResourceSlice",
    "DeviceTaintRule", COMPUTE_DOMAIN_KIND, "Node", "Event", "PodTemplate",
})


def has_pod_template(value: object) -> bool:
    if isinstance(value, dict):
        return isinstance(value.get("containers"), list) or any(has_pod_template(v) for v in value.values())
    return isinstance(value, list) and any(has_pod_template(v) for v in value)


def template_names(value: object) -> set[str]:
    """Every resourceClaimTemplateName in an object, wherever its pod templates are."""
    if isinstance(value, dict):
        found = {value["resourceClaimTemplateName"]} if isinstance(value.get("resourceClaimTemplateName"), str) \
            else set()
        return found.union(*(template_names(v) for v in value.values()))
    return set().union(*(template_names(v) for v in value)) if isinstance(value, list) else set()


def group_of(api_version: str) -> str:
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def check(obj: dict, kind: str, api_version: str, where: str) -> Workload | None:
    """The workload (or runtime) the object is, validated against its CRD schema; None when it is neither."""
    group = group_of(api_version)
    workload = WORKLOADS.get((group, kind))
    if (group, kind) in RUNTIME_KINDS:
        workload = Workload("trainer.kubeflow.org/v1alpha1", "kubeflow/trainer v2.0.1", train_job)
    if workload is None:
        return None
    if api_version != workload.version:
        raise UserError(f"{where}: apiVersion {api_version} is not planned; eks-dra reads {kind} "
                        f"{workload.version} ({workload.release}): convert the object to that version")
    validate(obj, group, kind, where, workload.release)
    return workload


def expand(obj: dict, workload: Workload, kind: str, name: str, namespace: str, where: str,
           runtimes: dict[tuple[str, str, str], dict]) -> list[PodGroup]:
    """The object's pods; raises NotPlanned when they cannot be known from the files."""
    return workload.expand(Target(obj, kind, name, namespace, where), runtimes)
