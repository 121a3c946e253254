"""Drive the Go `e2e-cluster` binary: a real Kubernetes 1.34 (or 1.36) control plane and kubelet stand-ins.

Only the standard library and PyYAML are used here, so that fixtures can import this module
before (or without) the Kubernetes client.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

E2E_DIR = Path(__file__).resolve().parent
BUILD_SCRIPT = E2E_DIR / "build.sh"
PREPARED_ANNOTATION = "e2e.eks-dra.io/prepared"

_binaries: dict[str, Path] = {}
# The tier's Kubernetes version: 1.34 (cluster/go.mod) unless E2E_KUBERNETES names another (cluster/go-1.36.mod).
DEFAULT_VERSION = "1.34"
TIER_VERSION = os.environ.get("E2E_KUBERNETES", DEFAULT_VERSION)


# k8s.io/kubernetes v1.34.12 and its staging modules declare `go 1.25.0`; build.sh sets GOTOOLCHAIN=local.
MIN_GO = (1, 25)


def go_available() -> bool:
    return shutil.which("go") is not None


def go_version() -> tuple[int, int] | None:
    """(major, minor) of the `go` on PATH, or None if it cannot be told."""
    try:
        out = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = out.strip().removeprefix("go").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def ensure_binary(version: str = TIER_VERSION) -> Path:
    """Build (or reuse the cached) e2e-cluster binary of a Kubernetes version and return its path.

    E2E_CLUSTER_BIN, when set, names a prebuilt binary of the tier's version and skips its build.
    """
    if version in _binaries:
        return _binaries[version]
    override = os.environ.get("E2E_CLUSTER_BIN") if version == TIER_VERSION else None
    if override:
        if not os.access(override, os.X_OK):
            raise RuntimeError(f"E2E_CLUSTER_BIN={override} is not an executable file")
        _binaries[version] = Path(override)
        return _binaries[version]
    proc = subprocess.run(["bash", str(BUILD_SCRIPT), version], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{BUILD_SCRIPT} failed with exit code {proc.returncode}:\n{_tail(proc.stdout + proc.stderr, 60)}"
        )
    lines = proc.stdout.strip().splitlines()
    if not lines or not Path(lines[-1]).is_file():
        raise RuntimeError(f"{BUILD_SCRIPT} did not print the binary path as its last line:\n{proc.stdout}")
    _binaries[version] = Path(lines[-1])
    return _binaries[version]


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


class _Process:
    """One long-running e2e-cluster subcommand whose output goes to a log file."""

    def __init__(self, name: str, log_path: Path):
        self.name = name
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def spawn(self, argv: list[str]) -> None:
        if self.running:
            raise RuntimeError(f"{self.name} is already running (pid {self.proc.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== {time.strftime('%H:%M:%S')} start: {' '.join(argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return _tail(self.log_path.read_text(errors="replace"), lines)
        except FileNotFoundError:
            return "(no log)"

    def wait_for(self, path: Path, timeout: float) -> None:
        """Wait for the process to write `path`; on failure stop it and raise with the log's tail."""
        try:
            self._wait_for(path, timeout)
        except Exception:
            self.stop(timeout=10)
            raise

    def _wait_for(self, path: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(
                    f"{self.name} exited (code {code}) before writing {path}; log {self.log_path}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.name} did not write {path} within {timeout:.0f}s; log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def stop(self, timeout: float = 45) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        return code


class ControlPlane:
    """etcd + kube-apiserver + kube-scheduler + kube-controller-manager in one process (`e2e-cluster up`).

    `restart()` stops and starts the process with the same etcd directory: all objects survive,
    and the apiserver comes back on the same port with the same certificates and signing key, so
    kubeconfigs and tokens handed out before stay valid.
    """

    def __init__(self, binary: Path, dir: Path | None = None, etcd_dir: Path | None = None, ready_timeout: float = 180):
        self.binary = Path(binary)
        self.ready_timeout = ready_timeout
        self.dir: Path | None = None
        self.etcd_dir: Path | None = None
        self._proc: _Process | None = None
        if dir is not None:
            self._set_dirs(Path(dir), etcd_dir)

    def _set_dirs(self, dir: Path, etcd_dir: Path | None) -> None:
        self.dir = Path(dir)
        self.etcd_dir = Path(etcd_dir) if etcd_dir else self.dir / "etcd"
        self._proc = _Process("e2e-cluster up", self.dir / "up.log")

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "admin.kubeconfig"

    @property
    def log_path(self) -> Path:
        return self._proc.log_path

    @property
    def server(self) -> str:
        return (self.dir / "ready").read_text().strip()

    def start(self, dir: Path | None = None, etcd_dir: Path | None = None) -> ControlPlane:
        """Start `up`; `dir`/`etcd_dir` may be given here instead of to the constructor."""
        if dir is not None:
            if self._proc is not None and self._proc.running:
                raise RuntimeError("stop the control plane before starting it in another directory")
            self._set_dirs(Path(dir), etcd_dir)
        if self.dir is None:
            raise ValueError("ControlPlane needs a state directory (constructor or start(dir))")
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "ready").unlink(missing_ok=True)
        self._proc.spawn([str(self.binary), "up", "--dir", str(self.dir), "--etcd-dir", str(self.etcd_dir)])
        self._proc.wait_for(self.dir / "ready", self.ready_timeout)
        return self

    def stop(self) -> None:
        if self._proc is None:
            return
        code = self._proc.stop()
        if code not in (None, 0):
            raise RuntimeError(f"e2e-cluster up exited with code {code}; log {self.log_path}:\n{self._proc.log_tail()}")

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 40) -> str:
        return self._proc.log_tail(lines) if self._proc else "(not started)"

    def kubeconfig_data(self) -> dict:
        return yaml.safe_load(self.kubeconfig.read_text())

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class KubeletStandIn:
    """`e2e-cluster kubelet` for one simulated node.

    Directories default to a short path under /tmp because unix socket paths are limited to
    about 108 bytes. The registry dir is what drivers get as --registry-dir, the plugins dir
    as --plugins-dir.
    """

    def __init__(self, binary: Path, kubeconfig: Path, node: str, root: Path | None = None, ready_timeout: float = 60):
        self.binary = Path(binary)
        self.kubeconfig = Path(kubeconfig)
        self.node = node
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix=f"e2e-{node[:20]}-", dir="/tmp"))
        self.registry_dir = self.root / "registry"
        self.plugins_dir = self.root / "plugins"
        self.state_dir = self.root / "state"
        self.report_path = self.root / "report.jsonl"
        self.ready_timeout = ready_timeout
        self._proc = _Process(f"kubelet stand-in {node}", self.root / "kubelet.log")

    @property
    def log_path(self) -> Path:
        return self._proc.log_path

    def start(self) -> KubeletStandIn:
        ready = self.root / "kubelet.ready"
        ready.unlink(missing_ok=True)
        self._proc.spawn(
            [
                str(self.binary), "kubelet",
                "--kubeconfig", str(self.kubeconfig),
                "--node", self.node,
                "--registry-dir", str(self.registry_dir),
                "--plugins-dir", str(self.plugins_dir),
                "--state-dir", str(self.state_dir),
                "--report", str(self.report_path),
                "--ready-file", str(ready),
            ]
        )  # fmt: skip
        self._proc.wait_for(ready, self.ready_timeout)
        return self

    def stop(self) -> None:
        self._proc.stop()

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 40) -> str:
        return self._proc.log_tail(lines)

    def events(self, event: str | None = None) -> list[dict]:
        """The JSON lines of --report, optionally only those of one kind ("prepare" / "unprepare")."""
        try:
            lines = self.report_path.read_text().splitlines()
        except FileNotFoundError:
            return []
        entries = [json.loads(line) for line in lines if line.strip()]
        return [e for e in entries if event is None or e.get("event") == event]

    def wait_registered(self, driver: str, count: int = 1, timeout: float = 60) -> dict:
        """Wait until `driver` registered successfully `count` times in total; return that event.

        Registration events: {"event": "register", "driver", "endpoint", "versions", ["error"]} and
        {"event": "deregister", "driver", "endpoint"}.
        """

        def registered():
            ok = [e for e in self.events("register") if e["driver"] == driver and not e.get("error")]
            return ok[count - 1] if len(ok) >= count else None

        try:
            return wait_until(registered, timeout, what=f"registration #{count} of {driver} on {self.node}")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; kubelet log {self.log_path}:\n{self.log_tail()}") from exc

    def __enter__(self) -> KubeletStandIn:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def sa_kubeconfig(binary: Path, kubeconfig: Path, namespace: str, serviceaccount: str, node: str, out: Path) -> Path:
    """Write a kubeconfig authenticating as namespace/serviceaccount with a token bound to a
    placeholder pod on `node`, so requests carry the authentication.kubernetes.io/node-name extra."""
    proc = subprocess.run(
        [
            str(binary), "token",
            "--kubeconfig", str(kubeconfig),
            "--namespace", namespace,
            "--serviceaccount", serviceaccount,
            "--node", node,
            "--out", str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"e2e-cluster token failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return Path(out)


def wait_until(condition, timeout: float = 60, interval: float = 0.2, what: str = "condition"):
    """Poll `condition()` until it returns a truthy value, which is returned."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except AssertionError:
            raise
        except Exception as exc:  # noqa: BLE001 - retried until the deadline, then reported
            last_exc = exc
        time.sleep(interval)
    raise TimeoutError(
        f"timed out after {timeout:.0f}s waiting for {what}" + (f" (last error: {last_exc})" if last_exc else "")
    )
