"""Per instance type: pod-IP capacity of the default network card and the local NVMe instance store.

Facts from EC2 DescribeInstanceTypes (`NetworkInfo.NetworkCards[DefaultNetworkCardIndex].MaximumNetworkInterfaces`,
`Ipv4AddressesPerInterface`, `InstanceStorageInfo.Disks`), as recorded in moto 5's `ec2/resources/instance_types.json`
(read December 2026). nodeadm uses the same fields (awslabs/amazon-eks-ami `instance-info.jsonl`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .instances import INSTANCE_TYPES, SYSTEM_INSTANCE_TYPES


@dataclass(frozen=True)
class NodeLimits:
    default_card_enis: int | None  # ENIs the default network card takes; None: not recorded
    ipv4_per_eni: int | None
    instance_store_disks: int  # local NVMe disks (0: EBS only)
    instance_store_disk_gb: int


# name: (ENIs on the default card, IPv4 per ENI, NVMe disks, GB per disk)
_LIMITS: dict[str, tuple[int | None, int | None, int, int]] = {
    "p4d.24xlarge": (15, 50, 8, 1000),
    "p4de.24xlarge": (15, 50, 8, 1000),
    "p5.4xlarge": (4, 30, 1, 3800),
    "p5.48xlarge": (2, 50, 8, 3800),
    "p5e.48xlarge": (2, 50, 8, 3800),
    "p5en.48xlarge": (4, 50, 8, 3800),
    "p6-b200.48xlarge": (4, 50, 8, 3800),
    # Not in moto's data: 3 x 7.5 TB NVMe from the EKS UltraServer page; the ENI limits are UNVERIFIED (None).
    "p6e-gb200.36xlarge": (None, None, 3, 7500),
    "g5.xlarge": (4, 15, 1, 250),
    "g5.2xlarge": (4, 15, 1, 450),
    "g5.4xlarge": (8, 30, 1, 600),
    "g5.8xlarge": (8, 30, 1, 900),
    "g5.12xlarge": (15, 50, 1, 3800),
    "g5.16xlarge": (8, 30, 1, 1900),
    "g5.24xlarge": (15, 50, 1, 3800),
    "g5.48xlarge": (7, 50, 2, 3800),
    "g6.xlarge": (4, 15, 1, 250),
    "g6.2xlarge": (4, 15, 1, 450),
    "g6.4xlarge": (8, 30, 1, 600),
    "g6.8xlarge": (8, 30, 2, 450),
    "g6.12xlarge": (8, 30, 4, 940),
    "g6.16xlarge": (15, 50, 2, 940),
    "g6.24xlarge": (15, 50, 4, 940),
    "g6.48xlarge": (15, 50, 8, 940),
    "g6e.xlarge": (4, 15, 1, 250),
    "g6e.2xlarge": (4, 15, 1, 450),
    "g6e.4xlarge": (8, 30, 1, 600),
    "g6e.8xlarge": (8, 30, 2, 450),
    "g6e.12xlarge": (10, 30, 2, 1900),
    "g6e.16xlarge": (15, 50, 2, 950),
    "g6e.24xlarge": (10, 50, 2, 1900),
    "g6e.48xlarge": (10, 50, 4, 1900),
    "trn1.2xlarge": (4, 15, 1, 474),
    "trn1.32xlarge": (5, 50, 4, 1900),
    "trn1n.32xlarge": (5, 50, 4, 1900),
    "trn2.3xlarge": (2, 15, 1, 470),
    "trn2.48xlarge": (2, 50, 4, 1900),
    "inf2.xlarge": (4, 15, 0, 0),
    "inf2.8xlarge": (8, 30, 0, 0),
    "inf2.24xlarge": (15, 50, 0, 0),
    "inf2.48xlarge": (15, 50, 0, 0),
    "m7i.large": (3, 10, 0, 0),
    "m7i.xlarge": (4, 15, 0, 0),
    "m7i.2xlarge": (4, 15, 0, 0),
    "m6i.large": (3, 10, 0, 0),
    "m6i.xlarge": (4, 15, 0, 0),
    "m5.large": (3, 10, 0, 0),
    "m5.xlarge": (4, 15, 0, 0),
    "m7g.large": (3, 10, 0, 0),
    "m7g.xlarge": (4, 15, 0, 0),
    "c7i.xlarge": (4, 15, 0, 0),
}
assert set(_LIMITS) == set(INSTANCE_TYPES) | set(SYSTEM_INSTANCE_TYPES), "node limits for every catalogued type"


def node_limits(instance_type: str) -> NodeLimits:
    """The recorded limits; an uncatalogued type has none recorded (nodeadm's own defaults apply)."""
    return NodeLimits(*_LIMITS.get(instance_type, (None, None, 0, 0)))


def max_pods(instance_type: str, eni_slots_taken: int = 0) -> int | None:
    """nodeadm's formula (ENIs x (IPv4 per ENI - 1) + 2, capped at 110 below 30 vCPUs, else 250), with the
    default card's ENI slots that `efa-only` interfaces take left out: the VPC CNI cannot put pod IPs there."""
    limits = node_limits(instance_type)
    if limits.default_card_enis is None or limits.ipv4_per_eni is None:
        return None
    enis = limits.default_card_enis - eni_slots_taken
    if enis < 1:
        raise ValueError(f"{instance_type}: efa-only interfaces take every ENI slot of the default network card")
    inst = INSTANCE_TYPES.get(instance_type)
    vcpus = inst.vcpus if inst is not None else SYSTEM_INSTANCE_TYPES[instance_type][1]  # recorded: catalogued
    return min(enis * (limits.ipv4_per_eni - 1) + 2, 110 if vcpus < 30 else 250)
