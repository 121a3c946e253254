"""The boot-time MIG partitioning marker.

The launch template's MIG script (eks_dra/constructs/efa_launch_template.py) splits every GPU before the
kubelet starts and, as its last step, writes the boot id to MARKER. The GPU driver publishes MIG devices
only while the marker holds the current boot id: before that, NVML may show a half-made layout (some
GPUs split, others not yet), and a marker from an earlier boot says nothing about this boot's layout.
"""

from __future__ import annotations

from pathlib import Path

from ..framework.hosttree import BOOT_ID, read_optional

MARKER = Path("var/lib/eks-dra/mig-partitioned")


def partitioned(host_root: Path) -> tuple[bool, str]:
    """(whether this boot's partitioning has finished, why not)."""
    marker = read_optional(host_root / MARKER)
    if marker is None:
        return False, f"MIG devices not published: the boot-time partitioning marker /{MARKER} is missing " \
                      "(partitioning not finished yet)"
    boot_id = read_optional(host_root / BOOT_ID)
    if boot_id is not None and marker != boot_id:
        return False, f"MIG devices not published: /{MARKER} is from an earlier boot ({marker[:36]}, this boot " \
                      f"is {boot_id[:36]}); partitioning has not run in this boot yet"
    return True, ""


def write_marker(host_root: Path) -> None:
    """What the partitioning script's last line does (fixture trees)."""
    path = host_root / MARKER
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((read_optional(host_root / BOOT_ID) or "") + "\n")
