"""The EKS AMI type that runs an instance type: plain data shared by the config and the constructs."""

from __future__ import annotations

from .instances import INSTANCE_TYPES, SYSTEM_INSTANCE_TYPES


def ami_type_for(ami_family: str, architecture: str, accelerator: str | None) -> str:
    arch = "x86_64" if architecture == "x86_64" else "ARM_64"
    if ami_family == "bottlerocket":
        # Neuron runs on the plain Bottlerocket variant (aws-k8s), with device ownership from the pod.
        return f"BOTTLEROCKET_{arch}_NVIDIA" if accelerator == "gpu" else f"BOTTLEROCKET_{arch}"
    suffix = {"gpu": "NVIDIA", "neuron": "NEURON", None: "STANDARD"}[accelerator]
    return f"AL2023_{arch}_{suffix}"


def default_ami_type(instance_type: str, ami_family: str = "al2023") -> str:
    """The AMI type of a catalogued accelerator or system instance type (KeyError for an unknown type)."""
    inst = INSTANCE_TYPES.get(instance_type)
    if inst is not None:
        return ami_type_for(ami_family, inst.architecture, inst.accelerator_kind)
    return ami_type_for(ami_family, SYSTEM_INSTANCE_TYPES[instance_type][0], None)
