"""Refusing to double-manage a device family: a Node whose allocatable resources show the family's
device plugin (EKS: a device plugin and a DRA driver for the same devices must not share a node)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .family import DeviceFamily


def _positive(quantity: object) -> bool:
    text = str(quantity).strip()
    return bool(text) and text not in ("0", "0k", "0m") and not text.startswith("-")


def device_plugin_conflict(family: DeviceFamily, node: dict) -> str | None:
    """The reason this driver must not publish on `node`, or None."""
    status = node.get("status") or {}
    for source in ("allocatable", "capacity"):
        for name, quantity in sorted((status.get(source) or {}).items()):
            if name.startswith(family.device_plugin_resources) and _positive(quantity):
                return (f"node {node.get('metadata', {}).get('name')} has {source} {name}={quantity}: the "
                        f"{family.name} device plugin manages these devices; a DRA driver and a device plugin for the "
                        f"same devices must not share a node. Remove the device plugin from this node (label "
                        f"eks-dra.io/{family.name}=dra) or stop this driver here.")
    return None
