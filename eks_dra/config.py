"""Environment configuration: `config/<env>.yaml` validated into typed, frozen objects.

The file's shape (types, choices, no unknown keys) is checked by the pydantic models of `eks_dra.config_models`;
this module derives the environment from the checked mapping and checks what spans keys or needs the catalog.
Every mistake raises `UserError` naming the file, the field path (`config/dev.yaml: nodeGroups[2].capacity`)
and the fix. Plain data: this module imports only the catalog, the driver names, the models and the error type.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from eks_dra.catalog import INSTANCE_TYPES, SYSTEM_INSTANCE_TYPES, InstanceType, closest_instance_types
from eks_dra.catalog.ami_types import ami_type_for
from eks_dra.config_models import EnvironmentFile, PipelineFile, validated
from eks_dra.devices.names import FAMILIES, UPSTREAM_DRIVER_NAMES, DriverNames
from eks_dra.errors import UserError, shown
from eks_dra.input_files import MAX_CONFIG_BYTES, load_documents
from eks_dra.versions import DEFAULT_KUBERNETES_VERSION, validate_kubernetes_version

AmiFamily = Literal["al2023", "bottlerocket"]
DeviceMode = Literal["dra", "device-plugin"]
CapacityKind = Literal["on-demand", "odcr", "capacity-block"]
EfaSetting = Literal["auto", "on", "off"]
DriverImplementation = Literal["python", "upstream"]


RESERVATION_ID = re.compile(r"^cr-[0-9a-f]{8}([0-9a-f]{9})?$")
ACCOUNT_ID = re.compile(r"^[0-9]{12}$")
REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-[0-9]$")
VPC_ID = re.compile(r"^vpc-[0-9a-f]{8,17}$")
SUBNET_ID = re.compile(r"^subnet-[0-9a-f]{8,17}$")
NODE_GROUP_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
LABEL_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
# An image reference pinned to its content: a tag can be moved to other content (and IfNotPresent keeps
# whatever a node pulled first under it).
IMAGE_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
IPV4_CIDR = re.compile(r"^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})/(\d{1,2})$")
# The values CloudWatch Logs accepts for RetentionInDays.
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922,
                      3288, 3653)

# Label keys eks-dra sets itself; a user value could steer a DRA driver and a device plugin onto one node.
RESERVED_LABEL_PREFIX = "eks-dra.io/"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
GPU_TAINT = "nvidia.com/gpu"
NEURON_TAINT = "aws.amazon.com/neuron"

# EKS AMI types (the exact strings of the EKS API).
AMI_TYPES = (
    "AL2023_x86_64_STANDARD", "AL2023_ARM_64_STANDARD", "AL2023_x86_64_NVIDIA", "AL2023_ARM_64_NVIDIA",
    "AL2023_x86_64_NEURON", "BOTTLEROCKET_x86_64", "BOTTLEROCKET_ARM_64", "BOTTLEROCKET_x86_64_NVIDIA",
    "BOTTLEROCKET_ARM_64_NVIDIA",
)


# --- typed configuration ------------------------------------------------------------------------

@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str  # NoSchedule | PreferNoSchedule | NoExecute


@dataclass(frozen=True)
class CapacityConfig:
    kind: CapacityKind = "on-demand"
    reservation_id: str | None = None  # cr-...; required for odcr and capacity-block

    @property
    def reserved(self) -> bool:
        return self.kind != "on-demand"


@dataclass(frozen=True)
class VpcConfig:
    """A new VPC (`cidr`) or an existing one (`vpc_id` with one private subnet per AZ)."""

    vpc_id: str | None = None
    cidr: str | None = "10.0.0.0/16"
    # Existing VPC only: availability zone -> private subnet id (no lookups at synth time).
    private_subnets: dict[str, str] = field(default_factory=dict)
    # New VPC only: AZs to span; empty means two AZs chosen by CloudFormation (or <region>a/b when known).
    availability_zones: tuple[str, ...] = ()


@dataclass(frozen=True)
class DriversConfig:
    gpu: DriverImplementation = "python"
    efa: DriverImplementation = "python"
    neuron: DriverImplementation = "python"
    names: DriverNames = field(default_factory=DriverNames)

    def implementation(self, family: str) -> DriverImplementation:
        return getattr(self, family)


@dataclass(frozen=True)
class NodeGroupConfig:
    name: str
    instance_type: str
    min_size: int = 0
    desired_size: int = 0
    max_size: int = 1
    ami_family: AmiFamily = "al2023"
    device_mode: DeviceMode = "dra"  # mode of the accelerator family; `device_modes` may override per family
    capacity: CapacityConfig = field(default_factory=CapacityConfig)
    efa: EfaSetting = "auto"
    availability_zone: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    mig_profile: str | None = None
    # Per-family override of device_mode, e.g. {"efa": "device-plugin"} on a DRA GPU group.
    device_modes: dict[str, DeviceMode] = field(default_factory=dict)
    # IMDSv2 hop limit of the nodes: 1 keeps pods off the node role; 2 for containers that read IMDS themselves.
    imds_hop_limit: int = 1
    # RAID0 the instance-store NVMe for images and scratch; None: on when the instance type has any.
    local_storage: bool | None = None

    @property
    def instance(self) -> InstanceType | None:
        """The catalog entry; None for system (non-accelerator) node groups."""
        return INSTANCE_TYPES.get(self.instance_type)

    @property
    def architecture(self) -> str:
        if self.instance is not None:
            return self.instance.architecture
        return SYSTEM_INSTANCE_TYPES[self.instance_type][0]

    @property
    def accelerator_family(self) -> str | None:
        inst = self.instance
        return inst.accelerator_kind if inst is not None else None

    @property
    def efa_enabled(self) -> bool:
        inst = self.instance
        if inst is None or self.efa == "off":
            return False
        return inst.efa_supported and inst.max_efa_interfaces > 0

    @property
    def families(self) -> tuple[str, ...]:
        found = [self.accelerator_family] if self.accelerator_family else []
        if self.efa_enabled:
            found.append("efa")
        return tuple(found)

    def manager(self, family: str) -> DeviceMode:
        if family not in self.families:
            raise KeyError(f"node group {shown(self.name)} has no {family} devices")
        return self.device_modes.get(family, self.device_mode)

    @property
    def ami_type(self) -> str:
        """The EKS AMI type for this group (validated at load time to run the instance type)."""
        return ami_type_for(self.ami_family, self.architecture, self.accelerator_family)


@dataclass(frozen=True)
class EnvironmentConfig:
    name: str
    source: Path
    account: str | None
    region: str | None
    cluster_name: str
    kubernetes_version: str
    vpc: VpcConfig
    protected: bool
    node_groups: tuple[NodeGroupConfig, ...]
    drivers: DriversConfig
    driver_image: str | None
    warnings: tuple[str, ...] = ()
    # IAM role ARNs given cluster-admin access entries (AmazonEKSClusterAdminPolicy).
    cluster_admin_role_arns: tuple[str, ...] = ()
    # NVIDIA ComputeDomains (IMEX) in the vendor's GPU chart; needs drivers.gpu: upstream and a p6e-gb200 group.
    compute_domains: bool = False
    # The API server's public endpoint (always also private) and the CIDRs allowed to reach it (empty: anywhere).
    endpoint_public: bool = True
    endpoint_public_cidrs: tuple[str, ...] = ()
    # Retention of the stack's CloudWatch log groups (VPC flow logs).
    log_retention_days: int = 30
    # Sample workloads (pods with claims) deployed with the cluster and written to dist/<env>/samples/.
    samples: bool = True

    @property
    def access_warning(self) -> str | None:
        """Printed at synth (not a config mistake): without an admin role nobody can run kubectl on the cluster."""
        if self.cluster_admin_role_arns:
            return None
        return (f"{self.source}: clusterAdminRoleArns: no human admin role: only the CloudFormation execution role "
                "can use kubectl on the cluster; add clusterAdminRoleArns: [arn:aws:iam::ACCOUNT:role/YOUR-ROLE] (the "
                "role you sign in with: `aws sts get-caller-identity`)")

    def dra_node_groups(self, family: str) -> tuple[NodeGroupConfig, ...]:
        return tuple(g for g in self.node_groups if family in g.families and g.manager(family) == "dra")

    def device_plugin_node_groups(self, family: str) -> tuple[NodeGroupConfig, ...]:
        return tuple(g for g in self.node_groups if family in g.families and g.manager(family) == "device-plugin")

    def node_labels(self, group: NodeGroupConfig) -> dict[str, str]:
        """Kubernetes labels of the group's nodes (the charts select on them: eks_dra/charts/labels.py)."""
        labels = dict(group.labels)
        labels["eks-dra.io/node-group"] = group.name
        labels["eks-dra.io/instance-type"] = group.instance_type
        for family in group.families:
            labels[f"eks-dra.io/{family}"] = group.manager(family)
        if group.accelerator_family == "gpu":
            labels[GPU_PRESENT_LABEL] = "true"
        return labels

    def node_taints(self, group: NodeGroupConfig) -> tuple[Taint, ...]:
        """User taints, the accelerator taint and one driver-owned readiness taint per DRA-managed family."""
        taints = list(group.taints)
        if group.accelerator_family == "gpu":
            taints.append(Taint(GPU_TAINT, "true", "NoSchedule"))
        elif group.accelerator_family == "neuron":
            taints.append(Taint(NEURON_TAINT, "true", "NoSchedule"))
        for family in group.families:
            # Only our own drivers remove the readiness taint; a vendor driver would leave the node unschedulable.
            if group.manager(family) == "dra" and getattr(self.drivers, family) == "python":
                driver = self.drivers.names.for_family(family)  # type: ignore[arg-type]
                taints.append(Taint(f"{driver}/not-ready", "true", "NoSchedule"))
        return tuple(taints)


