"""One eks-dra DRA driver on the cluster: its identity, its least privileges and its kubelet-plugin DaemonSet.

`SystemNamespaceChart` holds the namespace the drivers share; `DriverChart` is one device family's driver
(ServiceAccount, ClusterRole + binding, an Events Role + binding, two ValidatingAdmissionPolicies + bindings,
and one DaemonSet per privilege level its node groups need). Charts know nothing of the environment: the
composition (eks_dra/stacks/manifests.py) passes a `DriverSettings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import cdk8s
from cdk8s_plus_34 import k8s
from constructs import Construct

from eks_dra.drivers.framework.events import EVENTS_NAMESPACE
from eks_dra.drivers.framework.hosttree import BOOT_ID

from . import labels
from .network_policy import DriverNetworkPolicy, MetricsScrapers

DEFAULT_IMAGE = "eks-dra-driver:0.1.0"
# Driver runtime contract (eks_dra/drivers/README.md, "Probes"): the health port each family's driver serves its liveness on.
HEALTH_PORTS = {"gpu": 51515, "efa": 51516, "neuron": 51517}
METRICS_PORTS = {"gpu": 51525, "efa": 51526, "neuron": 51527}
LIVENESS_PATH = "/livez"  # HTTP GET on the health port (eks_dra/drivers/framework/health.py says why HTTP)

KUBELET_PLUGINS_DIR = "/var/lib/kubelet/plugins"
KUBELET_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
CDI_ROOT = "/var/run/cdi"
HOST_ROOT = "/host"
CONTAINER_DRIVER_ROOT = "/driver-root"  # where the GPU plugin sees the NVIDIA driver root (as upstream's chart)
# What EFA and Neuron discovery and health read of the host (eks_dra/drivers/{efa,neuron}, framework/hosttree):
# sysfs, the device nodes and the boot id, each mounted read-only at its place under HOST_ROOT. Not the whole
# `/`: root without capabilities still reads root-only files (the kubelet's credentials, pods' tokens).
NARROW_HOST_TREE = (("host-sys", "sys", "Directory"), ("host-dev", "dev", "Directory"),
                    ("host-boot-id", str(BOOT_ID), "File"))
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"
# NodeSpec fields of k8s.io/api/core/v1 other than taints, and the ObjectMeta fields a client may change on
# update (the API server sets or freezes the rest): the node policy keeps all of them as they were.
NODE_SPEC_FIELDS = ("configSource", "externalID", "podCIDR", "podCIDRs", "providerID", "unschedulable")
NODE_METADATA_FIELDS = ("annotations", "finalizers", "generateName", "labels", "ownerReferences")
# A refused write is 403 Forbidden; without a reason the API server answers a failed validation with 422 Invalid.
DENIED = "Forbidden"


@dataclass(frozen=True)
class DriverNodeGroup:
    """One DRA node group of the driver's family, as its DaemonSets need to know it."""

    name: str  # the eks-dra.io/node-group label of its nodes
    # Bottlerocket: its enforcing SELinux policy keeps unprivileged containers (container_t) from writing host
    # paths such as the kubelet plugin and registry dirs; only a privileged plugin works there.
    selinux_enforcing: bool = False
    # The group's own taints (config nodeGroups[].taints) as (key, value, effect).
    taints: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True)
class DriverPlacement:
    """One DaemonSet of a driver: the node groups it runs on and whether its plugin is privileged."""

    name: str  # the DaemonSet's name and its pods' app.kubernetes.io/name
    privileged: bool
    affinity: k8s.Affinity
    taints: tuple[tuple[str, str, str], ...]  # the user taints of its node groups, tolerated exactly


