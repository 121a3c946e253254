"""EfaLaunchTemplate: the EC2 launch template of one accelerator managed node group.

It carries the instance type (aws_eks_v2's InstanceType enum has no p5/trn2/p6 names), IMDSv2, an
encrypted root volume, the EFA network-interface layout of the EC2 rule, the placement group and the
reservation targeting, and the node's user data (Bottlerocket TOML, or AL2023 MIME parts: a nodeadm NodeConfig
with max pods and local storage, and a cloud-config that installs the static-MIG systemd unit).
"""

from __future__ import annotations

import json
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
    """The EC2 rule (EC2 user guide, "EFA and network cards"): card 0 / device 0 is ENA; card 0 / device 1 is `efa-only` when card 0
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
    efa_security_group: ec2.ISecurityGroup | None = None
    """The EFA group (all traffic in and out to itself) shared by every EFA node group of the cluster, so that
    jobs spanning two groups can use EFA between them; default: a group of this template's own (needs vpc)."""
    vpc: ec2.IVpc | None = None
    """Where this template's own EFA security group is created when efa_security_group is not given."""
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
    root_volume_throughput: int = 500
    """gp3 throughput of that volume in MiB/s (gp3 baseline 125; image pulls of accelerator nodes are large)."""
    local_storage: bool = False
    """Assemble the instance-store NVMe disks as RAID0 for containerd, kubelet and pod scratch (nodeadm
    `localStorage`, Bottlerocket `apiclient ephemeral-storage`)."""
    max_pods: int | None = None
    """kubelet maxPods; set it when efa-only interfaces take ENI slots that nodeadm's default counts as free."""
    http_put_response_hop_limit: int = 1
    """IMDSv2 hop limit; 1 keeps pods away from the node role (workloads use EKS Pod Identity); 2 for pods that
    must reach IMDS themselves (e.g. tools that read instance metadata from a container)."""
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
        if p.efa and (p.cluster_security_group_id is None or (p.vpc is None and p.efa_security_group is None)):
            raise ValueError(f"{where}: efa=True needs cluster_security_group_id and efa_security_group (or vpc to "
                             "create one): every EFA interface carries the cluster group and the EFA group")
        if p.http_put_response_hop_limit not in (1, 2):
            raise ValueError(f"{where}: http_put_response_hop_limit must be 1 or 2, got {p.http_put_response_hop_limit}")
        if not 125 <= p.root_volume_throughput <= 1000:
            raise ValueError(f"{where}: root_volume_throughput must be 125-1000 MiB/s (gp3), got "
                             f"{p.root_volume_throughput}")
        if (p.disable_nvidia_device_plugin or p.neuron_device_ownership) and not p.bottlerocket:
            raise ValueError(f"{where}: disable_nvidia_device_plugin and neuron_device_ownership are Bottlerocket "
                             "settings; set bottlerocket=True or leave them False")
        if p.mig_profile and p.bottlerocket:
            raise ValueError(f"{where}: boot-time MIG partitioning is an AL2023 script; on Bottlerocket use its "
                             "device-plugin MIG settings or amiFamily al2023")

    def _block_devices(self) -> list:
        def volume(name: str, size: int, throughput: int | None = None) -> ec2.CfnLaunchTemplate.BlockDeviceMappingProperty:
            return ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
                device_name=name, ebs=ec2.CfnLaunchTemplate.EbsProperty(
                    volume_size=size, volume_type="gp3", encrypted=True, delete_on_termination=True,
                    iops=3000 if throughput else None, throughput=throughput))
        data = self.props.root_volume_throughput
        if self.props.bottlerocket:  # OS volume and data volume (images, kubelet state)
            return [volume("/dev/xvda", 4), volume("/dev/xvdb", self.props.root_volume_gib, data)]
        return [volume("/dev/xvda", self.props.root_volume_gib, data)]

    def _network_interfaces(self) -> list:
        p = self.props
        group = p.efa_security_group
        if group is None:
            group = self.security_group = efa_security_group(self, "EfaSecurityGroup", p.vpc)  # type: ignore[arg-type]
        groups = [group.security_group_id, p.cluster_security_group_id, *p.extra_security_group_ids]
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
            return _bottlerocket_settings(p) or None
        parts = []
        node_config = _node_config(p)
        if node_config:
            parts.append(("application/node.eks.aws", node_config))
        if p.mig_profile:
            parts.append(("text/cloud-config", _mig_cloud_config(p.instance_type, p.mig_profile)))
        return _mime(parts) if parts else None

    @property
    def launch_template_id(self) -> str:
        return self.resource.ref

    @property
    def latest_version(self) -> str:
        return self.resource.attr_latest_version_number


