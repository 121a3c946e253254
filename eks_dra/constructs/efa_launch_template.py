"""EfaLaunchTemplate: the EC2 launch template of one accelerator managed node group.

It carries the instance type (aws_eks_v2 cannot validate p5/trn2/p6 names, reference §7.2), IMDSv2, an
encrypted root volume, the EFA network-interface layout of the EC2 rule, the placement group and the
reservation targeting, and the node's user data (Bottlerocket TOML or an AL2023 MIME part).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aws_cdk import Fn
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from eks_dra.catalog import get_instance_type
from eks_dra.drivers.gpu.mig import MARKER as MIG_MARKER

CAPACITY_KINDS = ("on-demand", "odcr", "capacity-block")


@dataclass(frozen=True)
class EfaInterfaceSlot:
    """One entry of the launch template's NetworkInterfaces."""

    network_card: int
    device_index: int
    interface_type: str  # "interface" (ENA) or "efa-only"


def efa_interface_layout(instance_type: str, efa: bool = True) -> tuple[EfaInterfaceSlot, ...]:
    """The EC2 rule (reference §4.5, §9): card 0 / device 0 is ENA; card 0 / device 1 is `efa-only` when card 0
    carries an EFA; every further EFA is device 0 of its own card. Without EFA, only the primary ENA."""
    slots = [EfaInterfaceSlot(0, 0, "interface")]
    if not efa:
        return tuple(slots)
    inst = get_instance_type(instance_type)
    count = inst.max_efa_interfaces
    first_card = 0 if inst.efa_on_card0 else 1  # p6-b300 / p6e-gb200 style: card 0 is ENA only
    for n in range(count):
        card = first_card + n
        slots.append(EfaInterfaceSlot(card, 1 if card == 0 else 0, "efa-only"))
    return tuple(slots)


@dataclass
class EfaLaunchTemplateProps:
    instance_type: str
    """EC2 instance type; set only here, never on the node group."""
    cluster_security_group_id: str | None = None
    """The EKS cluster security group. Required with EFA: EKS does not add it when the template names groups."""
    vpc: ec2.IVpc | None = None
    """Where the self-referencing EFA security group lives. Required with EFA."""
    efa: bool = False
    """Attach the instance type's EFA interfaces (layout from the catalog)."""
    capacity_kind: str = "on-demand"
    """on-demand | odcr | capacity-block."""
    reservation_id: str | None = None
    """Capacity reservation id (cr-...) for odcr and capacity-block."""
    placement_group: bool | None = None
    """Cluster placement group; default: only for EFA on plain on-demand (never with a reservation)."""
    bottlerocket: bool = False
    """The AMI is Bottlerocket: user data is TOML settings merged by EKS."""
    disable_nvidia_device_plugin: bool = False
    """Bottlerocket NVIDIA only: switch off the bundled device plugin (DRA mode; Bottlerocket >= 1.63.0)."""
    neuron_device_ownership: bool = False
    """Bottlerocket only: device-ownership-from-security-context, needed by Neuron containers."""
    mig_profile: str | None = None
    """AL2023 NVIDIA only: create this MIG profile on every GPU at boot (static MIG), as many as fit."""
    root_volume_gib: int = 200
    """Size of the encrypted root (AL2023) or data (Bottlerocket) volume; container images are large."""
    http_put_response_hop_limit: int = 1
    """IMDSv2 hop limit; 1 keeps pods away from the node role (workloads use EKS Pod Identity)."""
    extra_security_group_ids: list[str] = field(default_factory=list)
    """More security groups on every interface (EFA only)."""


