"""Node-group labels, taints and the scheduling terms built from them (the node contract between
the CDK node groups, the charts, the drivers and the planner).

The CDK node group sets these labels and taints; the charts only match them. Keeping every key here
means a DaemonSet's affinity and a node group's labels cannot drift apart silently.
"""

from __future__ import annotations

from cdk8s_plus_34 import k8s

LABEL_PREFIX = "eks-dra.io"
NODE_GROUP_LABEL = f"{LABEL_PREFIX}/node-group"
INSTANCE_TYPE_LABEL = f"{LABEL_PREFIX}/instance-type"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"

GPU_TAINT = "nvidia.com/gpu"
NEURON_TAINT = "aws.amazon.com/neuron"
ACCELERATOR_TAINTS = (GPU_TAINT, NEURON_TAINT)

SYSTEM_NAMESPACE = "eks-dra-system"
SAMPLES_NAMESPACE = "dra-samples"

MANAGER_DRA = "dra"
MANAGER_DEVICE_PLUGIN = "device-plugin"


def family_label(family: str) -> str:
    """`eks-dra.io/<family>`: its value (`dra` or `device-plugin`) names the family's manager on the node."""
    return f"{LABEL_PREFIX}/{family}"


def readiness_taint_key(driver_name: str) -> str:
    """The driver-owned taint a DRA node starts with; the driver removes it once its slices are published."""
    return f"{driver_name}/not-ready"


def app_labels(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "eks-dra",
        "app.kubernetes.io/managed-by": "cdk8s",
    }


def manager_affinity(family: str, manager: str, *, node_groups: tuple[str, ...] = (),
                     other_node_groups: tuple[str, ...] = ()) -> k8s.Affinity:
    """Required node affinity `eks-dra.io/<family> In [<manager>]`: exactly the node groups of that manager;
    narrowed to `node_groups` (`eks-dra.io/node-group In`) or to all but `other_node_groups` (`NotIn`)."""
    expressions = [k8s.NodeSelectorRequirement(key=family_label(family), operator="In", values=[manager])]
    if node_groups:
        expressions.append(k8s.NodeSelectorRequirement(key=NODE_GROUP_LABEL, operator="In", values=list(node_groups)))
    if other_node_groups:
        expressions.append(k8s.NodeSelectorRequirement(key=NODE_GROUP_LABEL, operator="NotIn",
                                                       values=list(other_node_groups)))
    return k8s.Affinity(
        node_affinity=k8s.NodeAffinity(
            required_during_scheduling_ignored_during_execution=k8s.NodeSelector(
                node_selector_terms=[k8s.NodeSelectorTerm(match_expressions=expressions)])
        )
    )


def tolerate(key: str) -> k8s.Toleration:
    return k8s.Toleration(key=key, operator="Exists", effect="NoSchedule")


def tolerate_exactly(key: str, value: str, effect: str) -> k8s.Toleration:
    """A toleration of one taint as the node group sets it: key, value and effect must all match."""
    return k8s.Toleration(key=key, operator="Equal", value=value, effect=effect)


def accelerator_tolerations() -> list[k8s.Toleration]:
    """Workloads and node agents tolerate the GPU and Neuron taints, never the drivers' readiness taints."""
    return [tolerate(key) for key in ACCELERATOR_TAINTS]
