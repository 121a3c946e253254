"""Real nodes for the e2e tier: the real kubelet and containerd + runc, joined to the tier's control plane.

Each `RealNode` runs in its own mount namespace (tests/e2e/node/ns.sh) so that two nodes share this machine
without sharing /var/lib/kubelet, /var/run/cdi, /var/log/pods or /dev: its containerd (own root, state and
socket), its kubelet (own cgroup root, ports, checkpoint) and the pods they run see the node's directories at
the paths the shipped DaemonSets name. See tests/e2e/README.md ("Real-node tier") for what is real here.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from controlplane import E2E_DIR, ControlPlane, wait_until

NODE_DIR = E2E_DIR / "node"
# Where each node's mount namespace shows its fixture host tree; the driver DaemonSet's host-root volume
# points here instead of "/" (the only change to the shipped manifests besides the image).
HOST_ROOT_PATH = "/run/eks-dra-e2e-host"
CNI_BIN_DIR = "/usr/lib/cni"
SERVICE_IP = "10.96.0.1"  # the apiserver's `kubernetes` Service (service-cluster-ip-range of up.go)
IPTABLES_COMMENT = "eks-dra-e2e-realnode"
# The character devices a node has in /dev that runc and the kubelet use (kmsg: the OOM watcher; 1 = mem, 5 = tty).
BASIC_DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9), "kmsg": (1, 11),
                 "tty": (5, 0)}
# Real majors of the accelerator device nodes the fixture names (nvidia: 195, nvidia-uvm/caps: dynamic on a
# real host, picked here; uverbs: 231 from 192; neuron: dynamic, picked here). Opening them fails (no driver);
# runc and containerd only stat them.
_MAJORS = {"nvidia-uvm": 510, "nvidia-caps": 511, "neuron": 512, "infiniband": 231, "nvidia": 195}


class ToolsMissing(RuntimeError):
    """A part of the real-node runtime cannot be built or installed here; the message is the skip line."""


@dataclass(frozen=True)
class NodeTools:
    runtime_dir: Path  # kubelet, containerd, ctr, containerd-shim-runc-v2
    images: dict  # name -> {"ref", "archive", "bytes"} from images.sh
    build_seconds: float

    @property
    def kubelet(self) -> Path:
        return self.runtime_dir / "kubelet"

    @property
    def containerd(self) -> Path:
        return self.runtime_dir / "containerd"

    @property
    def ctr(self) -> Path:
        return self.runtime_dir / "ctr"

    def ref(self, image: str) -> str:
        return self.images[image]["ref"]


_tools: NodeTools | None = None
_prebuild_error: Exception | None = None


def prebuild() -> None:
    """Build the tools ahead of the tests (conftest calls this after collection, outside per-test timeouts: a
    cold build takes ~15 min on 2 cores); ensure_tools() then returns the result or raises what happened."""
    global _prebuild_error
    try:
        ensure_tools()
    except Exception as exc:  # re-raised (or turned into a skip) by the first test that needs the tools
        _prebuild_error = exc


def _last_line(script: Path, what: str, timeout: float) -> str:
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=timeout)
    if proc.returncode == 127:
        raise ToolsMissing(f"real node: {proc.stderr.strip().splitlines()[-1]}")
    if proc.returncode != 0:
        raise RuntimeError(f"{script} ({what}) failed with exit code {proc.returncode}:\n"
                           + "\n".join((proc.stdout + proc.stderr).splitlines()[-40:]))
    return proc.stdout.strip().splitlines()[-1]


def ensure_tools() -> NodeTools:
    """Install the Debian packages (setup.sh), build or reuse the runtime (build.sh) and images (images.sh).

    Raises ToolsMissing with a one-line reason where this machine cannot run a real node."""
    global _tools
    if _tools is not None:
        return _tools
    if _prebuild_error is not None:
        raise _prebuild_error
    if os.geteuid() != 0:
        raise ToolsMissing("real node: needs root (containerd, runc, mount namespaces, mknod)")
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        raise ToolsMissing("real node: util-linux unshare/nsenter not found")
    start = time.monotonic()
    setup = subprocess.run(["bash", str(NODE_DIR / "setup.sh")], capture_output=True, text=True, timeout=900)
    if setup.returncode == 3:
        raise ToolsMissing(setup.stdout.strip() or "real node: setup.sh could not install the Debian packages")
    if setup.returncode != 0:
        raise RuntimeError(f"tests/e2e/node/setup.sh failed:\n{setup.stdout}{setup.stderr}")
    runtime = Path(_last_line(NODE_DIR / "build.sh", "kubelet + containerd build", 3600))
    images = json.loads(_last_line(NODE_DIR / "images.sh", "image builds", 3600))
    _tools = NodeTools(runtime, images, time.monotonic() - start)
    return _tools


def node_ip() -> str:
    """This machine's own (non-loopback) address: the kubelet refuses a loopback --node-ip."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent; picks the interface of the default route
        return s.getsockname()[0]