@dataclass(frozen=True)
class DriverSettings:
    """What one driver's chart needs to know; defaults follow the driver runtime contract."""

    family: str  # gpu | efa | neuron
    driver_name: str  # e.g. gpu.nvidia.com
    image: str = DEFAULT_IMAGE
    namespace: str = labels.SYSTEM_NAMESPACE
    # Readiness taints of the other DRA drivers: a node with GPU and EFA starts with both taints, and each
    # driver must start while the other's taint is still there.
    other_readiness_taints: tuple[str, ...] = ()
    # The family's DRA node groups (empty: one unprivileged DaemonSet on every node of the family).
    node_groups: tuple[DriverNodeGroup, ...] = ()
    # gpu: the host path the NVIDIA driver is installed under (upstream chart's nvidiaDriverRoot): `/` on the
    # AL2023 NVIDIA AMI and Bottlerocket, /run/nvidia/driver with the GPU Operator's driver container.
    nvidia_driver_root: str = "/"
    # From the environment's Kubernetes version (eks_dra.versions): unhealthy devices as device taints
    # (DRADeviceTaints) and the kubelet's device-health stream (ResourceHealthStatus).
    device_taints: bool = False
    dra_health: bool = False
    # Who may reach the metrics port (the NetworkPolicy); nobody else reaches the pods over the network.
    metrics_scrapers: MetricsScrapers = field(default_factory=MetricsScrapers)

    @property
    def name(self) -> str:
        """Kubernetes name of the driver's objects: eks-dra-<family>-driver."""
        return f"eks-dra-{self.family}-driver"

    @property
    def service_account_user(self) -> str:
        """The username the API server gives the DaemonSet's pods (what the admission policies match)."""
        return f"system:serviceaccount:{self.namespace}:{self.name}"

    @property
    def health_port(self) -> int:
        return HEALTH_PORTS[self.family]

    @property
    def metrics_port(self) -> int:
        return METRICS_PORTS[self.family]

    @property
    def readiness_taint(self) -> str:
        return labels.readiness_taint_key(self.driver_name)

    def placements(self) -> list[DriverPlacement]:
        """The driver's DaemonSets. GPU: one, privileged (NVML opens /dev/nvidia*, which the device cgroup grants
        only to a privileged container). EFA and Neuron: an unprivileged one, and a privileged one
        (`<name>-privileged`) only for the node groups whose hosts need it, selected by eks-dra.io/node-group."""
        def taints(groups: tuple[DriverNodeGroup, ...]) -> tuple[tuple[str, str, str], ...]:
            return tuple(dict.fromkeys(t for g in groups for t in g.taints))

        dra = labels.MANAGER_DRA
        if self.family == "gpu":
            return [DriverPlacement(self.name, True, labels.manager_affinity(self.family, dra), taints(self.node_groups))]
        enforcing = tuple(g for g in self.node_groups if g.selinux_enforcing)
        plain = tuple(g for g in self.node_groups if not g.selinux_enforcing)
        names = tuple(g.name for g in enforcing)
        out = []
        if plain or not self.node_groups:
            out.append(DriverPlacement(self.name, False, labels.manager_affinity(self.family, dra, other_node_groups=names),
                                       taints(plain)))
        if enforcing:
            out.append(DriverPlacement(f"{self.name}-privileged", True,
                                       labels.manager_affinity(self.family, dra, node_groups=names), taints(enforcing)))
        return out


class SystemNamespaceChart(cdk8s.Chart):
    """The namespace every eks-dra driver runs in; applied before the driver charts."""

    def __init__(self, scope: Construct, id: str, *, namespace: str = labels.SYSTEM_NAMESPACE) -> None:
        super().__init__(scope, id, disable_resource_name_hashes=True)
        k8s.KubeNamespace(self, "namespace", metadata=k8s.ObjectMeta(
            name=namespace, labels={**labels.app_labels("eks-dra", "system"),
                                    # hostPath volumes and a privileged GPU plugin: the namespace must allow it.
                                    "pod-security.kubernetes.io/enforce": "privileged"}))