def efa_security_group(scope: Construct, construct_id: str, vpc: ec2.IVpc) -> ec2.SecurityGroup:
    """The EFA security group: all traffic in from and out to itself (EFA's SRD traffic is not IP, so 0.0.0.0/0
    egress does not cover it: EC2 EFA guide), plus the nodes' ordinary egress. Created without the default
    egress rule: with allow_all_outbound=True the CDK silently drops added egress rules (aws/aws-cdk#38558)."""
    group = ec2.SecurityGroup(scope, construct_id, vpc=vpc, allow_all_outbound=False,
                              description="EFA: all traffic to and from itself (required by EFA), egress to anywhere")
    group.add_ingress_rule(group, ec2.Port.all_traffic(), "EFA from itself")
    group.add_egress_rule(group, ec2.Port.all_traffic(), "EFA to itself (SRD traffic is not IP)")
    # The CDK refuses an all-traffic 0.0.0.0/0 rule on a group made without allow_all_outbound: the plain resource.
    ec2.CfnSecurityGroupEgress(scope, f"{construct_id}AnyEgress", group_id=group.security_group_id, ip_protocol="-1",
                               cidr_ip="0.0.0.0/0", description="Image pulls, EKS and AWS APIs")
    return group


# The systemd unit of static MIG: every boot, after the NVIDIA services hold the GPUs, before kubelet (and so
# before the GPU driver pod) starts; kubelet does not start on a node whose partitioning failed.
MIG_UNIT_NAME = "eks-dra-mig.service"
MIG_SCRIPT_PATH = "/usr/local/sbin/eks-dra-mig"
_MIG_UNIT = f"""[Unit]
Description=eks-dra static MIG partitioning (every boot, before kubelet)
After=nvidia-persistenced.service nvidia-fabricmanager.service
Before=nodeadm-run.service kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={MIG_SCRIPT_PATH}

[Install]
WantedBy=multi-user.target
RequiredBy=kubelet.service
"""


def _mig_script(instance_type: str, profile: str) -> str:
    gpu = get_instance_type(instance_type).gpu
    if gpu is None:
        raise ValueError(f"EfaLaunchTemplate: {instance_type} has no NVIDIA GPU for MIG profile {profile!r}")
    count = gpu.mig_profile(profile).max_instances
    instances = ",".join([profile] * count)
    return (
        "#!/bin/bash\n"
        "# Static MIG (eks-dra): split every GPU before kubelet and the DRA driver start; run on every boot.\n"
        "set -euo pipefail\n"
        "marker=/var/lib/eks-dra/mig-reboot\n"
        "nvidia-smi -mig 1\n"
        "# A100: MIG mode takes effect only after a GPU reset; NVSwitch hosts reset all GPUs at once without the\n"
        "# fabric manager and persistence daemon holding them. If the reset fails, reboot once (what MIG Manager\n"
        "# does); a second failure keeps kubelet down instead of publishing unpartitioned GPUs.\n"
        "modes=$(nvidia-smi --query-gpu=mig.mode.pending,mig.mode.current --format=csv,noheader)\n"
        "if grep -q 'Enabled, Disabled' <<<\"$modes\"; then\n"
        "  systemctl stop nvidia-fabricmanager nvidia-persistenced || true\n"
        "  if ! nvidia-smi --gpu-reset; then\n"
        "    if [ -e \"$marker\" ]; then echo 'eks-dra: MIG mode still pending after a reboot' >&2; exit 1; fi\n"
        "    mkdir -p \"$(dirname \"$marker\")\" && touch \"$marker\" && systemctl reboot && exit 0\n"
        "  fi\n"
        "  systemctl start nvidia-persistenced nvidia-fabricmanager || true\n"
        "fi\n"
        "rm -f \"$marker\"\n"
        "nvidia-smi mig -dci || true\n"
        "nvidia-smi mig -dgi || true\n"
        f"nvidia-smi mig -cgi {instances} -C\n"
        "# The GPU DRA driver publishes MIG devices only once this boot's partitioning has finished.\n"
        f"mkdir -p /{MIG_MARKER.parent}\n"
        f"cat /proc/sys/kernel/random/boot_id > /{MIG_MARKER}\n"
    )


