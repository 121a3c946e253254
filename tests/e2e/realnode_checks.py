"""What a container on a real node must have got from its claims, checked inside the container.

The expectation comes from two sources, so that a wrong CDI spec is caught as well as a runtime that does
not apply a right one: the CDI specs on the node's disk (every device node, env entry and mount they name,
applied in the order the CDI library applies them: spec-level edits, then each device's), and the claim's
allocation (the allocated device's own /dev node must be among them; no accelerator node of another device
may be visible).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from eks_dra.devices.names import DEFAULT_DRIVER_NAMES, FAMILIES
from eks_dra.drivers.framework.cdi import cdi_device_name, spec_file_name

# Every accelerator device node a container could see (the fixture's families).
ACCELERATOR_GLOBS = ("/dev/nvidia*", "/dev/nvidia-caps/*", "/dev/neuron*", "/dev/infiniband/*")


def family_of(driver: str) -> str | None:
    return next((f for f in FAMILIES if DEFAULT_DRIVER_NAMES.for_family(f) == driver), None)


def own_device_node(driver: str, device: str) -> str | None:
    """The /dev node that is the device itself: gpu-3 -> /dev/nvidia3, neuron-5 -> /dev/neuron5 (a MIG device's
    own node is a capability under /dev/nvidia-caps, which the spec names; its parent GPU's node is checked)."""
    match = re.fullmatch(r"(gpu|neuron)-(\d+)(-mig.*)?", device)
    if not match or family_of(driver) != match.group(1):
        return None
    return f"/dev/{'nvidia' if match.group(1) == 'gpu' else 'neuron'}{match.group(2)}"


@dataclass
class Expected:
    device_nodes: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[str] = field(default_factory=list)  # container paths
    own_nodes: list[str] = field(default_factory=list)
    env_items: list[tuple[str, str]] = field(default_factory=list)  # (variable, item of its comma list)

    def add_edits(self, edits: dict) -> None:
        for node in edits.get("deviceNodes") or []:
            if node["path"] not in self.device_nodes:
                self.device_nodes.append(node["path"])
        for entry in edits.get("env") or []:
            key, _, value = entry.partition("=")
            self.env[key] = value  # a later entry of the same name replaces an earlier one
        for mount in edits.get("mounts") or []:
            self.mounts.append(mount["containerPath"])


def allocated_env_item(driver: str, device: str, published: dict | None) -> tuple[str, str] | None:
    """What the allocation alone says must be in the visible-devices variable: for a GPU (or MIG device) the
    value "void", as the upstream NVIDIA DRA driver's specs set it, so that an `nvidia` runtime in legacy or
    jit-cdi mode injects nothing a second time (the GPU itself comes from the spec's device node, checked as
    the allocated device's own node); for a Neuron device its index."""
    family = family_of(driver)
    if family == "gpu" and published is not None:
        return "NVIDIA_VISIBLE_DEVICES", "void"
    index = device.rsplit("-", 1)[-1]
    if family == "neuron" and index.isdigit():
        return "AWS_NEURON_VISIBLE_DEVICES", index
    return None


def expected_for(claims: list[dict], specs: dict[str, dict], published: dict[tuple[str, str, str], dict]) -> Expected:
    """The container edits of a container that uses all of `claims`, from the node's CDI specs, plus what the
    allocation itself demands (`published`: (driver, pool, device) -> the device in its ResourceSlice)."""
    out = Expected()
    for claim in claims:
        uid = claim["metadata"]["uid"]
        seen_specs: set[str] = set()
        for result in claim["status"]["allocation"]["devices"]["results"]:
            driver, device = result["driver"], result["device"]
            name = spec_file_name(driver, uid)
            spec = specs.get(name)
            assert spec is not None, f"claim {claim['metadata']['name']}: no CDI spec {name} on the node"
            if name not in seen_specs:
                seen_specs.add(name)
                out.add_edits(spec.get("containerEdits") or {})
            entry = next((d for d in spec["devices"] if d["name"] == cdi_device_name(uid, device)), None)
            assert entry is not None, f"{name} has no device {cdi_device_name(uid, device)}"
            out.add_edits(entry["containerEdits"])
            own = own_device_node(driver, device)
            if own:
                out.own_nodes.append(own)
            item = allocated_env_item(driver, device, published.get((driver, result["pool"], device)))
            if item:
                out.env_items.append(item)
    return out


def check_script(expected: Expected) -> str:
    """A busybox sh script that prints one `ok ...` line per passed check and `FAIL ...` per failed one, and
    exits 1 if any failed."""
    nodes = sorted(set(expected.device_nodes))
    q = shlex.quote
    lines = ["rc=0", 'ok() { echo "ok $*"; }', 'bad() { echo "FAIL $*"; rc=1; }',
             f"expected=' {' '.join(nodes)} '"]
    for own in expected.own_nodes:
        lines.append(f'case "$expected" in *" {own} "*) ok allocated {own} in spec;; '
                     f'*) bad "allocated device {own} not in the CDI spec";; esac')
    for node in nodes:
        lines.append(f"if [ -c {q(node)} ]; then ok node {q(node)}; else bad missing device node {q(node)}; fi")
    lines.append(f"extra=0; for p in {' '.join(ACCELERATOR_GLOBS)}; do [ -c \"$p\" ] || continue; "
                 'case "$expected" in *" $p "*) ;; *) bad "unexpected device node $p"; extra=1;; esac; done')
    lines.append('[ "$extra" = 0 ] && ok no other accelerator device nodes')
    for key, value in sorted(expected.env.items()):
        kv = f"{key}={value}"
        lines.append(f"if tr '\\0' '\\n' < /proc/1/environ | grep -qxF {q(kv)}; then ok env {q(kv)}; "
                     f"else bad env {q(kv)} not set, got \"$(tr '\\0' '\\n' < /proc/1/environ | grep ^{q(key)}=)\"; fi")
    for key, item in expected.env_items:
        lines.append(f"if tr '\\0' '\\n' < /proc/1/environ | grep ^{q(key)}= | cut -d= -f2- | tr , '\\n' | "
                     f"grep -qxF {q(item)}; then ok allocated {q(item)} in {key}; "
                     f"else bad allocated {q(item)} not in {key}; fi")
    for path in expected.mounts:
        lines.append(f"if grep -q ' {path} ' /proc/1/mountinfo; then ok mount {q(path)}; "
                     f"else bad mount {q(path)} missing; fi")
    lines.append("exit $rc")
    return "\n".join(lines)


def passed_checks(output: str) -> int:
    return sum(1 for line in output.splitlines() if line.startswith("ok "))
