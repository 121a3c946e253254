"""`python -m eks_dra.drivers.gpu.gpu_check` (`make gpu-check`): GPU discovery on the real host, read-only.

Prints what sysfs and NVML (libnvidia-ml.so.1 loaded from the driver root by explicit path, as the plugin
does) each report about the NVIDIA GPUs, the inventory's readiness and health, the CDI edits from the
driver root and their comparison with NVIDIA's own generator (nvidia-container-toolkit's pkg/nvcdi with
the real NVML, built by tests/nvidia_ctk/build.sh; skipped with a line when Go is missing), and the
ResourceSlice(s) the gpu driver would publish, as YAML. Needs no Kubernetes API and writes nothing but
the reference's build cache. Exit codes: 0 ready and equivalent, 1 no NVIDIA GPU or no NVML, 3 GPUs
found but the inventory is not ready (the reason is printed), 4 our CDI edits differ from nvcdi's.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import sys
from pathlib import Path
from typing import TextIO

from eks_dra.devices import DEFAULT_DRIVER_NAMES, resource_slices

from ..framework.hosttree import PciFunction, instance_type_of, is_fixture, list_pci_functions
from . import equivalence
from .discovery import GPU_PCI_CLASSES, NVIDIA_VENDOR
from .family import FAMILY
from .host import GpuHost
from .nvml import NvmlBackend


def _sysfs_table(host_root: Path, problems: list[str]) -> list[PciFunction]:
    return [f for f in list_pci_functions(host_root, NVIDIA_VENDOR, problems) if f.class_code >> 8 in GPU_PCI_CLASSES]


def check(host_root: Path, node_name: str, driver: str, nvml: NvmlBackend | None,
          out: TextIO = sys.stdout, gpu_host: GpuHost | None = None, reference: Path | None = None) -> int:
    """reference: the nvcdi-fixture binary to compare the CDI edits with (None: no comparison)."""
    import yaml

    problems: list[str] = []
    pci = _sysfs_table(host_root, problems)
    print(f"# host root {host_root}, node {node_name}, driver {driver}", file=out)
    it = instance_type_of(host_root)
    print(f"# instance type (DMI): {it.name if it else 'not in the eks-dra catalog'}", file=out)
    print(f"# sysfs: {len(pci)} NVIDIA GPU PCI functions", file=out)
    for f in pci:
        print(f"#   {f.address} device={f.device:#06x} class={f.class_code:#08x} numa={f.numa_node} "
              f"pcieRoot={f.root}", file=out)
    for p in problems:
        print(f"#   problem: {p}", file=out)
    if nvml is None:
        print("error: NVML is unavailable (nvidia-ml-py installed? libnvidia-ml.so.1 and the NVIDIA driver "
              "loaded?)", file=sys.stderr)
        return 1
    try:
        gpus = nvml.gpus()
        print(f"# NVML: driver {nvml.driver_version()}, {len(gpus)} GPUs", file=out)
    except Exception as exc:  # report and go on: discovery falls back to /proc/driver/nvidia
        print(f"# NVML FAILED: {exc.__class__.__name__}: {exc}", file=out)
        gpus = []
    for g in gpus:
        sms = g.multiprocessors if g.multiprocessors else "n/a"
        print(f"#   minor {g.minor} {g.pci_address} {g.uuid} {g.name!r} {g.architecture} cc {g.cuda_compute_capability}"
              f" {g.memory_mib}Mi sms {sms} pciDeviceId {g.pci_device_id:#06x} mig {'on' if g.mig_enabled else 'off'}"
              f" ({len(g.migs)} MIG devices)", file=out)
        for m in g.migs:
            print(f"#     {m.profile} gi {m.gpu_instance_id} ci {m.compute_instance_id} {m.uuid} {m.memory_mib}Mi"
                  f" sms {m.multiprocessors}", file=out)
    if not pci and not gpus:
        print("error: no NVIDIA GPU found in sysfs or NVML", file=sys.stderr)
        return 1
    only_sysfs = {f.address for f in pci} - {g.pci_address for g in gpus}
    only_nvml = {g.pci_address for g in gpus} - {f.address for f in pci}
    for a in sorted(only_sysfs):
        print(f"# MISMATCH: {a} is on the PCI bus but NVML does not report it", file=out)
    for a in sorted(only_nvml):
        print(f"# MISMATCH: NVML reports {a} but sysfs has no such PCI function", file=out)
    gpu_host = gpu_host or GpuHost.for_node(host_root)
    inventory = FAMILY.discover(host_root, host=gpu_host, nvml=nvml)
    print(f"# inventory: ready={inventory.ready} ({inventory.reason})", file=out)
    print(f"# common device nodes: {', '.join(inventory.common_device_nodes) or 'none'}", file=out)
    for d in inventory.devices:
        state = "healthy" if d.healthy else f"UNHEALTHY: {d.health_reason}"
        print(f"#   {d.device.name}: {state}; nodes {' '.join(d.device_nodes)}", file=out)
    edits = inventory.common_edits
    print(f"# driver root {gpu_host.driver_root.path} (host {gpu_host.driver_root.host_path}): "
          f"{len(edits.get('mounts', []))} mounts, {len(edits.get('hooks', []))} hooks, env {edits.get('env', [])}",
          file=out)
    for m in edits.get("mounts", []):
        print(f"#   mount {m['hostPath']} -> {m['containerPath']}", file=out)
    differ = False
    if reference is not None and gpus and edits:
        request = {"driverRoot": str(gpu_host.driver_root.path), "hookPath": gpu_host.hook(),
                   "driverVersion": nvml.driver_version(), "gpus": equivalence.gpus_from_nvml(gpus)}
        fixture = is_fixture(host_root)  # a fixture tree has no real NVML: the reference mocks it
        if not fixture:
            request["realNvmlLibrary"] = str(gpu_host.driver_root.nvml_library())
        lines = equivalence.compare(inventory, equivalence.run_reference(reference, request))
        print(f"# nvidia-ctk equivalence (pkg/nvcdi, {'mock' if fixture else 'real'} NVML): "
              f"{'EQUAL' if not lines else 'DIFFERENT'}", file=out)
        for line in lines:
            print(f"#   {line}", file=out)
        differ = bool(lines)
    published = [d.device for d in inventory.devices if d.healthy]
    yaml.safe_dump_all(resource_slices(driver, node_name, published), out, sort_keys=False)
    return 3 if not inventory.ready else 4 if differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eks_dra.drivers.gpu.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--host-root", type=Path, default=Path("/"))
    parser.add_argument("--node-name", default=socket.gethostname())
    parser.add_argument("--driver-name", default=DEFAULT_DRIVER_NAMES.gpu)
    parser.add_argument("--driver-root", default="/", help="host path of the NVIDIA driver root (default /)")
    parser.add_argument("--nvidia-cdi-hook-path", help="host path of nvidia-cdi-hook (default: searched)")
    parser.add_argument("--no-reference", action="store_true", help="skip the nvidia-ctk (pkg/nvcdi) comparison")
    args = parser.parse_args(argv)
    gpu_host = GpuHost.for_node(args.host_root, args.driver_root, hook_path=args.nvidia_cdi_hook_path)
    nvml: NvmlBackend | None = gpu_host.nvml()
    if nvml is None:
        print(f"# NVML unavailable: {gpu_host.nvml_error}", file=sys.stderr)
    reference = None
    if not args.no_reference and nvml is not None:
        if shutil.which("go") is None:
            print("# nvidia-ctk equivalence SKIPPED: Go toolchain not found on PATH (tests/nvidia_ctk/build.sh "
                  "needs Go >= 1.24 and a C compiler)", file=sys.stderr)
        else:
            try:
                reference = equivalence.build_reference()
            except RuntimeError as exc:
                print(f"# nvidia-ctk equivalence SKIPPED: the reference did not build: {exc}", file=sys.stderr)
    return check(args.host_root, args.node_name, args.driver_name, nvml, gpu_host=gpu_host, reference=reference)


if __name__ == "__main__":
    sys.exit(main())