def _mig_cloud_config(instance_type: str, profile: str) -> str:
    """cloud-init writes the unit and its script (first boot) and enables it; systemd runs it on every boot.
    JSON is YAML, so the document is written with json.dumps (no hand-built YAML)."""
    config = {
        "write_files": [
            {"path": MIG_SCRIPT_PATH, "permissions": "0755", "content": _mig_script(instance_type, profile)},
            {"path": f"/etc/systemd/system/{MIG_UNIT_NAME}", "permissions": "0644", "content": _MIG_UNIT},
        ],
        "runcmd": [["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", MIG_UNIT_NAME]],
    }
    return "#cloud-config\n" + json.dumps(config, indent=1) + "\n"


def _node_config(p: EfaLaunchTemplateProps) -> str | None:
    """The nodeadm NodeConfig (node.eks.aws/v1alpha1) fields eks-dra sets; EKS merges it with its own."""
    spec: dict = {}
    if p.local_storage:
        spec["instance"] = {"localStorage": {"strategy": "RAID0"}}
    if p.max_pods is not None:
        spec["kubelet"] = {"config": {"maxPods": p.max_pods}}
    if not spec:
        return None
    return json.dumps({"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig", "spec": spec}, indent=1) + "\n"


def _bottlerocket_settings(p: EfaLaunchTemplateProps) -> str:
    sections = []
    kubernetes = []
    if p.max_pods is not None:
        kubernetes.append(f"max-pods = {p.max_pods}")
    if p.neuron_device_ownership:
        kubernetes.append("device-ownership-from-security-context = true")
    if kubernetes:
        sections.append("[settings.kubernetes]\n" + "\n".join(kubernetes) + "\n")
    if p.disable_nvidia_device_plugin:
        # A DRA driver and the bundled device plugin must never hand out the same GPUs (KEP-5004).
        sections.append("[settings.kubelet-device-plugins.nvidia]\nenabled = false\n")
    if p.local_storage:
        # Bottlerocket's equivalent of nodeadm localStorage: RAID0 the instance store, bind the runtime dirs to it.
        sections.append(
            "[settings.bootstrap-commands.eks-dra-local-storage]\n"
            'commands = [["apiclient", "ephemeral-storage", "init"], ["apiclient", "ephemeral-storage", "bind", '
            '"--dirs", "/var/lib/containerd", "/var/lib/kubelet", "/var/log/pods"]]\n'
            'essential = true\nmode = "always"\n')
    return "\n".join(sections)


def _mime(parts: list[tuple[str, str]]) -> str:
    boundary = "EKSDRA"
    body = "".join(f'--{boundary}\nContent-Type: {kind}; charset="us-ascii"\n\n{content}\n' for kind, content in parts)
    return f'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="{boundary}"\n\n{body}--{boundary}--\n'
