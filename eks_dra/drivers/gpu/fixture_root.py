"""A fixture driver root: the NVIDIA driver's user-space files as an AMI installs them, as fakes.

Libraries are code-free ELF shared objects (`elf.shared_object`) with the driver's real file names and
sonames, soname symlinks next to them, and an `/etc/ld.so.cache` (format 1.1, `ldcache.write`) listing
what ldconfig would list for the configured directories; glibc's `ldconfig -p -C <file>` reads it.
Binaries are shell scripts; `nvidia-smi` records its arguments in FIXTURE_SMI_LOG and changes nothing.
Firmware files are empty. `/run/nvidia-persistenced/socket` is an empty regular file standing for the
daemon's socket (nvcdi only checks that the path exists and is no directory).

Layouts (ASSUMPTION where noted: written from the packaging sources, not from a live node):
- "al2023": the AL2023 NVIDIA AMI, NVIDIA's driver RPMs: libraries in /usr/lib64 (VDPAU in
  /usr/lib64/vdpau) with soname links and `libcuda.so`/`libnvidia-ml.so` development links (ASSUMPTION),
  binaries in /usr/bin, GSP firmware in /usr/lib/firmware/nvidia/<version>/, `/lib -> usr/lib`,
  `/lib64 -> usr/lib64` (the AL2023 base image's merged /usr), nvidia-container-toolkit's
  /usr/bin/nvidia-cdi-hook and nvidia-ctk, /etc/ld.so.conf including /etc/ld.so.conf.d/*.conf.
- "bottlerocket": bottlerocket-core-kit `packages/kmod-*-nvidia/kmod-*-nvidia.spec`: libraries in
  `%{_cross_libdir}/nvidia/tesla` = /x86_64-bottlerocket-linux-gnu/sys-root/usr/lib/nvidia/tesla with soname
  links only, that directory in /etc/ld.so.conf.d/nvidia-tesla.conf ("libnvidia-container uses the ldcache
  file created by the service"), binaries in `%{_cross_bindir}`, firmware in
  `%{_cross_libdir}/firmware/nvidia/<version>/`; `/usr -> x86_64-bottlerocket-linux-gnu/sys-root/usr`,
  `usr/lib64 -> lib` and `/lib -> usr/lib` (ASSUMPTION: the image's top-level links). The NVIDIA libraries
  are in none of nvcdi's fixed search directories: only the ld cache finds them.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import elf, ldcache

LAYOUTS = ("al2023", "bottlerocket")
FIXTURE_SMI_LOG = Path("var/lib/eks-dra/fixture/nvidia-smi.calls")
HOOK_PATH = "/usr/bin/nvidia-cdi-hook"

# (file name with V for the driver version, soname with V); the NVIDIA Linux driver's compute, video and
# utility libraries (its README's "installed components"), plus the legacy NVVM and the unversioned
# libnvidia-api.so.1 that nvcdi mounts only behind a feature flag.
DRIVER_LIBRARIES = (
    ("libcuda.so.V", "libcuda.so.1"), ("libcudadebugger.so.V", "libcudadebugger.so.1"),
    ("libnvidia-ml.so.V", "libnvidia-ml.so.1"), ("libnvidia-cfg.so.V", "libnvidia-cfg.so.1"),
    ("libnvidia-nvvm.so.V", "libnvidia-nvvm.so.4"), ("libnvidia-nvvm70.so.4", "libnvidia-nvvm70.so.4"),
    ("libnvidia-ptxjitcompiler.so.V", "libnvidia-ptxjitcompiler.so.1"),
    ("libnvidia-opencl.so.V", "libnvidia-opencl.so.1"), ("libnvidia-gpucomp.so.V", "libnvidia-gpucomp.so.V"),
    ("libnvidia-allocator.so.V", "libnvidia-allocator.so.1"),
    ("libnvidia-pkcs11-openssl3.so.V", "libnvidia-pkcs11-openssl3.so.V"),
    ("libnvidia-encode.so.V", "libnvidia-encode.so.1"), ("libnvcuvid.so.V", "libnvcuvid.so.1"),
    ("libnvidia-opticalflow.so.V", "libnvidia-opticalflow.so.1"), ("libnvidia-tls.so.V", "libnvidia-tls.so.V"),
    ("libnvidia-api.so.1", "libnvidia-api.so.1"),
)
VDPAU_LIBRARIES = (("libvdpau_nvidia.so.V", "libvdpau_nvidia.so.1"),)
OTHER_LIBRARIES = (("libz.so.1.2.13", "libz.so.1"),)  # a system library the driver's rules must not pick
DEV_LINKS = (("libcuda.so", "libcuda.so.1"), ("libnvidia-ml.so", "libnvidia-ml.so.1"))
DRIVER_BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
                   "nvidia-cuda-mps-server")
TOOLKIT_BINARIES = ("nvidia-cdi-hook", "nvidia-ctk", "nvidia-container-runtime")
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
PERSISTENCED_SOCKET = "run/nvidia-persistenced/socket"


def _write(path: Path, data: bytes | str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    path.chmod(mode)


def _symlink(link: Path, target: str) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(target, link)


def _script(root: Path, path: str, body: str) -> None:
    _write(root / path.lstrip("/"), "#!/bin/sh\n" + body, 0o755)


def _smi_script(bindir: str) -> str:
    back = os.path.relpath("/", bindir)
    return ("# eks-dra fixture stand-in for nvidia-smi: records its arguments, changes nothing.\n"
            f'log="$(dirname "$(readlink -f "$0")")/{back}/{FIXTURE_SMI_LOG}"\n'
            'mkdir -p "$(dirname "$log")"\n'
            'printf "%s\\n" "$*" >> "$log"\n'
            'case "$1" in compute-policy) echo "Set compute policy for GPU $4";; esac\n')


def write_driver_root(root: Path, version: str, layout: str = "al2023", arm64: bool = False) -> list[str]:
    """Write the driver's user-space files for `layout` under `root`; returns the written paths (sorted)."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown driver-root layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    machine, arch = (elf.EM_AARCH64, ldcache.ARCH_AARCH64) if arm64 else (elf.EM_X86_64, ldcache.ARCH_X86_64)
    triple = "aarch64-bottlerocket-linux-gnu" if arm64 else "x86_64-bottlerocket-linux-gnu"
    if layout == "al2023":
        libdir, bindir, fwdir, conf_dirs = "/usr/lib64", "/usr/bin", "/usr/lib/firmware", ["/usr/lib64"]
        _symlink(root / "lib", "usr/lib")
        _symlink(root / "lib64", "usr/lib64")
        nvidia_dir, dev_links, vdpau = libdir, DEV_LINKS, VDPAU_LIBRARIES
    else:
        prefix = f"/{triple}/sys-root/usr"
        libdir, bindir, fwdir = f"{prefix}/lib", f"{prefix}/bin", f"{prefix}/lib/firmware"
        nvidia_dir = f"{libdir}/nvidia/tesla"
        conf_dirs = [nvidia_dir, libdir]
        _symlink(root / "usr", f"{triple}/sys-root/usr")
        _symlink(root / prefix.lstrip("/") / "lib64", "lib")
        _symlink(root / "lib", "usr/lib")
        dev_links, vdpau = (), ()
        _write(root / "etc/ld.so.conf.d/nvidia-tesla.conf", nvidia_dir + "\n")
    _write(root / "etc/ld.so.conf", "include ld.so.conf.d/*.conf\n")
    written: list[str] = []

    def library(directory: str, name: str, soname: str) -> None:
        name, soname = name.replace(".V", "." + version), soname.replace(".V", "." + version)
        _write(root / directory.lstrip("/") / name, elf.shared_object(soname, machine), 0o755)
        written.append(f"{directory}/{name}")
        if soname != name:
            _symlink(root / directory.lstrip("/") / soname, name)
            written.append(f"{directory}/{soname}")

    for name, soname in DRIVER_LIBRARIES:
        library(nvidia_dir, name, soname)
    for name, soname in vdpau:
        library(f"{nvidia_dir}/vdpau", name, soname)
    for name, soname in OTHER_LIBRARIES:
        library(libdir, name, soname)
    for link, target in dev_links:
        _symlink(root / nvidia_dir.lstrip("/") / link, target)
        written.append(f"{nvidia_dir}/{link}")
    for b in DRIVER_BINARIES:
        _script(root, f"{bindir}/{b}", _smi_script(bindir) if b == "nvidia-smi" else f"# fixture {b}\nexit 0\n")
        written.append(f"{bindir}/{b}")
    for b in TOOLKIT_BINARIES:
        _script(root, f"{bindir}/{b}", f"# fixture {b} (nvidia-container-toolkit)\nexit 0\n")
        written.append(f"{bindir}/{b}")
    for f in FIRMWARE:
        _write(root / fwdir.lstrip("/") / "nvidia" / version / f, b"")
        written.append(f"{fwdir}/nvidia/{version}/{f}")
    _write(root / PERSISTENCED_SOCKET, b"")
    written.append("/" + PERSISTENCED_SOCKET)
    ldcache.write(root / ldcache.CACHE_PATH, _cache_entries(root, conf_dirs), arch)
    written.append("/" + str(ldcache.CACHE_PATH))
    return sorted(written)


def _cache_entries(root: Path, dirs: list[str]) -> list[tuple[str, str]]:
    """What ldconfig caches for `dirs`: links to ELF libraries, and libraries named by their own soname."""
    out = []
    for d in dirs:
        local = root / d.lstrip("/")
        for entry in sorted(local.iterdir()) if local.is_dir() else []:
            if not entry.name.startswith("lib") or ".so" not in entry.name or entry.is_dir():
                continue
            target_soname = elf.soname(entry.resolve()) if entry.exists() else None
            if target_soname is None:
                continue
            if entry.is_symlink() or target_soname == entry.name:
                out.append((entry.name, f"{d}/{entry.name}"))
    return out
