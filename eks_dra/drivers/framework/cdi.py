"""CDI specs: one transient spec per claim in `--cdi-root` (/var/run/cdi), written atomically.

File `<cdi-root>/k8s.<driver>-claim_<claimUID>.json`, kind `k8s.<driver>/claim`, one CDI device per
prepared device named `<claimUID>-<device>` (the claim UID keeps the runtime's spec cache from ever
serving a stale entry); the claim-wide edits (common device nodes such as /dev/nvidiactl, the claim
environment, and the family's common edits: for GPUs the driver root's libraries, binaries, firmware and
hooks, see gpu/cdi_edits.py) sit at spec level and apply whenever any of the spec's devices is injected.
Fully-qualified ids returned to the kubelet: `k8s.<driver>/claim=<claimUID>-<device>`.
Spec annotations `eks-dra.io/claim-namespace` and `eks-dra.io/claim-name` name the claim (CDI 0.6.0), so a
driver that lost its checkpoint reads each of its claims by name instead of listing the cluster's claims.
"""

from __future__ import annotations

import errno
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .fsutil import WriteError, atomic_write, read_no_follow

CDI_CLASS = "claim"
CLAIM_NAMESPACE_ANNOTATION = "eks-dra.io/claim-namespace"
CLAIM_NAME_ANNOTATION = "eks-dra.io/claim-name"
_SPEC_RE = re.compile(r"^k8s\.(?P<driver>.+)-claim_(?P<uid>[0-9a-fA-F-]{1,64})\.json$")


def vendor(driver: str) -> str:
    return f"k8s.{driver}"


def spec_file_name(driver: str, claim_uid: str) -> str:
    return f"{vendor(driver)}-{CDI_CLASS}_{claim_uid}.json"


def cdi_device_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def qualified_name(driver: str, claim_uid: str, device: str) -> str:
    return f"{vendor(driver)}/{CDI_CLASS}={cdi_device_name(claim_uid, device)}"


@dataclass
class DeviceEdits:
    """What one prepared device puts into the container."""

    name: str  # the published device name, e.g. gpu-3
    device_nodes: list[str] = field(default_factory=list)  # absolute paths on the node
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[dict] = field(default_factory=list)  # {hostPath, containerPath, options}
    hooks: list[dict] = field(default_factory=list)  # {hookName, path, args, env}


def minimum_version(spec: dict) -> str:
    """The lowest cdiVersion that covers what the spec uses (runtimes reject specs above their version)."""
    needs_05 = any(d["name"][:1].isdigit() for d in spec["devices"])
    edits = [spec.get("containerEdits") or {}] + [d["containerEdits"] for d in spec["devices"]]
    needs_05 = needs_05 or any("hostPath" in n for e in edits for n in e.get("deviceNodes", []))
    needs_06 = bool(spec.get("annotations")) or any(d.get("annotations") for d in spec["devices"])
    return "0.6.0" if needs_06 else "0.5.0" if needs_05 else "0.3.0"


def _edits(device_nodes: list[str], env: dict[str, str], mounts: list[dict], hooks: list[dict] | None = None,
           base: dict | None = None) -> dict:
    """CDI containerEdits: `base` (already in CDI form) first, then the given nodes, env, mounts and hooks."""
    base = base or {}
    out: dict = {}
    env_list = [*base.get("env", []), *(f"{k}={v}" for k, v in sorted(env.items()))]
    nodes = [*base.get("deviceNodes", []),
             *({"path": p} for p in device_nodes if {"path": p} not in base.get("deviceNodes", []))]
    for key, value in (("env", env_list), ("deviceNodes", nodes), ("mounts", [*base.get("mounts", []), *mounts]),
                       ("hooks", [*base.get("hooks", []), *(hooks or [])])):
        if value:
            out[key] = value
    return out