class EfaLaunchTemplate(Construct):
    """Launch template for an EKS managed node group of accelerator (or system) instances."""

    def __init__(self, scope: Construct, construct_id: str, props: EfaLaunchTemplateProps) -> None:
        super().__init__(scope, construct_id)
        self.props = props
        self._validate()
        self.security_group: ec2.SecurityGroup | None = None
        self.placement_group: ec2.CfnPlacementGroup | None = None

        data: dict = {
            "instance_type": props.instance_type,
            "metadata_options": ec2.CfnLaunchTemplate.MetadataOptionsProperty(
                http_tokens="required", http_endpoint="enabled",
                http_put_response_hop_limit=props.http_put_response_hop_limit,
            ),
            "block_device_mappings": self._block_devices(),
        }
        if props.efa:
            data["network_interfaces"] = self._network_interfaces()
        if self.wants_placement_group:
            self.placement_group = ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster")
            data["placement"] = ec2.CfnLaunchTemplate.PlacementProperty(group_name=self.placement_group.ref)
        if props.capacity_kind != "on-demand":
            data["capacity_reservation_specification"] = ec2.CfnLaunchTemplate.CapacityReservationSpecificationProperty(
                capacity_reservation_target=ec2.CfnLaunchTemplate.CapacityReservationTargetProperty(
                    capacity_reservation_id=props.reservation_id))
        if props.capacity_kind == "capacity-block":
            data["instance_market_options"] = ec2.CfnLaunchTemplate.InstanceMarketOptionsProperty(
                market_type="capacity-block")
        user_data = self.user_data()
        if user_data:
            data["user_data"] = Fn.base64(user_data)
        self.resource = ec2.CfnLaunchTemplate(
            self, "Resource", launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(**data))

    # --- derived settings ---

    @property
    def wants_placement_group(self) -> bool:
        p = self.props
        if p.placement_group is not None:
            return p.placement_group
        return p.efa and p.capacity_kind == "on-demand"

    def _validate(self) -> None:
        p = self.props
        where = f"EfaLaunchTemplate {self.node.path}"
        if p.capacity_kind not in CAPACITY_KINDS:
            raise ValueError(f"{where}: capacity_kind {p.capacity_kind!r} is not one of {', '.join(CAPACITY_KINDS)}")
        if p.capacity_kind != "on-demand" and not p.reservation_id:
            raise ValueError(f"{where}: capacity_kind {p.capacity_kind!r} needs reservation_id='cr-...'")
        if p.capacity_kind == "on-demand" and p.reservation_id:
            raise ValueError(f"{where}: reservation_id is set but capacity_kind is on-demand; use 'odcr'")
        if p.placement_group and p.capacity_kind != "on-demand":
            raise ValueError(f"{where}: a placement group with a reservation rejects the reserved instances "
                             "(InsufficientInstanceCapacity); set placement_group=False")
        if p.efa and (p.cluster_security_group_id is None or p.vpc is None):
            raise ValueError(f"{where}: efa=True needs cluster_security_group_id and vpc (every EFA interface carries "
                             "the cluster security group and a self-referencing one)")
        if (p.disable_nvidia_device_plugin or p.neuron_device_ownership) and not p.bottlerocket:
            raise ValueError(f"{where}: disable_nvidia_device_plugin and neuron_device_ownership are Bottlerocket "
                             "settings; set bottlerocket=True or leave them False")
        if p.mig_profile and p.bottlerocket:
            raise ValueError(f"{where}: boot-time MIG partitioning is an AL2023 script; on Bottlerocket use its "
                             "device-plugin MIG settings or amiFamily al2023")

    def _block_devices(self) -> list:
        def volume(name: str, size: int) -> ec2.CfnLaunchTemplate.BlockDeviceMappingProperty:
            return ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
                device_name=name, ebs=ec2.CfnLaunchTemplate.EbsProperty(
                    volume_size=size, volume_type="gp3", encrypted=True, delete_on_termination=True))
        if self.props.bottlerocket:  # OS volume and data volume (images, kubelet state)
            return [volume("/dev/xvda", 4), volume("/dev/xvdb", self.props.root_volume_gib)]
        return [volume("/dev/xvda", self.props.root_volume_gib)]

    def _network_interfaces(self) -> list:
        p = self.props
        self.security_group = ec2.SecurityGroup(
            self, "EfaSecurityGroup", vpc=p.vpc,
            # All outbound covers EFA traffic to itself and the nodes' image pulls and EKS API calls.
            allow_all_outbound=True,
            description="EFA: all traffic to and from itself (required by EFA)")
        self.security_group.add_ingress_rule(self.security_group, ec2.Port.all_traffic(), "EFA from itself")
        groups = [self.security_group.security_group_id, p.cluster_security_group_id, *p.extra_security_group_ids]
        return [
            ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
                network_card_index=slot.network_card, device_index=slot.device_index,
                interface_type=slot.interface_type, groups=groups, delete_on_termination=True)
            for slot in efa_interface_layout(p.instance_type)
        ]

    def user_data(self) -> str | None:
        """Bottlerocket: TOML settings; AL2023: a MIME multi-part document that nodeadm merges."""
        p = self.props
        if p.bottlerocket:
            sections = []
            if p.disable_nvidia_device_plugin:
                # A DRA driver and the bundled device plugin must never hand out the same GPUs (KEP-5004).
                sections.append("[settings.kubelet-device-plugins.nvidia]\nenabled = false\n")
            if p.neuron_device_ownership:
                sections.append("[settings.kubernetes]\ndevice-ownership-from-security-context = true\n")
            return "\n".join(sections) or None
        if p.mig_profile:
            return _mime_shell_script(_mig_script(p.instance_type, p.mig_profile))
        return None

    @property
    def launch_template_id(self) -> str:
        return self.resource.ref

    @property
    def latest_version(self) -> str:
        return self.resource.attr_latest_version_number


def _mig_script(instance_type: str, profile: str) -> str:
    gpu = get_instance_type(instance_type).gpu
    if gpu is None:
        raise ValueError(f"EfaLaunchTemplate: {instance_type} has no NVIDIA GPU for MIG profile {profile!r}")
    count = gpu.mig_profile(profile).max_instances
    instances = ",".join([profile] * count)
    return (
        "#!/bin/bash\n"
        "# Static MIG (eks-dra): split every GPU before kubelet and the DRA driver start.\n"
        "set -euo pipefail\n"
        "nvidia-smi -mig 1\n"
        "nvidia-smi mig -dci || true\n"
        "nvidia-smi mig -dgi || true\n"
        f"nvidia-smi mig -cgi {instances} -C\n"
        "# The GPU DRA driver publishes MIG devices only once this boot's partitioning has finished.\n"
        f"mkdir -p /{MIG_MARKER.parent}\n"
        f"cat /proc/sys/kernel/random/boot_id > /{MIG_MARKER}\n"
    )


def _mime_shell_script(script: str) -> str:
    boundary = "EKSDRA"
    return (
        f'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="{boundary}"\n\n'
        f'--{boundary}\nContent-Type: text/x-shellscript; charset="us-ascii"\n\n{script}\n--{boundary}--\n'
    )