def _run(argv: list[str], timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
    return proc


def make_char_devices(host_root: Path) -> list[str]:
    """Turn the fixture's /dev placeholders (empty files) into character devices and add the basic ones.
    Returns the accelerator device nodes as absolute node paths."""
    dev = host_root / "dev"
    nodes = []
    minors: dict[int, int] = {}
    for path in sorted(p for p in dev.rglob("*") if p.is_file() or p.is_char_device()):
        rel = "/" + str(path.relative_to(host_root))
        nodes.append(rel)
        if path.is_char_device():
            continue
        name, parent = path.name, path.parent.name
        if parent in _MAJORS:  # dev/nvidia-caps/nvidia-capM, dev/infiniband/uverbsK
            major = _MAJORS[parent]
            minor = 192 + int(name[6:]) if name.startswith("uverbs") else minors.get(major, -1) + 1
        elif name.startswith("nvidia") and name[6:].isdigit():
            major, minor = 195, int(name[6:])
        elif name == "nvidiactl":
            major, minor = 195, 255
        else:
            major = next(m for prefix, m in _MAJORS.items() if name.startswith(prefix))
            minor = minors.get(major, -1) + 1
        minors[major] = max(minors.get(major, -1), minor)
        path.unlink()
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    for name, (major, minor) in BASIC_DEVICES.items():
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    # The disk under / (the kubelet's eviction manager and image GC look its device up in /dev).
    disk = os.stat("/").st_dev
    uevent = Path(f"/sys/dev/block/{os.major(disk)}:{os.minor(disk)}/uevent")
    name = dict(line.split("=", 1) for line in uevent.read_text().split()).get("DEVNAME") if uevent.exists() else None
    if name:
        os.mknod(dev / name, 0o600 | stat.S_IFBLK, disk)
    for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, dev / link)
    return nodes


class ApiServerRoute:
    """What kube-proxy would do for the `kubernetes` Service: DNAT SERVICE_IP:443 from the pod bridges to the
    API server on 127.0.0.1 (route_localnet on each bridge). Pods' in-cluster config then reaches it."""

    def __init__(self, port: int) -> None:
        self.rule = ["PREROUTING", "-d", SERVICE_IP, "-p", "tcp", "--dport", "443", "-m", "comment",
                     "--comment", IPTABLES_COMMENT, "-j", "DNAT", "--to-destination", f"127.0.0.1:{port}"]

    def add(self) -> None:
        self.remove_stale()
        _run(["iptables", "-t", "nat", "-I", *self.rule])

    @staticmethod
    def remove_stale() -> None:
        """Rules of a run that was killed before its teardown: they would send the Service to a dead port."""
        listed = _run(["iptables", "-t", "nat", "-S", "PREROUTING"], check=False).stdout or ""
        for line in listed.splitlines():
            if IPTABLES_COMMENT in line and line.startswith("-A "):
                _run(["iptables", "-t", "nat", "-D", *shlex.split(line[3:])], check=False)

    def remove(self) -> None:
        while _run(["iptables", "-t", "nat", "-D", *self.rule], check=False).returncode == 0:
            pass