class DriverChart(cdk8s.Chart):
    """One family's DRA driver: least-privilege identity, admission guards and the kubelet-plugin DaemonSet."""

    def __init__(self, scope: Construct, id: str, *, settings: DriverSettings) -> None:
        super().__init__(scope, id, disable_resource_name_hashes=True)
        self.settings = settings
        s = settings
        meta_labels = labels.app_labels(s.name, "kubelet-plugin")
        self.service_account = k8s.KubeServiceAccount(
            self, "service-account", metadata=k8s.ObjectMeta(name=s.name, namespace=s.namespace, labels=meta_labels))
        self._rbac(meta_labels)
        self._slice_policy(meta_labels)
        self._taint_policy(meta_labels)
        self.daemon_sets = [self._daemon_set(p) for p in s.placements()]
        # one policy per DaemonSet, selecting exactly its pods (each DaemonSet's pods carry its own name)
        self.network_policies = [
            DriverNetworkPolicy(self, "network-policy" if p.name == s.name else f"network-policy-{p.name}",
                                name=p.name, namespace=s.namespace, pod_labels={"app.kubernetes.io/name": p.name},
                                metrics_port=s.metrics_port, scrapers=s.metrics_scrapers, labels=meta_labels)
            for p in s.placements()]

    # --- identity ---------------------------------------------------------------------------

    def _rbac(self, meta_labels: dict[str, str]) -> None:
        s = self.settings
        # Rule: exactly the calls of eks_dra/drivers/framework/kube.py (tests/test_charts_rbac.py derives them).
        rules = [
            # The driver lists, watches and writes its node's pool; the policy below keeps it to its own node.
            k8s.PolicyRule(api_groups=["resource.k8s.io"], resources=["resourceslices"],
                           verbs=["list", "watch", "create", "update", "delete"]),
            # Prepare and the reconciler read each claim by name; nothing lists the cluster's claims.
            k8s.PolicyRule(api_groups=["resource.k8s.io"], resources=["resourceclaims"], verbs=["get"]),
            # get: the Node's uid for slice ownerReferences; patch: its own readiness taint, narrowed by the
            # node admission policy to that one taint on its own node.
            k8s.PolicyRule(api_groups=[""], resources=["nodes"], verbs=["get", "patch"]),
            # Recovery after a lost checkpoint finds the claims in use here through this node's pods
            # (fieldSelector spec.nodeName), never through a cluster-wide claim list.
            k8s.PolicyRule(api_groups=[""], resources=["pods"], verbs=["list"]),
        ]
        subjects = [k8s.Subject(kind="ServiceAccount", name=s.name, namespace=s.namespace)]
        role = k8s.KubeClusterRole(self, "cluster-role",
                                   metadata=k8s.ObjectMeta(name=s.name, labels=meta_labels), rules=rules)
        k8s.KubeClusterRoleBinding(
            self, "cluster-role-binding", metadata=k8s.ObjectMeta(name=s.name, labels=meta_labels),
            role_ref=k8s.RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role.name),
            subjects=subjects,
        )
        # Warning Events on the Node (corrupt checkpoint, device withdrawn), created in the namespace where the
        # kubelet records Node events too, and nowhere else.
        events = k8s.KubeRole(self, "events-role",
                              metadata=k8s.ObjectMeta(name=s.name, namespace=EVENTS_NAMESPACE, labels=meta_labels),
                              rules=[k8s.PolicyRule(api_groups=[""], resources=["events"], verbs=["create"])])
        k8s.KubeRoleBinding(
            self, "events-role-binding",
            metadata=k8s.ObjectMeta(name=s.name, namespace=EVENTS_NAMESPACE, labels=meta_labels),
            role_ref=k8s.RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=events.name),
            subjects=subjects,
        )

    def _is_plugin(self) -> k8s.MatchCondition:
        return k8s.MatchCondition(
            name="is-driver-service-account",
            expression=f"request.userInfo.username == '{self.settings.service_account_user}'")

    @staticmethod
    def _node_name_variable() -> k8s.Variable:
        # Bound service-account tokens carry the pod's node (ServiceAccountTokenPodNodeInfo, on since 1.32).
        extra = f"request.userInfo.extra['{NODE_NAME_CLAIM}']"
        return k8s.Variable(
            name="userNodeName",
            expression=f"'{NODE_NAME_CLAIM}' in request.userInfo.extra && size({extra}) > 0 ? {extra}[0] : ''")

    def _policy(self, suffix: str, meta_labels: dict[str, str], rules: list[k8s.NamedRuleWithOperations],
                variables: list[k8s.Variable], validations: list[k8s.Validation]) -> None:
        name = f"{self.settings.name}-{suffix}"
        k8s.KubeValidatingAdmissionPolicy(
            self, f"{suffix}-policy", metadata=k8s.ObjectMeta(name=name, labels=meta_labels),
            spec=k8s.ValidatingAdmissionPolicySpec(
                failure_policy="Fail",
                match_constraints=k8s.MatchResources(resource_rules=rules),
                match_conditions=[self._is_plugin()],
                variables=variables,
                validations=validations,
            ))
        k8s.KubeValidatingAdmissionPolicyBinding(
            self, f"{suffix}-policy-binding", metadata=k8s.ObjectMeta(name=name, labels=meta_labels),
            spec=k8s.ValidatingAdmissionPolicyBindingSpec(policy_name=name, validation_actions=["Deny"]))

    def _slice_policy(self, meta_labels: dict[str, str]) -> None:
        """The plugin may write only ResourceSlices of its own node and its own driver."""
        s = self.settings
        self._policy(
            "slices", meta_labels,
            rules=[k8s.NamedRuleWithOperations(api_groups=["resource.k8s.io"], api_versions=["*"],
                                               operations=["CREATE", "UPDATE", "DELETE"],
                                               resources=["resourceslices"])],
            variables=[
                self._node_name_variable(),
                k8s.Variable(name="slice",
                             expression="request.operation == 'DELETE' ? oldObject : object"),
            ],
            validations=[
                k8s.Validation(reason=DENIED, expression="variables.userNodeName != ''",
                               message="no node is bound to this service account token; the driver must run in a "
                                       "pod on its node"),
                k8s.Validation(reason=DENIED, expression="(has(variables.slice.spec.nodeName) ? variables.slice.spec.nodeName : '') == "
                                          "variables.userNodeName",
                               message_expression="'this driver may only write ResourceSlices of node ' + "
                                                  "variables.userNodeName"),
                k8s.Validation(reason=DENIED, expression=f"variables.slice.spec.driver == '{s.driver_name}'",
                               message=f"this service account may only write ResourceSlices of driver {s.driver_name}"),
            ],
        )

    def _taint_policy(self, meta_labels: dict[str, str]) -> None:
        """The plugin may patch only its own Node, and only to add or remove its own NoSchedule readiness taint."""
        taint = self.settings.readiness_taint

        def unchanged(path: str) -> str:
            """CEL: `path` is absent on both sides, or present on both with the same value (any type)."""
            new, old = f"object.{path}", f"oldObject.{path}"
            return f"has({new}) == has({old}) && (!has({new}) || {new} == {old})"

        only_taint = f"this driver may only add or remove the taint {taint} of its own node"
        fields = [f"metadata.{f}" for f in NODE_METADATA_FIELDS] + [f"spec.{f}" for f in NODE_SPEC_FIELDS]
        others = f"(has(object.spec.taints) ? object.spec.taints : []).filter(t, t.key != '{taint}') == " \
                 f"(has(oldObject.spec.taints) ? oldObject.spec.taints : []).filter(t, t.key != '{taint}')"
        self._policy(
            "node-taint", meta_labels,
            rules=[k8s.NamedRuleWithOperations(api_groups=[""], api_versions=["v1"], operations=["UPDATE"],
                                               resources=["nodes"])],
            variables=[self._node_name_variable()],
            validations=[
                k8s.Validation(reason=DENIED, expression="variables.userNodeName != '' && object.metadata.name == "
                                          "variables.userNodeName",
                               message="this driver may only modify the node it runs on"),
                k8s.Validation(reason=DENIED, expression=others, message=only_taint),
                # NoExecute would evict every pod of the node: the readiness taint only keeps new pods away.
                k8s.Validation(reason=DENIED, expression=f"!has(object.spec.taints) || object.spec.taints.all(t, "
                                                         f"t.key != '{taint}' || t.effect == 'NoSchedule')",
                               message=f"the taint {taint} may only have the effect NoSchedule"),
                *(k8s.Validation(reason=DENIED, expression=unchanged(f), message=f"{only_taint}; it may not change {f}")
                  for f in fields),
            ],
        )

    # --- the kubelet plugin -----------------------------------------------------------------

    def _host_tree(self) -> list[tuple[str, str, str]]:
        """(volume name, host path relative to /, hostPath type) of the host tree the plugin reads under HOST_ROOT.
        GPU: all of `/` (its discovery also reads /proc/driver/nvidia and the MIG marker under /var/lib/eks-dra;
        a privileged container could reach all of it anyway)."""
        return [("host-root", "", "Directory")] if self.settings.family == "gpu" else list(NARROW_HOST_TREE)

    def _daemon_set(self, placement: DriverPlacement) -> k8s.KubeDaemonSet:
        s = self.settings
        meta_labels = labels.app_labels(placement.name, "kubelet-plugin")
        selector = {"app.kubernetes.io/name": placement.name}

        def host_path(name: str, path: str, kind: str) -> k8s.Volume:
            return k8s.Volume(name=name, host_path=k8s.HostPathVolumeSource(path=path, type=kind))

        volumes = [
            host_path("plugins", KUBELET_PLUGINS_DIR, "DirectoryOrCreate"),
            host_path("registry", KUBELET_REGISTRY_DIR, "Directory"),
            host_path("cdi", CDI_ROOT, "DirectoryOrCreate"),
        ]
        mounts = [
            # Sockets must have the same path inside the container and on the host (kubelet dials host paths).
            k8s.VolumeMount(name="plugins", mount_path=KUBELET_PLUGINS_DIR),
            k8s.VolumeMount(name="registry", mount_path=KUBELET_REGISTRY_DIR),
            k8s.VolumeMount(name="cdi", mount_path=CDI_ROOT),
        ]
        for name, path, kind in self._host_tree():
            volumes.append(host_path(name, f"/{path}", kind))
            # Read-only: the plugin writes only the three directories above. HostToContainer shows device nodes
            # (and sysfs entries) created after the container started; a single file needs no propagation.
            mounts.append(k8s.VolumeMount(name=name, mount_path=f"{HOST_ROOT}/{path}".rstrip("/"), read_only=True,
                                          mount_propagation=None if kind == "File" else "HostToContainer"))

        def field_env(name: str, path: str) -> k8s.EnvVar:
            return k8s.EnvVar(name=name, value_from=k8s.EnvVarSource(field_ref=k8s.ObjectFieldSelector(field_path=path)))

        env = [
            field_env("NODE_NAME", "spec.nodeName"),
            # Per-pod socket names let the new pod of a rolling update start beside the old one (maxSurge: 1).
            field_env("POD_UID", "metadata.uid"),
            k8s.EnvVar(name="HOST_ROOT", value=HOST_ROOT),
            k8s.EnvVar(name="KUBELET_PLUGINS_DIR", value=KUBELET_PLUGINS_DIR),
            k8s.EnvVar(name="KUBELET_REGISTRY_DIR", value=KUBELET_REGISTRY_DIR),
            k8s.EnvVar(name="CDI_ROOT", value=CDI_ROOT),
            k8s.EnvVar(name="HEALTH_PORT", value=str(s.health_port)),
            k8s.EnvVar(name="METRICS_PORT", value=str(s.metrics_port)),
            *([k8s.EnvVar(name="DEVICE_TAINTS", value="true")] if s.device_taints else []),
            *([k8s.EnvVar(name="DRA_HEALTH", value="true")] if s.dra_health else []),
        ]
        if s.family == "gpu":
            # NVML and nvidia-smi come from the host's driver root by explicit path; "void" keeps an nvidia
            # runtime from injecting GPUs into the plugin itself (the upstream chart does the same).
            volumes.append(host_path("driver-root", s.nvidia_driver_root, "Directory"))
            mounts.append(k8s.VolumeMount(name="driver-root", mount_path=CONTAINER_DRIVER_ROOT, read_only=True,
                                          mount_propagation="HostToContainer"))
            env += [k8s.EnvVar(name="NVIDIA_DRIVER_ROOT", value=s.nvidia_driver_root),
                    k8s.EnvVar(name="CONTAINER_DRIVER_ROOT", value=CONTAINER_DRIVER_ROOT),
                    k8s.EnvVar(name="NVIDIA_VISIBLE_DEVICES", value="void")]
        container = k8s.Container(
            name="plugin",
            image=s.image,
            image_pull_policy="IfNotPresent",
            command=["eks-dra-driver", s.family],
            args=[f"--driver-name={s.driver_name}"],
            env=env,
            # No hostNetwork: the surge pod of a rolling update binds the same ports beside the old pod.
            ports=[k8s.ContainerPort(name="health", container_port=s.health_port, protocol="TCP"),
                   k8s.ContainerPort(name="metrics", container_port=s.metrics_port, protocol="TCP")],
            liveness_probe=k8s.Probe(
                http_get=k8s.HttpGetAction(port=k8s.IntOrString.from_number(s.health_port), path=LIVENESS_PATH),
                initial_delay_seconds=10, period_seconds=10, timeout_seconds=5, failure_threshold=3),
            resources=k8s.ResourceRequirements(
                requests={"cpu": k8s.Quantity.from_string("50m"), "memory": k8s.Quantity.from_string("64Mi")},
                limits={"cpu": k8s.Quantity.from_string("500m"), "memory": k8s.Quantity.from_string("256Mi")},
            ),
            security_context=self._security_context(placement.privileged),
            volume_mounts=mounts,
            termination_message_policy="FallbackToLogsOnError",
        )
        return k8s.KubeDaemonSet(
            self, "daemon-set" if placement.name == s.name else f"daemon-set-{placement.name}",
            metadata=k8s.ObjectMeta(name=placement.name, namespace=s.namespace, labels=meta_labels),
            spec=k8s.DaemonSetSpec(
                selector=k8s.LabelSelector(match_labels=selector),
                update_strategy=k8s.DaemonSetUpdateStrategy(
                    type="RollingUpdate",
                    rolling_update=k8s.RollingUpdateDaemonSet(max_surge=k8s.IntOrString.from_number(1),
                                                              max_unavailable=k8s.IntOrString.from_number(0))),
                template=k8s.PodTemplateSpec(
                    metadata=k8s.ObjectMeta(labels={**meta_labels, **selector}),
                    spec=k8s.PodSpec(
                        service_account_name=s.name,
                        priority_class_name="system-node-critical",
                        affinity=placement.affinity,
                        # The node groups' own taints exactly (key, value and effect): a taint an operator adds
                        # by hand with the same key and another value still keeps the driver away, as meant.
                        tolerations=[*labels.accelerator_tolerations(),
                                     *(labels.tolerate(t) for t in dict.fromkeys((s.readiness_taint,
                                                                                  *s.other_readiness_taints))),
                                     *(labels.tolerate_exactly(*t) for t in placement.taints)],
                        containers=[container],
                        volumes=volumes,
                        termination_grace_period_seconds=30,
                    ),
                ),
            ),
        )

    @staticmethod
    def _security_context(privileged: bool) -> k8s.SecurityContext:
        if privileged:
            # GPU: NVML opens /dev/nvidiactl and /dev/nvidia<N> for discovery, XID/ECC health events and the
            # time-slicing setting; the container's device cgroup grants those nodes only to a privileged
            # container (no capability does). Bottlerocket: only a privileged container may create the
            # kubelet sockets and CDI specs in host paths. Root owns those directories in both cases.
            return k8s.SecurityContext(privileged=True, run_as_user=0, read_only_root_filesystem=True)
        # EFA and Neuron discovery and health read sysfs only, and prepare writes CDI specs: root (owner
        # of the kubelet plugin/registry dirs and /var/run/cdi) is enough, without any capability.
        return k8s.SecurityContext(
            privileged=False, run_as_user=0, run_as_non_root=False, allow_privilege_escalation=False,
            read_only_root_filesystem=True, capabilities=k8s.Capabilities(drop=["ALL"]),
            seccomp_profile=k8s.SeccompProfile(type="RuntimeDefault"))