# --- loading ----------------------------------------------------------------------------------

def load_environment(name: str, config_dir: Path = Path("config")) -> EnvironmentConfig:
    """Read and validate `config_dir/<name>.yaml`; raise UserError naming the file, field and fix."""
    config_dir = Path(config_dir)
    path = config_dir / f"{name}.yaml"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", name):
        raise UserError(f"environment name {shown(name)} is not valid; use letters, digits, '-' or '_' (e.g. -c env=dev)")
    if not path.is_file():
        known = sorted(p.stem for p in config_dir.glob("*.yaml") if p.stem != "pipeline") if config_dir.is_dir() else []
        hint = f"; known environments: {', '.join(known)}" if known else ""
        raise UserError(f"{path}: no such environment file; create it or pick another with -c env=NAME{hint}")
    return _Loader(path, name).environment(_checked(EnvironmentFile, _read_yaml(path), path))


def load_pipeline(config_dir: Path = Path("config")) -> PipelineConfig:
    """Read `config_dir/pipeline.yaml`: the environments the pipeline deploys, in order."""
    path = Path(config_dir) / "pipeline.yaml"
    if not path.is_file():
        raise UserError(f"{path}: no such file; create it with `environments: [dev, prod]` and a `source:` block")
    return _Loader(path, "pipeline").pipeline(_checked(PipelineFile, _read_yaml(path), path), Path(config_dir))


