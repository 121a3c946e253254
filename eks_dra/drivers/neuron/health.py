"""Neuron health: the driver's uncorrected ECC counters, /sys/class/neuron_device/neuronN/stats/hardware/
{mem_ecc_uncorrected,sram_ecc_uncorrected} (a `total` file inside, or the counter file itself): any uncorrected
error makes the device unhealthy until the counters are reset (device reset/driver reload). A level signal."""

from __future__ import annotations

from pathlib import Path

from eks_dra.devices import neuron as neuron_model

from ..framework.hosttree import read_optional
from ..framework.inventory import HEALTHY, Fault, Health, Inventory

NEURON_ECC_COUNTERS = ("mem_ecc_uncorrected", "sram_ecc_uncorrected")


def _counter(path: Path) -> int:
    target = path / "total" if path.is_dir() else path
    text = read_optional(target)
    if text is None:
        raise ValueError(f"cannot read {target}")
    return int(text or 0)


def neuron_health(host_root: Path, index: int) -> Health:
    base = host_root / "sys/class/neuron_device" / f"neuron{index}"
    if not base.exists():
        return False, Fault("device-lost", f"neuron{index} disappeared from /sys/class/neuron_device")
    errors = []
    for name in NEURON_ECC_COUNTERS:
        path = base / "stats/hardware" / name
        if not path.exists():
            continue  # older drivers lack the counters: no signal is not a fault
        try:
            count = _counter(path)
        except (OSError, ValueError) as exc:
            return False, f"neuron{index}: unreadable {name} ({exc})"
        if count:
            errors.append(f"{name}={count}")
    if errors:
        return False, Fault("ecc-uncorrected", f"neuron{index}: uncorrected ECC errors ({', '.join(errors)}); reset the device")
    return HEALTHY


def neuron_level_health(host_root: Path, inventory: Inventory) -> dict[str, Health]:
    return {d.device.name: neuron_health(host_root, int(d.device.attributes[neuron_model.DEVICE_ID]))
            for d in inventory.devices}
