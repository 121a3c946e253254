"""The device-plugin alternative: NVIDIA, EFA and Neuron device plugins for node groups in device-plugin mode.

Each DaemonSet is pinned with `eks-dra.io/<family> In [device-plugin]`, so it can never share a node with
eks-dra's DRA driver of the same family (`In [dra]`): a device handed out by both would be oversubscribed
(KEP-5004). Images and arguments follow the EKS device-management guide (reference eks-accelerators.md §3).
"""

from __future__ import annotations

from dataclasses import dataclass

import cdk8s
from cdk8s_plus_34 import k8s
from constructs import Construct

from . import labels

NAMESPACE = "kube-system"
DEVICE_PLUGINS_DIR = "/var/lib/kubelet/device-plugins"
NVIDIA_IMAGE = "nvcr.io/nvidia/k8s-device-plugin:v0.19.3"
EFA_IMAGE = "602401143452.dkr.ecr.{region}.amazonaws.com/eks/aws-efa-k8s-device-plugin:v0.5.14"
NEURON_IMAGE = "790709498068.dkr.ecr.us-west-2.amazonaws.com/neuron-device-plugin:1.0.9043.0"


@dataclass(frozen=True)
class DevicePluginSettings:
    families: tuple[str, ...]  # families that some node group manages with a device plugin
    # NVIDIA plugin 0.19.0-0.19.2 mount every /dev/infiniband/uverbs* by default (MOFED); off where EFA is used.
    gpu_nodes_use_efa: bool = False
    region: str = "us-west-2"  # the EKS add-on image registry of the cluster's region
    # A group may run a DRA driver for one family and a plugin for another: tolerate the driver's taint.
    readiness_taints: tuple[str, ...] = ()


class DevicePluginsChart(cdk8s.Chart):
    def __init__(self, scope: Construct, id: str, *, settings: DevicePluginSettings) -> None:
        super().__init__(scope, id, disable_resource_name_hashes=True)
        self.settings = settings
        for family in settings.families:
            {"gpu": self._nvidia, "efa": self._efa, "neuron": self._neuron}[family]()

    def _daemon_set(self, name: str, family: str, container: k8s.Container, *,
                    service_account: str | None = None) -> k8s.KubeDaemonSet:
        meta_labels = labels.app_labels(name, "device-plugin")
        selector = {"app.kubernetes.io/name": name}
        return k8s.KubeDaemonSet(
            self, name, metadata=k8s.ObjectMeta(name=name, namespace=NAMESPACE, labels=meta_labels),
            spec=k8s.DaemonSetSpec(
                selector=k8s.LabelSelector(match_labels=selector),
                update_strategy=k8s.DaemonSetUpdateStrategy(type="RollingUpdate"),
                template=k8s.PodTemplateSpec(
                    metadata=k8s.ObjectMeta(labels={**meta_labels, **selector}),
                    spec=k8s.PodSpec(
                        service_account_name=service_account,
                        priority_class_name="system-node-critical",
                        affinity=labels.manager_affinity(family, labels.MANAGER_DEVICE_PLUGIN),
                        tolerations=[*labels.accelerator_tolerations(),
                                     *(labels.tolerate(t) for t in self.settings.readiness_taints)],
                        containers=[container],
                        volumes=[k8s.Volume(name="device-plugins", host_path=k8s.HostPathVolumeSource(
                            path=DEVICE_PLUGINS_DIR, type="Directory"))],
                    ),
                ),
            ),
        )

    @staticmethod
    def _container(name: str, image: str, *, args: list[str] | None = None,
                   env: list[k8s.EnvVar] | None = None) -> k8s.Container:
        return k8s.Container(
            name=name, image=image, image_pull_policy="IfNotPresent", args=args, env=env,
            resources=k8s.ResourceRequirements(
                requests={"cpu": k8s.Quantity.from_string("10m"), "memory": k8s.Quantity.from_string("32Mi")},
                limits={"memory": k8s.Quantity.from_string("128Mi")}),
            # Device plugins only talk to kubelet over the device-plugins socket and read sysfs.
            security_context=k8s.SecurityContext(allow_privilege_escalation=False,
                                                 capabilities=k8s.Capabilities(drop=["ALL"])),
            volume_mounts=[k8s.VolumeMount(name="device-plugins", mount_path=DEVICE_PLUGINS_DIR)],
        )

    def _nvidia(self) -> None:
        args = ["--mofed-enabled=false"] if self.settings.gpu_nodes_use_efa else None
        env = [k8s.EnvVar(name="FAIL_ON_INIT_ERROR", value="false")]
        self._daemon_set("nvidia-device-plugin", "gpu", self._container("nvidia-device-plugin", NVIDIA_IMAGE,
                                                                        args=args, env=env))

    def _efa(self) -> None:
        image = EFA_IMAGE.format(region=self.settings.region)
        self._daemon_set("aws-efa-k8s-device-plugin", "efa", self._container("aws-efa-k8s-device-plugin", image))

    def _neuron(self) -> None:
        name = "neuron-device-plugin"
        meta = k8s.ObjectMeta(name=name, labels=labels.app_labels(name, "device-plugin"))
        k8s.KubeServiceAccount(self, f"{name}-sa", metadata=k8s.ObjectMeta(
            name=name, namespace=NAMESPACE, labels=labels.app_labels(name, "device-plugin")))
        # The Neuron plugin looks up the pods it allocated cores to and records allocations on the node.
        k8s.KubeClusterRole(self, f"{name}-role", metadata=meta, rules=[
            k8s.PolicyRule(api_groups=[""], resources=["nodes"], verbs=["get", "list", "watch"]),
            k8s.PolicyRule(api_groups=[""], resources=["nodes/status"], verbs=["patch", "update"]),
            k8s.PolicyRule(api_groups=[""], resources=["pods"], verbs=["get", "list", "watch", "update", "patch"]),
            k8s.PolicyRule(api_groups=[""], resources=["events"], verbs=["create", "patch"]),
        ])
        k8s.KubeClusterRoleBinding(
            self, f"{name}-binding", metadata=meta,
            role_ref=k8s.RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=name),
            subjects=[k8s.Subject(kind="ServiceAccount", name=name, namespace=NAMESPACE)])
        env = [k8s.EnvVar(name="NODE_NAME", value_from=k8s.EnvVarSource(
            field_ref=k8s.ObjectFieldSelector(field_path="spec.nodeName")))]
        self._daemon_set(name, "neuron", self._container(name, NEURON_IMAGE, env=env), service_account=name)