def _checked(model: type, data: dict, path: Path) -> dict:
    try:
        return validated(model, data, path)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _read_yaml(path: Path) -> dict:
    documents = load_documents(path, MAX_CONFIG_BYTES, unique_keys=True)
    if len(documents) > 1:
        raise UserError(f"{path}: holds {len(documents)} YAML documents; an environment file is one mapping")
    data = documents[0] if documents else None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: the file must be a mapping of settings (clusterName: ..., nodeGroups: [...])")
    return data


@dataclass(frozen=True)
class PipelineSource:
    repository: str  # owner/name
    branch: str
    connection_arn: str  # CodeStar Connections / CodeConnections ARN


@dataclass(frozen=True)
class PipelineConfig:
    source_file: Path
    environments: tuple[EnvironmentConfig, ...]
    source: PipelineSource
    account: str | None = None
    region: str | None = None


class _Fields:
    """One mapping of the file after the models checked it (`eks_dra.config_models`): keys as written, values of
    the right type; an absent or empty key gives the default."""

    def __init__(self, data: dict | None):
        self.data = dict(data or {})

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value


class _Loader:
    def __init__(self, path: Path, env_name: str):
        self.path = path
        self.env_name = env_name
        self.warnings: list[str] = []

    def fail(self, field_path: str, message: str) -> None:
        raise UserError(f"{self.path}: {field_path}: {message}")

    def warn(self, field_path: str, message: str) -> None:
        self.warnings.append(f"{self.path}: {field_path}: {message}")

    # --- top level ---

    def environment(self, data: dict) -> EnvironmentConfig:
        top = _Fields(data)
        self._reject_dynamic_capacity(top)
        account = top.get("account")
        if account is not None:
            account = str(account).zfill(12) if isinstance(account, int) else account
            if not ACCOUNT_ID.match(account):
                self.fail("account", f"{shown(account)} is not a 12-digit AWS account id; quote it: account: \"123456789012\"")
        region = top.get("region")
        if region is not None and not REGION.match(region):
            self.fail("region", f"{shown(region)} is not an AWS region name (e.g. us-east-2)")
        cluster_name = top.get("clusterName", f"eks-dra-{self.env_name}")
        if not CLUSTER_NAME.match(cluster_name):
            self.fail("clusterName", f"{shown(cluster_name)} is not a valid EKS cluster name (letters, digits, - and _)")
        version = self._kubernetes_version(top)
        vpc = self._vpc(top.get("vpc", {}), region, account)
        drivers = self._drivers(top.get("drivers", {}))
        raw_groups = top.get("nodeGroups", None)
        if not raw_groups:
            self.fail("nodeGroups", "at least one node group is required (a small system group, e.g. m7i.xlarge)")
        groups = tuple(self._node_group(g, f"nodeGroups[{i}]", region, vpc) for i, g in enumerate(raw_groups))
        self._check_groups_together(groups)
        driver_image = top.get("driverImage")
        compute_domains = self._compute_domains(top, drivers, groups)
        admins = top.get("clusterAdminRoleArns", [])
        for i, arn in enumerate(admins):
            if not isinstance(arn, str) or not re.match(r"^arn:aws[a-z-]*:iam::[0-9]{12}:role/.+", arn):
                self.fail(f"clusterAdminRoleArns[{i}]", f"{shown(arn)} is not an IAM role ARN (arn:aws:iam::ACCOUNT:role/NAME)")
        if driver_image is None and any(g.architecture == "arm64" and any(
                g.manager(f) == "dra" and drivers.implementation(f) == "python" for f in g.families) for g in groups):
            self.warn("driverImage", "the driver image eks-dra builds is linux/amd64; arm64 DRA node groups (e.g. "
                      "p6e-gb200) need driverImage set to a multi-arch image")
        protected = top.get("protected", False)
        if protected and driver_image is not None and not IMAGE_DIGEST.search(driver_image):
            self.fail("driverImage", f"{shown(driver_image)}: a protected environment runs the image pinned by its digest; "
                      "write driverImage: REPO@sha256:<64 hex digits> (`docker buildx imagetools inspect REPO:TAG` "
                      "prints it)")
        public, cidrs = self._api_endpoint(top, protected)
        retention = top.get("logRetentionDays", 365 if protected else 30)
        if retention not in LOG_RETENTION_DAYS:
            close = min(LOG_RETENTION_DAYS, key=lambda d: abs(d - retention))
            self.fail("logRetentionDays", f"{retention} is not a CloudWatch Logs retention; use one of "
                      f"{', '.join(map(str, LOG_RETENTION_DAYS))} (closest: {close})")
        if not any(g.accelerator_family is None for g in groups):
            self.warn("nodeGroups", "no system (non-accelerator) node group: CoreDNS and the drivers' controllers "
                      "will not schedule on tainted accelerator nodes; add one, e.g. m7i.xlarge")
        return EnvironmentConfig(
            name=self.env_name, source=self.path, account=account, region=region, cluster_name=cluster_name,
            kubernetes_version=version, vpc=vpc, protected=protected, node_groups=groups,
            drivers=drivers, driver_image=driver_image, warnings=tuple(self.warnings),
            cluster_admin_role_arns=tuple(admins), endpoint_public=public, endpoint_public_cidrs=cidrs,
            log_retention_days=retention, samples=top.get("samples", not protected),
            compute_domains=compute_domains,
        )

    def _compute_domains(self, top: _Fields, drivers: DriversConfig, groups: tuple[NodeGroupConfig, ...]) -> bool:
        enabled = top.get("computeDomains", False)
        if enabled and drivers.gpu != "upstream":
            self.fail("computeDomains", "ComputeDomains come from the NVIDIA driver's ComputeDomain controller, "
                      "which eks-dra's GPU driver does not have: set drivers.gpu: upstream")
        if enabled and not any(g.instance_type.startswith("p6e-gb200") for g in groups):
            self.fail("computeDomains", "needs a p6e-gb200 node group: a ComputeDomain spans a Multi-Node NVLink "
                      "(IMEX) domain, which only GB200 UltraServers have")
        return enabled

    def _api_endpoint(self, top: _Fields, protected: bool) -> tuple[bool, tuple[str, ...]]:
        """Unprotected: public (and private) by default. Protected: private unless public CIDRs are given."""
        api = _Fields(top.get("apiEndpoint", {}))
        cidrs = api.get("publicAccessCidrs", [])
        for i, cidr in enumerate(cidrs):
            m = IPV4_CIDR.match(str(cidr))
            if not m or any(int(x) > 255 for x in m.groups()[:4]) or int(m.group(5)) > 32:
                self.fail(f"apiEndpoint.publicAccessCidrs[{i}]", f"{shown(cidr)} is not an IPv4 CIDR (e.g. 203.0.113.0/24)")
        public = api.get("public", bool(cidrs) or not protected)
        if cidrs and not public:
            self.fail("apiEndpoint.publicAccessCidrs", "is set but apiEndpoint.public is false; remove the CIDRs or "
                      "set public: true")
        if protected and public and (not cidrs or "0.0.0.0/0" in cidrs):
            self.fail("apiEndpoint", "a protected environment's API endpoint is private unless restricted: set "
                      "publicAccessCidrs to your operators' networks (e.g. [203.0.113.0/24]), or remove public: true "
                      "and reach the API from inside the VPC")
        return public, tuple(map(str, cidrs))

    def _reject_dynamic_capacity(self, top: _Fields) -> None:
        if top.get("autoMode", False):
            self.fail("autoMode", "EKS Auto Mode cannot be used with eks-dra's DRA drivers (Auto Mode brings its own "
                      "device stack and has no DRA on 1.34, no Neuron DRA at all); remove autoMode, node groups "
                      "are managed node groups")
        if "karpenter" in top.data:
            self.fail("karpenter", "Karpenter dynamic capacity is not supported: a DRA node must exist before the "
                      "scheduler can allocate its devices on 1.34; remove karpenter and size nodeGroups instead")

    def _kubernetes_version(self, top: _Fields) -> str:
        raw = top.get("kubernetesVersion", DEFAULT_KUBERNETES_VERSION)
        version = str(raw)
        if isinstance(raw, float) and len(version.split(".")[1]) == 1:
            self.fail("kubernetesVersion", f"YAML read {shown(raw)} as a number and dropped a trailing zero; quote it, "
                      f"e.g. kubernetesVersion: \"{DEFAULT_KUBERNETES_VERSION}\"")
        try:
            warnings = validate_kubernetes_version(version)
        except ValueError as exc:
            self.fail("kubernetesVersion", str(exc))
        for warning in warnings:
            self.warn("kubernetesVersion", warning)
        return version

    def _vpc(self, data: dict, region: str | None, account: str | None) -> VpcConfig:
        f = _Fields(data)
        vpc_id = f.get("vpcId")
        cidr = f.get("cidr")
        if vpc_id and cidr:
            self.fail("vpc", "give either cidr (new VPC) or vpcId (existing VPC), not both")
        if vpc_id:
            if not VPC_ID.match(vpc_id):
                self.fail("vpc.vpcId", f"{shown(vpc_id)} is not a VPC id (vpc-0123456789abcdef0)")
            subnets = f.get("privateSubnets", {})
            if not subnets:
                self.fail("vpc.privateSubnets", "an existing VPC needs its private subnets, one per AZ "
                          "(privateSubnets: {us-east-2a: subnet-...}); eks-dra does no lookups at synth time")
            for az, subnet in subnets.items():
                self._check_az(f"vpc.privateSubnets.{az}", str(az), region)
                if not isinstance(subnet, str) or not SUBNET_ID.match(subnet):
                    self.fail(f"vpc.privateSubnets.{az}", f"{shown(subnet)} is not a subnet id (subnet-0123456789abcdef0)")
            if "availabilityZones" in f.data:
                self.fail("vpc.availabilityZones", "only for a new VPC; an existing VPC's AZs are privateSubnets' keys")
            return VpcConfig(vpc_id=vpc_id, cidr=None, private_subnets=dict(subnets))
        if "privateSubnets" in f.data:
            self.fail("vpc.privateSubnets", "only for an existing VPC (vpcId); a new VPC creates its own subnets")
        cidr = cidr or "10.0.0.0/16"
        m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)\.(\d+)/(\d+)", cidr)
        if not m or any(int(p) > 255 for p in m.groups()[:4]) or not 16 <= int(m.group(5)) <= 20:
            self.fail("vpc.cidr", f"{shown(cidr)} must be an IPv4 CIDR between /16 and /20 (e.g. 10.0.0.0/16): EFA nodes "
                      "use many addresses")
        azs = f.get("availabilityZones", [])
        for i, az in enumerate(azs):
            self._check_az(f"vpc.availabilityZones[{i}]", str(az), region)
        if not azs and account is not None and region is not None:
            # An explicit environment would look its AZs up at synth (credentials); write down <region>a and b.
            azs = [f"{region}a", f"{region}b"]
        return VpcConfig(cidr=cidr, availability_zones=tuple(azs))

    def _check_az(self, field_path: str, az: str, region: str | None) -> None:
        if region is None:
            self.fail(field_path, f"availability zone {shown(az)} needs the top-level region (an AZ belongs to one "
                      "region); add region: " + re.sub(r"[a-z]$", "", az))
        if not re.fullmatch(re.escape(region) + r"[a-z]", az):
            self.fail(field_path, f"{shown(az)} is not an availability zone of region {region} (e.g. {region}a)")

    def _drivers(self, data: dict) -> DriversConfig:
        f = _Fields(data)
        impl = {fam: f.get(fam, "python") for fam in FAMILIES}
        names_data = f.get("names", {})
        nf = _Fields(names_data)
        defaults = DriverNames()
        names = {}
        for fam in FAMILIES:
            value = nf.get(fam, defaults.for_family(fam))
            if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+", value) or \
                    len(value) > 63:
                self.fail(f"drivers.names.{fam}", f"{shown(value)} must be a DNS subdomain with a dot "
                          "(e.g. gpu.example.com), at most 63 characters")
            names[fam] = value
        for fam in FAMILIES:
            if impl[fam] == "upstream" and fam in names_data:
                self.fail(f"drivers.names.{fam}", f"drivers.{fam} is upstream: the vendor's driver is always named "
                          f"{UPSTREAM_DRIVER_NAMES.for_family(fam)}; remove this name")
            taken = [f for f in FAMILIES if impl[f] == "upstream" and UPSTREAM_DRIVER_NAMES.for_family(f) == names[fam]]
            if impl[fam] == "python" and taken:
                self.fail(f"drivers.names.{fam}", f"{shown(names[fam])} is the name of the upstream {taken[0]} driver that "
                          f"drivers.{taken[0]}: upstream installs; two drivers cannot share one name in a cluster")
        if len(set(names.values())) != len(names):
            self.fail("drivers.names", "each device family needs its own driver name")
        return DriversConfig(names=DriverNames(**names), **impl)

    # --- node groups ---

    def _node_group(self, data: Any, p: str, region: str | None, vpc: VpcConfig) -> NodeGroupConfig:
        f = _Fields(data)
        name = f.get("name")
        if not name:
            self.fail(f"{p}.name", "every node group needs a name (lowercase letters, digits and '-')")
        if not NODE_GROUP_NAME.match(name):
            self.fail(f"{p}.name", f"{shown(name)} must be lowercase letters, digits and '-', at most 40 characters")
        instance_type = f.get("instanceType")
        if not instance_type:
            self.fail(f"{p}.instanceType", "required (e.g. p5.48xlarge)")
        inst = INSTANCE_TYPES.get(instance_type)
        if inst is None and instance_type not in SYSTEM_INSTANCE_TYPES:
            close = closest_instance_types(instance_type) + difflib.get_close_matches(
                instance_type, list(SYSTEM_INSTANCE_TYPES), n=2, cutoff=0.6)
            hint = f"; closest: {', '.join(close)}" if close else ""
            self.fail(f"{p}.instanceType", f"{shown(instance_type)} is not in the eks-dra instance catalog{hint}")
        accel = inst.accelerator_kind if inst else None

        sizes = {k: f.get(k) for k in ("minSize", "desiredSize", "maxSize")}
        min_size = 0 if sizes["minSize"] is None else sizes["minSize"]
        desired = min_size if sizes["desiredSize"] is None else sizes["desiredSize"]
        max_size = max(desired, 1) if sizes["maxSize"] is None else sizes["maxSize"]
        if min_size < 0:
            self.fail(f"{p}.minSize", "must be 0 or more")
        if max_size < 1:
            self.fail(f"{p}.maxSize", "must be at least 1 (EKS managed node groups need maxSize >= 1)")
        if min_size > max_size:
            self.fail(f"{p}.minSize", f"{min_size} is more than maxSize ({max_size}); raise maxSize or lower minSize")
        if not min_size <= desired <= max_size:
            self.fail(f"{p}.desiredSize", f"must lie between minSize ({min_size}) and maxSize ({max_size}), "
                      f"got {desired}")

        ami_family = f.get("amiFamily", "al2023")
        modes = self._device_modes(f, p, inst)
        device_mode = modes.get(accel or "", "dra") if accel else modes.get("efa", "dra")
        overrides = {fam: mode for fam, mode in modes.items() if mode != device_mode}

        capacity = self._capacity(f, p)
        if isinstance(f.data.get("efa"), bool):  # YAML 1.1 reads a bare on/off as a boolean
            f.data["efa"] = "on" if f.data["efa"] else "off"
        efa = f.get("efa", "auto")
        if efa == "on" and (inst is None or not inst.efa_supported or inst.max_efa_interfaces == 0):
            self.fail(f"{p}.efa", f"{instance_type} has no EFA; set efa: off (or auto), or pick an EFA type "
                      "such as p5.48xlarge, g6e.48xlarge or trn2.48xlarge")
        az = f.get("availabilityZone")
        if az is not None:
            self._check_az(f"{p}.availabilityZone", az, region)
            known_azs = tuple(vpc.private_subnets) if vpc.vpc_id else vpc.availability_zones
            if not known_azs:
                self.fail(f"{p}.availabilityZone", f"{az} needs the VPC's AZs written down (without "
                          "vpc.availabilityZones the new VPC spans two AZs chosen at deploy time); add "
                          f"vpc.availabilityZones: [{az}, ...]")
            if az not in known_azs:
                where = "vpc.privateSubnets" if vpc.vpc_id else "vpc.availabilityZones"
                self.fail(f"{p}.availabilityZone", f"{az} is not one of the VPC's AZs ({', '.join(known_azs)}); "
                          f"add it to {where}")
        labels = self._labels(f.get("labels", {}), f"{p}.labels")
        taints = self._taints(f.get("taints", []), f"{p}.taints")
        mig = f.get("migProfile")
        hop_limit = f.get("imdsHopLimit", 1)
        if hop_limit not in (1, 2):
            self.fail(f"{p}.imdsHopLimit", f"must be 1 (pods cannot reach IMDS) or 2 (containers that read IMDS "
                      f"themselves), got {hop_limit}")
        local_storage = f.get("localStorage")

        group = NodeGroupConfig(
            name=name, instance_type=instance_type, min_size=min_size, desired_size=desired, max_size=max_size,
            ami_family=ami_family, device_mode=device_mode, capacity=capacity, efa=efa,  # type: ignore[arg-type]
            availability_zone=az, labels=labels, taints=taints, mig_profile=mig, device_modes=overrides,
            imds_hop_limit=hop_limit, local_storage=local_storage,
        )
        self._check_ami(f, p, group)
        self._check_capacity(p, group)
        self._check_mig(p, group)
        self._check_reserved_keys(p, group)
        return group

    def _device_modes(self, f: _Fields, p: str, inst: InstanceType | None) -> dict[str, DeviceMode]:
        """`deviceMode: dra` for every family, or a mapping {gpu: dra, efa: device-plugin}."""
        raw = f.get("deviceMode", "dra")
        present = ([inst.accelerator_kind] if inst else []) + (["efa"] if inst and inst.efa_supported else [])
        allowed = ("dra", "device-plugin")
        if isinstance(raw, str):
            if raw not in allowed:
                self.fail(f"{p}.deviceMode", f"{shown(raw)} is not allowed; use dra or device-plugin "
                          "(or a mapping per family, e.g. {gpu: dra, efa: device-plugin})")
            return {fam: raw for fam in present}  # type: ignore[misc]
        modes: dict[str, DeviceMode] = {fam: "dra" for fam in present}
        for fam, mode in raw.items():
            fp = f"{p}.deviceMode.{fam}"
            if fam not in FAMILIES:
                self.fail(fp, f"unknown device family; use one of: {', '.join(FAMILIES)}")
            if fam not in present:
                self.fail(fp, f"{f.data.get('instanceType')} has no {fam} devices; remove this entry")
            if isinstance(mode, list):
                if set(mode) >= set(allowed):
                    self.fail(fp, f"one node group cannot be in both DRA and device-plugin mode for {fam}: the "
                              "driver and the plugin would hand out the same devices twice (KEP-5004); pick one, "
                              "or split the nodes into two node groups")
                mode = mode[0] if len(mode) == 1 else mode
            if mode not in allowed:
                self.fail(fp, f"{shown(mode)} is not allowed; use dra or device-plugin")
            modes[fam] = mode
        return modes

    def _capacity(self, f: _Fields, p: str) -> CapacityConfig:
        raw = f.get("capacity", "on-demand")
        kind, _, reservation = raw.partition(":")
        if kind not in ("on-demand", "odcr", "capacity-block"):
            self.fail(f"{p}.capacity", f"{shown(raw)} is not allowed; use on-demand, odcr:cr-... or capacity-block:cr-...")
        if kind == "on-demand":
            if reservation:
                self.fail(f"{p}.capacity", "on-demand takes no reservation id; for a reservation write odcr:cr-...")
            return CapacityConfig()
        if not reservation:
            what = "a Capacity Block" if kind == "capacity-block" else "an On-Demand Capacity Reservation"
            self.fail(f"{p}.capacity", f"{what} needs its reservation id; write {kind}:cr-0123456789abcdef0")
        if not RESERVATION_ID.match(reservation):
            self.fail(f"{p}.capacity", f"{shown(reservation)} is not a capacity reservation id (cr- and 17 hex digits)")
        return CapacityConfig(kind=kind, reservation_id=reservation)  # type: ignore[arg-type]

    def _check_ami(self, f: _Fields, p: str, g: NodeGroupConfig) -> None:
        inst = g.instance
        if g.ami_family == "bottlerocket" and inst is not None and inst.accelerator_kind == "gpu" \
                and inst.architecture == "arm64":
            self.fail(f"{p}.amiFamily", f"Bottlerocket NVIDIA AMIs do not support {g.instance_type} (AWS documents "
                      "only AL2023 ARM NVIDIA for it); set amiFamily: al2023")
        explicit = f.get("amiType")
        if explicit is not None:
            if explicit not in AMI_TYPES:
                close = difflib.get_close_matches(explicit, AMI_TYPES, n=1, cutoff=0.5)
                hint = f" (did you mean {shown(close[0])}?)" if close else ""
                self.fail(f"{p}.amiType", f"{shown(explicit)} is not an EKS AMI type{hint}")
            if explicit != g.ami_type:
                self.fail(f"{p}.amiType", f"{explicit} cannot run {g.instance_type} ({g.architecture}, "
                          f"{g.accelerator_family or 'no accelerator'}) with amiFamily {g.ami_family}; use "
                          f"{g.ami_type} or remove amiType (eks-dra derives it)")
        if g.ami_family == "bottlerocket" and g.accelerator_family == "neuron" and "neuron" in g.families \
                and g.manager("neuron") == "dra":
            self.warn(f"{p}.amiFamily", "Neuron DRA on Bottlerocket is documented inconsistently by AWS (one page "
                      "says unsupported); AL2023 Neuron is the documented path")

    def _check_capacity(self, p: str, g: NodeGroupConfig) -> None:
        inst = g.instance
        if g.capacity.reserved and inst is None:
            self.fail(f"{p}.capacity", "reservations are for accelerator node groups; use on-demand here")
        if inst is not None and inst.family == "p6e-gb200" and g.capacity.kind != "capacity-block":
            self.fail(f"{p}.capacity", f"{g.instance_type} is sold only as Capacity Blocks; write "
                      "capacity: capacity-block:cr-...")
        if g.capacity.kind == "capacity-block" and g.desired_size > 0:
            self.warn(f"{p}.desiredSize", "a Capacity Block node group must be scaled to desiredSize 0 before "
                      "EKS upgrades it; EKS also scales it to 0 40 minutes before the block ends")

    def _check_mig(self, p: str, g: NodeGroupConfig) -> None:
        if g.mig_profile is None:
            return
        inst = g.instance
        if inst is None or inst.gpu is None:
            self.fail(f"{p}.migProfile", f"{g.instance_type} has no NVIDIA GPU; remove migProfile")
        if not inst.gpu.mig_capable:
            self.fail(f"{p}.migProfile", f"{inst.gpu.product_name} ({g.instance_type}) is not MIG-capable; remove "
                      "migProfile or use p4d/p4de/p5/p5e/p5en/p6-b200")
        if g.ami_family == "bottlerocket":
            self.fail(f"{p}.migProfile", "static MIG is created at boot by an AL2023 script; Bottlerocket's MIG "
                      "settings belong to its bundled device plugin; set amiFamily: al2023")
        known = [m.name for m in inst.gpu.mig_profiles]
        if g.mig_profile not in known:
            self.fail(f"{p}.migProfile", f"{shown(g.mig_profile)} is not a MIG profile of {inst.gpu.product_name}; "
                      f"use one of: {', '.join(known)}")

    def _check_reserved_keys(self, p: str, g: NodeGroupConfig) -> None:
        for key in g.labels:
            if key.startswith(RESERVED_LABEL_PREFIX) or key == GPU_PRESENT_LABEL:
                self.fail(f"{p}.labels.{key}", "is set by eks-dra from the node group (a different value could put a "
                          "DRA driver and a device plugin on the same nodes); remove it, use deviceMode instead")
        for i, taint in enumerate(g.taints):
            if taint.key in (GPU_TAINT, NEURON_TAINT) or taint.key.endswith("/not-ready"):
                self.fail(f"{p}.taints[{i}].key", f"{taint.key} is added by eks-dra automatically; remove it")

    def _labels(self, data: dict, p: str) -> dict[str, str]:
        labels: dict[str, str] = {}
        for key, value in data.items():
            key = str(key)
            if not LABEL_NAME.match(key):
                self.fail(f"{p}.{key}", "is not a valid Kubernetes label key ([prefix/]name, 63 characters)")
            if isinstance(value, bool):
                value = "true" if value else "false"
            value = str(value)
            if not LABEL_VALUE.match(value):
                self.fail(f"{p}.{key}", f"{shown(value)} is not a valid label value (63 characters, alphanumeric ends)")
            labels[key] = value
        return labels

    def _taints(self, data: list, p: str) -> tuple[Taint, ...]:
        taints = []
        for i, raw in enumerate(data):
            tf = _Fields(raw)
            key = tf.get("key")
            if not key or not LABEL_NAME.match(key):
                self.fail(f"{p}[{i}].key", "required: a label-style key (e.g. example.com/dedicated)")
            value = str(tf.get("value", ""))
            effect = tf.get("effect", "NoSchedule")
            taints.append(Taint(key, value, effect))
        return tuple(taints)

    def _check_groups_together(self, groups: tuple[NodeGroupConfig, ...]) -> None:
        seen: dict[str, int] = {}
        for i, g in enumerate(groups):
            if g.name in seen:
                self.fail(f"nodeGroups[{i}].name", f"{shown(g.name)} is already used by nodeGroups[{seen[g.name]}]; two "
                          "groups with one name share node labels, so a DRA driver and a device plugin could land on "
                          "the same nodes; rename one")
            seen[g.name] = i

    # --- pipeline ---

    def pipeline(self, data: dict, config_dir: Path) -> PipelineConfig:
        top = _Fields(data)
        envs = top.get("environments", [])
        if not envs:
            self.fail("environments", "list the environments to deploy, in order (e.g. [dev, staging, prod])")
        if len(set(map(str, envs))) != len(envs):
            self.fail("environments", "an environment is listed twice; list each once, in deployment order")
        src = _Fields(top.get("source", {}))
        repo = src.get("repository")
        if not repo or not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
            self.fail("source.repository", "required: owner/name of the Git repository")
        arn = src.get("connectionArn")
        if not arn or not arn.startswith("arn:aws"):
            self.fail("source.connectionArn", "required: the CodeConnections connection ARN (arn:aws:codeconnections:...)")
        account = top.get("account")
        account = str(account).zfill(12) if isinstance(account, int) else account
        environments = tuple(load_environment(str(e), config_dir) for e in envs)
        for before, after in zip(environments, environments[1:], strict=False):
            if before.protected and not after.protected:
                self.fail("environments", f"{before.name} (protected) is listed before {after.name} (not protected): "
                          "the list is the deploy order, and a change must pass the unprotected environments before "
                          f"it reaches a protected one; move {after.name} before {before.name}")
        return PipelineConfig(
            source_file=self.path,
            environments=environments,
            source=PipelineSource(repo, src.get("branch", "main"), arn),
            account=account, region=top.get("region"),
        )
