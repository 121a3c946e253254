"""What an environment costs: per month while idle (every node group at minSize) and per accelerator hour.

Computed from the node groups and a small table of list prices. Prices are facts with a date, not constants of
nature: check https://aws.amazon.com/ec2/pricing/on-demand/ and https://aws.amazon.com/eks/pricing/ before
relying on them. Plain data; no CDK import.
"""

from __future__ import annotations

from eks_dra.config import EnvironmentConfig

HOURS_PER_MONTH = 730
PRICES_AS_OF = "2026-12"
# USD per hour, On-Demand Linux, us-east-2 (US East, Ohio). UNVERIFIED entries were recalled, not read off the
# price list on PRICES_AS_OF; every entry needs checking against the pages above before a budget uses it.
EKS_CONTROL_PLANE = 0.10  # EKS standard support, per cluster
NAT_GATEWAY = 0.045  # per NAT gateway (data processing extra)
INSTANCE_PRICES: dict[str, float] = {
    "m7i.xlarge": 0.2016,
    "m7i.2xlarge": 0.4032,
    "g6.12xlarge": 4.6016,  # UNVERIFIED
    "g6e.12xlarge": 10.4926,  # UNVERIFIED
    "g6e.48xlarge": 30.1315,  # UNVERIFIED
    "p4d.24xlarge": 21.9576,  # UNVERIFIED (after the June 2025 P4/P5 price reduction)
    "p5.48xlarge": 55.04,  # UNVERIFIED (after the June 2025 P4/P5 price reduction)
}
GP3_GB_MONTH = 0.08
GP3_MIBS_MONTH = 0.04  # per MiB/s above the 125 MiB/s baseline


def _volume_month(group) -> float:
    size, throughput = (200, 500) if group.instance is not None else (50, 125)
    return size * GP3_GB_MONTH + (throughput - 125) * GP3_MIBS_MONTH


def cost_table(env: EnvironmentConfig) -> str:
    """A Markdown table: one row per node group, then the fixed costs and the idle total."""
    rows = ["| node group | instance type | accelerators | $/hour per node | $/accelerator-hour | idle nodes | "
            "idle $/month |", "|---|---|---|---|---|---|---|"]
    idle = 0.0
    for group in env.node_groups:
        price = INSTANCE_PRICES.get(group.instance_type)
        accelerators = group.instance.accelerator_count if group.instance is not None else 0
        per_hour = f"{price:.2f}" if price is not None else "not recorded"
        per_accelerator = f"{price / accelerators:.2f}" if price is not None and accelerators else "-"
        month = group.min_size * ((price or 0) * HOURS_PER_MONTH + _volume_month(group))
        idle += month
        idle_cost = f"{month:.0f}" if price is not None or not group.min_size else "not recorded"
        rows.append(f"| {group.name} | {group.instance_type} | {accelerators or '-'} | {per_hour} | "
                    f"{per_accelerator} | {group.min_size} | {idle_cost} |")
    fixed = (EKS_CONTROL_PLANE + (NAT_GATEWAY if not env.protected else 0)) * HOURS_PER_MONTH
    what = "EKS control plane + 1 NAT gateway" if not env.protected else "EKS control plane (NAT per AZ extra)"
    rows.append(f"| {what} | | | | | | {fixed:.0f} |")
    rows.append(f"| **idle total** | | | | | | **{idle + fixed:.0f}** |")
    return "\n".join(rows)
