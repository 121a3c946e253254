"""Our CDI edits against NVIDIA's reference: the request for, and the normalised comparison with, the
`nvcdi-fixture` program (tests/nvidia_ctk: nvidia-container-toolkit's pkg/nvcdi, mock or real NVML).

Used by the nvidia-ctk test tier (fixture driver roots, mock NVML) and by `make gpu-check` (the real
driver root and NVML). Normalisation: container edits become sets of env entries, mounts (host path,
container path, options), device nodes (host path, path) and hooks (lifecycle, path, args, env), so
names and order do not count and several specs' edits combine as a runtime applies them.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from ..framework import cdi
from ..framework.inventory import Inventory
from .nvml import NvmlGpu

# nvcdi's executable lookup searches its own PATH first: pin it to the default list, as on a node.
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
REPO = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO / "tests/nvidia_ctk/build.sh"


def gpus_from_nvml(gpus: list[NvmlGpu]) -> list[dict]:
    """The request's GPU list from NVML's records (a real node)."""
    return [{"uuid": g.uuid, "minor": g.minor, "pciBusID": g.pci_address,
             "migs": [{"uuid": m.uuid, "gi": m.gpu_instance_id, "ci": m.compute_instance_id} for m in g.migs]}
            for g in sorted(gpus, key=lambda g: g.minor)]


def our_spec(inventory: Inventory) -> dict:
    """The spec our driver writes for one claim holding every device of the inventory."""
    edits = [cdi.DeviceEdits(d.device.name, list(d.device_nodes), hooks=list(d.hooks)) for d in inventory.devices]
    return cdi.build_spec("gpu-check", "gpu-check", edits, list(inventory.common_device_nodes), {},
                          inventory.common_edits)


def compare(inventory: Inventory, reference: dict) -> list[str]:
    """Differences, per device (by UUID) and at spec level, between our spec and the reference's."""
    spec = our_spec(inventory)
    lines = [f"spec level: {d}" for d in differences(normalise(spec["containerEdits"]),
                                                      normalise(reference["common"]))]
    for d, entry in zip(inventory.devices, spec["devices"], strict=True):
        uuid = str(d.device.attributes["uuid"])
        theirs = reference["devices"].get(uuid)
        if theirs is None:
            lines.append(f"{d.device.name} ({uuid}): nvcdi has no device spec for it")
            continue
        lines += [f"{d.device.name}: {x}" for x in differences(normalise(entry["containerEdits"]), normalise(theirs))]
    return lines


def run_reference(binary: Path, request: dict, timeout_s: float = 120) -> dict:
    """Run nvcdi-fixture; device-node host paths come back relative to the driver root's /dev."""
    proc = subprocess.run([str(binary)], input=json.dumps(request), capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, "PATH": NODE_PATH})
    if proc.returncode != 0:
        raise RuntimeError(f"{binary}: exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    out = json.loads(proc.stdout)
    dev_root = out.get("devRoot") or ""
    for edits in [out["common"], *out["devices"].values()]:
        for node in edits.get("deviceNodes") or []:
            host = node.get("hostPath") or node["path"]
            node["hostPath"] = host[len(dev_root):] if dev_root and host.startswith(dev_root) else host
    return out


def normalise(*edits: dict) -> dict[str, set]:
    """The union of container edits as sets: what a runtime applies, regardless of order and names."""
    out: dict[str, set] = {"env": set(), "mounts": set(), "deviceNodes": set(), "hooks": set()}
    for e in edits:
        out["env"] |= set(e.get("env") or [])
        out["mounts"] |= {(m["hostPath"], m["containerPath"], tuple(m.get("options") or []))
                          for m in e.get("mounts") or []}
        out["deviceNodes"] |= {(n.get("hostPath") or n["path"], n["path"]) for n in e.get("deviceNodes") or []}
        out["hooks"] |= {(h["hookName"], h["path"], tuple(h["args"]), tuple(h.get("env") or []))
                         for h in e.get("hooks") or []}
    return out


def differences(ours: dict[str, set], theirs: dict[str, set]) -> list[str]:
    """One line per edit that only one side has."""
    lines = []
    for key in ours:
        lines += [f"{key}: only ours: {x}" for x in sorted(ours[key] - theirs[key], key=str)]
        lines += [f"{key}: only nvcdi: {x}" for x in sorted(theirs[key] - ours[key], key=str)]
    return lines


def build_reference() -> Path:
    """tests/nvidia_ctk/build.sh (cached under ~/.cache/eks-dra/nvidia-ctk); needs Go and a C compiler."""
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])
