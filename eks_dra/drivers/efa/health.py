"""EFA health: every port of the interface's RDMA device must be ACTIVE (/sys/class/infiniband/<ibdev>/ports/*/state
"4: ACTIVE"). A level signal, read afresh on every poll."""

from __future__ import annotations

from pathlib import Path

from eks_dra.devices import efa as efa_model

from ..framework.hosttree import read_optional
from ..framework.inventory import HEALTHY, Fault, Health, Inventory


def efa_port_health(host_root: Path, ibdev: str) -> Health:
    ports = sorted((host_root / "sys/class/infiniband" / ibdev / "ports").glob("*/state"))
    if not ports:
        return False, f"{ibdev}: no port state in sysfs"
    for state_file in ports:
        state = read_optional(state_file)
        if state is None:
            return False, f"{ibdev} port {state_file.parent.name}: unreadable state file {state_file}"
        if state.rpartition(":")[2].strip() != "ACTIVE":  # "4: ACTIVE"; not DOWN, INIT, ARMED, ACTIVE_DEFER
            return False, Fault("link-down", f"{ibdev} port {state_file.parent.name} is {state!r}, not ACTIVE")
    return HEALTHY


def efa_level_health(host_root: Path, inventory: Inventory) -> dict[str, Health]:
    return {d.device.name: efa_port_health(host_root, str(d.device.attributes[efa_model.RDMA_DEVICE]))
            for d in inventory.devices}