def build_spec(driver: str, claim_uid: str, devices: list[DeviceEdits], common_device_nodes: list[str],
               claim_env: dict[str, str], common_edits: dict | None = None,
               claim_namespace: str = "", claim_name: str = "") -> dict:
    """`claim_namespace`/`claim_name`: written as spec annotations (see the module docstring) when given."""
    if not devices:
        raise ValueError("a CDI spec needs at least one device")
    spec: dict = {
        "cdiVersion": "",
        "kind": f"{vendor(driver)}/{CDI_CLASS}",
        **({"annotations": {CLAIM_NAMESPACE_ANNOTATION: claim_namespace, CLAIM_NAME_ANNOTATION: claim_name}}
           if claim_namespace and claim_name else {}),
        "devices": [{"name": cdi_device_name(claim_uid, d.name),
                     "containerEdits": _edits(d.device_nodes, d.env, d.mounts, d.hooks)}
                    for d in devices],
    }
    common = _edits(common_device_nodes, claim_env, [], base=common_edits)
    if common:
        spec["containerEdits"] = common
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def claim_of(spec: dict) -> tuple[str, str]:
    """(namespace, name) of the claim a spec annotates; ("", "") for a spec without them (an older driver's)."""
    annotations = spec.get("annotations") if isinstance(spec.get("annotations"), dict) else {}
    namespace, name = annotations.get(CLAIM_NAMESPACE_ANNOTATION), annotations.get(CLAIM_NAME_ANNOTATION)
    if isinstance(namespace, str) and isinstance(name, str) and namespace and name:
        return namespace, name
    return "", ""


class CdiDir:
    """The driver's specs in one CDI directory."""

    def __init__(self, root: Path, driver: str, durable: bool = False) -> None:
        # No fsync by default: a spec lost with the page cache is lost in a power cut, i.e. a reboot, after
        # which the boot-id check rewrites every spec anyway (and /var/run/cdi is a tmpfs).
        self.root = Path(root)
        self.driver = driver
        self.durable = durable
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, claim_uid: str) -> Path:
        return self.root / spec_file_name(self.driver, claim_uid)

    def write(self, claim_uid: str, spec: dict) -> Path:
        """Write the claim's spec; returns once the file at its name was read back and holds exactly these bytes.

        Anything else raises WriteError (naming the file and the cause, e.g. no space left on device) and leaves
        no spec of the claim: a claim whose spec could not be written has none, never a torn one (the kubelet's
        retry or the reconciler writes it again).
        """
        path = self.path(claim_uid)
        # compact: the C encoder (an indent makes json use its pure-Python one, ~10x slower)
        data = json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()
        try:
            atomic_write(path, data, 0o644, self.durable)
            try:
                written = read_no_follow(path)
            except OSError as exc:
                raise WriteError(path, f"cannot read it back ({exc.strerror})") from exc
            if written != data:  # the JSON of `spec` itself: equal bytes are the spec meant, parsed the same
                raise WriteError(path, f"read back {len(written)} bytes that are not the {len(data)} written")
        except WriteError:
            self.remove(claim_uid)
            raise
        return path

    def read(self, claim_uid: str) -> dict | None:
        try:
            return json.loads(read_no_follow(self.path(claim_uid)))
        except (OSError, ValueError):
            return None

    def problem(self, claim_uid: str, devices: list[str]) -> str | None:
        """Why the claim's spec on disk does not give its containers `devices` (published names), or None.

        The text completes "the spec was ...": missing, a symlink, unreadable, not JSON (torn), or a spec of
        another kind or of other devices.
        """
        try:
            raw = read_no_follow(self.path(claim_uid))
        except FileNotFoundError:
            return "missing"
        except OSError as exc:
            return "a symlink" if exc.errno == errno.ELOOP else f"unreadable ({exc.strerror})"
        try:
            spec = json.loads(raw)
        except ValueError:
            return f"not valid JSON ({len(raw)} bytes: torn or overwritten)"
        kind = f"{vendor(self.driver)}/{CDI_CLASS}"
        if not isinstance(spec, dict) or spec.get("kind") != kind or not isinstance(spec.get("devices"), list):
            return f"not a CDI spec of kind {kind}"
        names = sorted(str(d.get("name")) for d in spec["devices"] if isinstance(d, dict))
        meant = sorted(cdi_device_name(claim_uid, d) for d in devices)
        if names != meant:
            return f"naming devices {', '.join(names) or 'none'} instead of {', '.join(meant)}"
        return None

    def remove(self, claim_uid: str) -> bool:
        try:
            os.unlink(self.path(claim_uid))
            return True
        except FileNotFoundError:
            return False

    def claim_uids(self) -> set[str]:
        """UIDs of this driver's claim specs present on disk (other drivers' specs are ignored)."""
        out = set()
        for entry in os.scandir(self.root):
            m = _SPEC_RE.match(entry.name)
            if m and m.group("driver") == self.driver:
                out.add(m.group("uid"))
        return out

    def remove_stale_temporaries(self) -> None:
        """Temporary files left by a crash in the middle of atomic_write."""
        prefix = f".{vendor(self.driver)}-{CDI_CLASS}_"
        for entry in os.scandir(self.root):
            if entry.name.startswith(prefix) and entry.name.endswith(".tmp"):
                os.unlink(entry.path)