def _kubelet_kubeconfig(admin: Path, node: str, out: Path) -> None:
    """The admin credentials impersonating system:node:<node> (group system:nodes): the Node authorizer and
    NodeRestriction judge every kubelet request as the node's own (the tier keeps no CA key to mint a node
    certificate)."""
    cfg = yaml.safe_load(admin.read_text())
    for user in cfg["users"]:
        user["user"]["as"] = f"system:node:{node}"
        user["user"]["as-groups"] = ["system:nodes", "system:authenticated"]
    out.write_text(yaml.safe_dump(cfg))


class RealNode:
    """One real node: mount namespace holder, containerd, kubelet, all logging under `root`."""

    def __init__(self, cp: ControlPlane, tools: NodeTools, name: str, index: int, labels: dict[str, str],
                 taints: list[dict], instance_type: str, mig_profile: str | None = None) -> None:
        self.cp, self.tools, self.name, self.index = cp, tools, name, index
        self.labels, self.taints, self.instance_type, self.mig_profile = labels, taints, instance_type, mig_profile
        self.root = Path(f"/tmp/rn-{index}-{os.getpid()}")  # short: unix socket paths are limited
        self.bridge = f"rnbr{index}-{os.getpid() % 10000}"
        self.subnet = f"10.{200 + index}.0"
        self.holder: subprocess.Popen | None = None
        self.containerd: subprocess.Popen | None = None
        self.kubelet: subprocess.Popen | None = None
        self.device_nodes: list[str] = []

    # --- paths ---------------------------------------------------------------------------

    @property
    def host_root(self) -> Path:
        return self.root / "host"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def socket(self) -> Path:
        return self.root / "containerd.sock"

    def checkpoint_claims(self, driver: str) -> dict:
        """Claims in the driver's checkpoint (its default state dir: <plugins dir>/<driver>)."""
        path = self.kubelet_dir / "plugins" / driver / "checkpoint.json"
        return json.loads(path.read_text())["data"]["claims"] if path.exists() else {}

    def cdi_specs(self) -> dict[str, dict]:
        return {p.name: json.loads(p.read_text()) for p in sorted(self.cdi_dir.glob("*.json"))}

    # --- set-up --------------------------------------------------------------------------

    def prepare(self, eks_dra: Path) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        for d in ("kubelet", "cdi", "pod-logs", "containerd/root", "containerd/state", "cni/conf", "cni/ipam"):
            (self.root / d).mkdir(parents=True)
        _run([str(eks_dra), "fixture", "--instance-type", self.instance_type, "--out", str(self.host_root),
              "--node-name", self.name, *(["--mig-profile", self.mig_profile] if self.mig_profile else [])],
             timeout=120)
        self.device_nodes = make_char_devices(self.host_root)
        # The GPU driver's CDI specs name host paths under its driver root (libraries, nvidia-cdi-hook) that
        # containerd and runc open in the node's mount namespace, where the fixture is HOST_ROOT_PATH. This link
        # lets the plugin, which sees the host at /host, find the same paths under that name.
        link = self.host_root / HOST_ROOT_PATH.lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink():
            link.unlink()
        link.symlink_to(Path(os.path.relpath(self.host_root, link.parent)))
        for d in ("/var/lib/kubelet", "/run/cdi", "/var/log/pods", HOST_ROOT_PATH):
            Path(d).mkdir(parents=True, exist_ok=True)
        self._write_containerd_config()
        self._write_cni_config()
        self._write_kubelet_config()
        _kubelet_kubeconfig(self.cp.kubeconfig, self.name, self.root / "kubelet.kubeconfig")

    def _write_containerd_config(self) -> None:
        r = self.root
        (r / "containerd.toml").write_text(f"""version = 3
root = "{r}/containerd/root"
state = "{r}/containerd/state"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{self.tools.ref('pause')}"
[plugins."io.containerd.cri.v1.runtime"]
  cdi_spec_dirs = ["/var/run/cdi"]
  # No CAP_SYS_RESOURCE in this sandbox: runc cannot lower oom_score_adj (sandboxes ask for -998).
  restrict_oom_score_adj = true
[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["{CNI_BIN_DIR}"]
  conf_dir = "{r}/cni/conf"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "{shutil.which('runc') or '/usr/sbin/runc'}"
  SystemdCgroup = false
""")

    def _write_cni_config(self) -> None:
        conf = {"cniVersion": "1.0.0", "name": f"rn{self.index}", "plugins": [
            {"type": "bridge", "bridge": self.bridge, "isGateway": True, "ipMasq": False,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": f"{self.subnet}.0/24"}]],
                      "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(self.root / "cni/ipam")}},
            {"type": "loopback"}]}
        (self.root / "cni/conf/10-bridge.conflist").write_text(json.dumps(conf))

    def _write_kubelet_config(self) -> None:
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{self.cgroup_root}",
            "failSwapOn": False, "containerRuntimeEndpoint": f"unix://{self.socket}",
            "port": 10250 + 10 * self.index, "healthzPort": 10248 + 10 * self.index, "readOnlyPort": 0,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "registerNode": True, "rotateCertificates": False, "serverTLSBootstrap": False,
            "registerWithTaints": [{"key": t["key"], "value": t.get("value"), "effect": t["effect"]}
                                   for t in self.taints],
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "nodeStatusUpdateFrequency": "5s", "shutdownGracePeriod": "0s",
            "resolvConf": "", "localStorageCapacityIsolation": False,
        }  # fmt: skip
        (self.root / "kubelet.yaml").write_text(yaml.safe_dump(config))

    @property
    def cgroup_root(self) -> str:
        return f"rn{self.index}-{os.getpid()}"

    def _cgroups(self) -> list[Path]:
        """The node's cgroup root (the kubelet requires it to exist): one directory on a cgroup v2 host, one in
        every hierarchy on a cgroup v1 host (this project's machines)."""
        base = Path("/sys/fs/cgroup")
        if (base / "cgroup.controllers").exists():
            return [base / self.cgroup_root]
        return [h / self.cgroup_root for h in sorted(base.iterdir()) if h.is_dir() and h.name != "unified"]

    def _bridge_up(self) -> None:
        # A bridge of a killed earlier run holds this node's subnet: pods' replies would be routed there.
        listed = _run(["ip", "-o", "link", "show", "type", "bridge"], check=False).stdout or ""
        for name in (line.split(": ")[1].split("@")[0] for line in listed.splitlines() if ": " in line):
            if name.startswith(f"rnbr{self.index}-") and name != self.bridge:
                _run(["ip", "link", "del", name], check=False)
        if _run(["ip", "link", "show", self.bridge], check=False).returncode != 0:
            _run(["ip", "link", "add", self.bridge, "type", "bridge"])
            _run(["ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        Path(f"/proc/sys/net/ipv4/conf/{self.bridge}/route_localnet").write_text("1\n")

    # --- processes -----------------------------------------------------------------------

    def _spawn(self, argv: list[str], log: str) -> subprocess.Popen:
        env = {**os.environ, "PATH": f"{self.tools.runtime_dir}:{os.environ['PATH']}"}
        with open(self.root / log, "ab") as out:
            out.write(f"\n=== {time.strftime('%H:%M:%S')} start\n".encode())
            out.flush()
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def _in_ns(self, argv: list[str]) -> list[str]:
        assert self.holder is not None
        return ["nsenter", f"--mount=/proc/{self.holder.pid}/ns/mnt", "--", *argv]

    def start(self) -> RealNode:
        self._bridge_up()
        for cgroup in self._cgroups():
            cgroup.mkdir(exist_ok=True)
        ready = self.root / "ns.ready"
        ready.unlink(missing_ok=True)
        self.holder = self._spawn(["unshare", "--mount", "--propagation", "slave", "--", "bash",
                                   str(NODE_DIR / "ns.sh"), str(self.root), HOST_ROOT_PATH], "ns.log")
        wait_until(lambda: ready.exists() or self._died(self.holder, "ns.log"), 20, what=f"{self.name} namespace")
        self.start_containerd()
        for image in sorted(set(self.tools.images) - {"base"}):  # the base only feeds the driver's build
            self.ctr("images", "import", self.tools.images[image]["archive"], timeout=300)
        self.start_kubelet()
        return self

    def _died(self, proc: subprocess.Popen | None, log: str) -> bool:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{self.name}: {log} process exited ({proc.returncode}):\n{self.log_tail(log)}")
        return False

    def start_containerd(self) -> None:
        self.containerd = self._spawn(self._in_ns([str(self.tools.containerd), "--config",
                                                   str(self.root / "containerd.toml")]), "containerd.log")

        def serving():
            self._died(self.containerd, "containerd.log")
            return self.ctr("version", check=False).returncode == 0

        wait_until(serving, 30, what=f"{self.name} containerd")

    def start_kubelet(self) -> None:
        self.kubelet = self._spawn(self._in_ns([
            str(self.tools.kubelet), "--config", str(self.root / "kubelet.yaml"),
            "--kubeconfig", str(self.root / "kubelet.kubeconfig"), "--hostname-override", self.name,
            "--node-ip", node_ip(), "--node-labels", ",".join(f"{k}={v}" for k, v in self.labels.items()),
            "--v", "2"]), "kubelet.log")

    def ctr(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        return _run(self._in_ns([str(self.tools.ctr), "--address", str(self.socket), "--namespace", "k8s.io",
                                 *args]), timeout=timeout, check=check)

    def exec(self, container_id: str, script: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run `sh -c script` inside a running container through containerd (as `kubectl exec` would)."""
        exec_id = f"chk-{time.monotonic_ns()}"
        return self.ctr("tasks", "exec", "--exec-id", exec_id, container_id, "sh", "-c", script,
                        timeout=timeout, check=False)

    def stop_kubelet(self) -> None:
        _stop(self.kubelet)
        self.kubelet = None

    def stop_containerd(self) -> None:
        _stop(self.containerd)
        self.containerd = None

    def stop(self) -> None:
        """Stop the kubelet, every container of the node, containerd and the namespace."""
        self.stop_kubelet()
        if self.containerd is not None and self.containerd.poll() is None:
            self.kill_containers()
        self.stop_containerd()
        _stop(self.holder, signal.SIGKILL)
        self.holder = None

    def kill_containers(self) -> None:
        """SIGKILL every task of the node (what a power cut does) and remove them from containerd."""
        listing = self.ctr("tasks", "list", "-q", check=False).stdout.split()
        for task in listing:
            self.ctr("tasks", "kill", "--signal", "SIGKILL", task, check=False)
        for task in listing:
            self.ctr("tasks", "delete", "--force", task, check=False)
        for container in self.ctr("containers", "list", "-q", check=False).stdout.split():
            self.ctr("containers", "delete", container, check=False)

    def remove(self) -> None:
        _run(["ip", "link", "del", self.bridge], check=False)
        for cgroup in self._cgroups():
            for d in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                d.rmdir()
            if cgroup.is_dir():
                cgroup.rmdir()
        shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self, log: str = "kubelet.log", lines: int = 30) -> str:
        try:
            return "\n".join((self.root / log).read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


def _stop(proc: subprocess.Popen | None, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
