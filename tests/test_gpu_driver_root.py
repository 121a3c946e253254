"""The GPU driver root: nvcdi's search rules on AL2023 and Bottlerocket layouts, the ld cache, ELF sonames,
the MIG marker, and what happens when something is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from eks_dra.devices.gpu import DEFAULT_DRIVER_VERSION as V
from eks_dra.drivers.families import discover
from eks_dra.drivers.fixture import set_boot_id, write_fixture
from eks_dra.drivers.framework import hosttree
from eks_dra.drivers.gpu import elf, ldcache
from eks_dra.drivers.gpu import mig as mig_marker
from eks_dra.drivers.gpu.driver_root import DriverRoot, DriverRootError, resolve_in_root
from eks_dra.drivers.gpu.fixture_root import write_driver_root
from eks_dra.drivers.gpu.host import GpuHost
from eks_dra.drivers.main import BadArguments, build_parser, config_from_args, family_host_from_args

NODE = "fixture-node"
BR = "/x86_64-bottlerocket-linux-gnu/sys-root/usr"
COMPUTE = ("libcuda", "libcudadebugger", "libnvidia-ml", "libnvidia-cfg", "libnvidia-nvvm", "libnvidia-ptxjitcompiler",
           "libnvidia-opencl", "libnvidia-gpucomp", "libnvidia-allocator", "libnvidia-pkcs11-openssl3",
           "libnvidia-encode", "libnvcuvid", "libnvidia-opticalflow", "libnvidia-tls")


def _root(tmp_path: Path, layout: str) -> DriverRoot:
    write_driver_root(tmp_path, V, layout)
    return DriverRoot(tmp_path, kernel_release="6.1.0-test")


def test_al2023_layout_found_through_the_fixed_search_paths(tmp_path):
    root = _root(tmp_path, "al2023")
    (tmp_path / "etc/ld.so.cache").unlink()  # /usr/lib64 is a fixed search path: no ld cache needed
    assert root.version() == V
    assert root.library_dirs() == ["/usr/lib64"]
    paths = [f.path for f in root.libraries()]
    assert paths == sorted(f"/usr/lib64/{n}.so.{V}" for n in COMPUTE) + [
        f"/usr/lib64/vdpau/libvdpau_nvidia.so.{V}", "/usr/lib64/libnvidia-nvvm70.so.4"]
    # resolved files only: no soname links, no development links, no unversioned or foreign libraries
    assert not any(p.endswith((".so.1", ".so")) for p in paths if "nvvm70" not in p)
    assert "/usr/lib64/libnvidia-api.so.1" not in paths and not any("libz" in p for p in paths)
    assert [f.path for f in root.binaries()] == [f"/usr/bin/{b}" for b in (
        "nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server")]
    assert [f.path for f in root.firmware()] == [f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin",
                                                 f"/lib/firmware/nvidia/{V}/gsp_tu10x.bin"]
    assert [f.path for f in root.ipc()] == ["/run/nvidia-persistenced/socket"]
    assert root.nvml_library() == tmp_path / "usr/lib64/libnvidia-ml.so.1"


def test_bottlerocket_libraries_are_found_only_through_the_ld_cache(tmp_path):
    root = _root(tmp_path, "bottlerocket")
    assert root.library_dirs() == [f"{BR}/lib/nvidia/tesla"]
    paths = [f.path for f in root.libraries()]
    assert sorted(paths) == sorted([f"{BR}/lib/nvidia/tesla/{n}.so.{V}" for n in COMPUTE]
                                   + [f"{BR}/lib/nvidia/tesla/libnvidia-nvvm70.so.4"])
    assert [f.path for f in root.binaries()][0] == "/usr/bin/nvidia-smi"  # /usr -> the sys-root's usr
    assert root.binary("nvidia-smi").local.resolve() == (tmp_path / BR.lstrip("/") / "bin/nvidia-smi").resolve()
    assert [f.path for f in root.firmware()] == [f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin",
                                                 f"/lib/firmware/nvidia/{V}/gsp_tu10x.bin"]
    # without the ld cache nothing is found, and the error names the root and what was looked for
    (tmp_path / "etc/ld.so.cache").unlink()
    with pytest.raises(DriverRootError, match=rf"driver root {tmp_path}: no libcuda.so.\*.\* or libnvidia-ml"):
        DriverRoot(tmp_path).version()


def test_bottlerocket_spec_works_without_any_env_var_side_effect(tmp_path):
    """What an unprivileged pod on Bottlerocket needs comes from the spec's own edits: the libraries, the
    ldcache hook for their directory and the libcuda.so link; the only NVIDIA_* env is the "void" guard."""
    root = write_fixture("p5.48xlarge", tmp_path / "h", node_name=NODE, os_layout="bottlerocket")
    edits = discover("gpu", root, NODE).common_edits
    tesla = f"{BR}/lib/nvidia/tesla"
    assert {"hostPath": f"{tesla}/libcuda.so.{V}", "containerPath": f"{tesla}/libcuda.so.{V}",
            "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"]} in edits["mounts"]
    args = {h["args"][1]: h["args"][2:] for h in edits["hooks"]}
    assert args["update-ldcache"] == ["--folder", tesla]
    assert f"libcuda.so.1::{tesla}/libcuda.so" in args["create-symlinks"]
    assert [e for e in edits["env"] if e.startswith("NVIDIA_")] == [f"NVIDIA_CTK_LIBCUDA_DIR={tesla}",
                                                                  "NVIDIA_VISIBLE_DEVICES=void"]


def test_the_first_match_of_the_fixed_paths_wins_over_the_ld_cache(tmp_path):
    """nvcdi's library locator: the fixed directories first; the ld cache only when they have no match."""
    root = _root(tmp_path, "bottlerocket")
    other = tmp_path / "usr/lib64"  # -> the sys-root's lib: a second install in a fixed search path
    (other / f"libcuda.so.{V}").write_bytes(elf.shared_object("libcuda.so.1"))
    assert root.library_dirs() == [f"{BR}/lib"]


def test_ld_cache_is_what_glibc_reads(tmp_path):
    write_driver_root(tmp_path, V, "al2023")
    cache = tmp_path / "etc/ld.so.cache"
    entries = {(e.name, e.path) for e in ldcache.read(cache)}
    assert ("libcuda.so.1", "/usr/lib64/libcuda.so.1") in entries
    assert ("libcuda.so", "/usr/lib64/libcuda.so") in entries  # development link
    assert (f"libnvidia-tls.so.{V}", f"/usr/lib64/libnvidia-tls.so.{V}") in entries  # soname == file name
    assert not any(name == f"libcuda.so.{V}" for name, _ in entries)  # a file under another soname is not
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    if not os.access(ldconfig, os.X_OK):
        pytest.skip("glibc's ldconfig not found: cannot cross-check the ld cache with the real reader")
    out = subprocess.run([ldconfig, "-p", "-C", str(cache)], capture_output=True, text=True, check=True).stdout
    listed = {(line.split()[0], line.split("=> ")[1]) for line in out.splitlines()[1:] if "=>" in line}
    assert listed == entries
    assert f"{len(entries)} libs found in cache" in out.splitlines()[0]


def test_ld_cache_errors_name_the_file(tmp_path):
    bad = tmp_path / "etc/ld.so.cache"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not a cache at all, but long enough to hold a header" * 2)
    with pytest.raises(ldcache.LdCacheError, match=f"{bad}: not a glibc ld.so.cache"):
        ldcache.read(bad)
    with pytest.raises(DriverRootError, match="unreadable ld cache"):
        DriverRoot(tmp_path).cache_entries()


def test_elf_soname_round_trip_and_readelf(tmp_path):
    lib = tmp_path / "libx.so.1.2.3"
    lib.write_bytes(elf.shared_object("libx.so.1"))
    assert elf.soname(lib) == "libx.so.1"
    assert elf.soname(tmp_path / "missing") is None
    (tmp_path / "text").write_text("#!/bin/sh\n")
    assert elf.soname(tmp_path / "text") is None
    readelf = shutil.which("readelf")
    if readelf:
        assert "Library soname: [libx.so.1]" in subprocess.run([readelf, "-d", str(lib)], capture_output=True,
                                                               text=True, check=True).stdout


def test_symlinks_resolve_inside_the_root(tmp_path):
    (tmp_path / "usr/lib64").mkdir(parents=True)
    (tmp_path / "usr/lib64/libfoo.so.1.0").write_bytes(b"x")
    os.symlink("/usr/lib64/libfoo.so.1.0", tmp_path / "usr/lib64/libfoo.so.1")  # absolute: re-rooted
    os.symlink("usr/lib64", tmp_path / "lib64")
    assert resolve_in_root(tmp_path, "/lib64/libfoo.so.1") == "/usr/lib64/libfoo.so.1.0"
    assert resolve_in_root(tmp_path, "/lib64/missing.so") is None


def test_host_paths_follow_the_driver_root(tmp_path):
    write_driver_root(tmp_path / "run/nvidia/driver", V, "al2023")
    host = GpuHost.for_node(tmp_path, "/run/nvidia/driver")
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/nvidia-cdi-hook").write_text("#!/bin/sh\n")
    (tmp_path / "usr/bin/nvidia-cdi-hook").chmod(0o755)
    edits = host.common_edits([])
    lib = next(m for m in edits["mounts"] if m["containerPath"] == f"/usr/lib64/libcuda.so.{V}")
    assert lib["hostPath"] == f"/run/nvidia/driver/usr/lib64/libcuda.so.{V}"
    assert host.device_hooks("GPU-1")[0]["args"][2:] == ["--driver-root", "/run/nvidia/driver", "--gpu-id", "GPU-1"]


def test_missing_hook_or_driver_libraries_keep_the_gpu_inventory_not_ready(tmp_path):
    root = write_fixture("p5.48xlarge", tmp_path / "h", node_name=NODE)
    (root / "usr/bin/nvidia-cdi-hook").unlink()
    inventory = discover("gpu", root, NODE)
    assert not inventory.ready and "no executable nvidia-cdi-hook at /usr/bin/nvidia-cdi-hook" in inventory.reason
    assert inventory.common_edits == {} and all(d.hooks == [] for d in inventory.devices)
    explicit = discover("gpu", root, NODE, host=GpuHost.for_node(root, hook_path="/opt/hook/nvidia-cdi-hook"))
    assert "no executable nvidia-cdi-hook at /opt/hook/nvidia-cdi-hook" in explicit.reason
    root2 = write_fixture("p5.48xlarge", tmp_path / "h2", node_name=NODE)
    for lib in (root2 / "usr/lib64").glob("libcuda.so*"):
        lib.unlink()
    for lib in (root2 / "usr/lib64").glob("libnvidia-ml.so*"):
        lib.unlink()
    inventory = discover("gpu", root2, NODE)
    assert not inventory.ready and "no libcuda.so.*.* or libnvidia-ml.so.*.*" in inventory.reason


def test_mig_devices_wait_for_this_boots_partitioning_marker(tmp_path):
    root = write_fixture("p4d.24xlarge", tmp_path / "h", node_name=NODE, mig_profile="3g.20gb")
    assert discover("gpu", root, NODE).ready
    (root / mig_marker.MARKER).unlink()
    inventory = discover("gpu", root, NODE)
    assert not inventory.ready and f"marker /{mig_marker.MARKER} is missing" in inventory.reason
    (root / mig_marker.MARKER).write_text("0b0b0b0b-old-boot\n")
    inventory = discover("gpu", root, NODE)
    assert not inventory.ready and "is from an earlier boot" in inventory.reason
    mig_marker.write_marker(root)
    assert discover("gpu", root, NODE).ready
    set_boot_id(root)  # a simulated reboot: the fixture's partitioning unit runs again
    assert discover("gpu", root, NODE).ready
    # full GPUs need no marker
    plain = write_fixture("p5.48xlarge", tmp_path / "p", node_name=NODE)
    assert not (plain / mig_marker.MARKER).exists() and discover("gpu", plain, NODE).ready


def test_driver_root_flags(tmp_path):
    args = build_parser().parse_args(["gpu", "--node-name", "n", "--host-root", str(tmp_path),
                                      "--driver-root", "/run/nvidia/driver", "--nvidia-cdi-hook-path", "/opt/h"])
    host = family_host_from_args(args)
    assert host.driver_root.path == tmp_path / "run/nvidia/driver"
    assert host.driver_root.host_path == "/run/nvidia/driver" and host.hook_path == "/opt/h"
    args = build_parser().parse_args(["gpu", "--node-name", "n", "--driver-root", "run/nvidia"])
    with pytest.raises(BadArguments, match="--driver-root 'run/nvidia' must be an absolute host path"):
        config_from_args(args)
    assert family_host_from_args(build_parser().parse_args(["efa", "--node-name", "n"])) is None


def test_fixture_os_layout_is_checked(tmp_path):
    from eks_dra.errors import UserError

    with pytest.raises(UserError, match="--os: unknown layout 'ubuntu'"):
        write_fixture("p5.48xlarge", tmp_path / "h", os_layout="ubuntu")
    assert (write_fixture("p5.48xlarge", tmp_path / "b", os_layout="bottlerocket") / hosttree.FIXTURE_DIR).is_dir()


def test_common_edits_are_cached_until_the_ld_cache_changes(tmp_path):
    root = write_fixture("p5.48xlarge", tmp_path / "h", node_name=NODE)
    host = GpuHost.for_node(root)

    def binaries() -> set[str]:
        return {m["containerPath"] for m in host.common_edits(["/dev/nvidiactl"])["mounts"]
                if m["containerPath"].startswith("/usr/bin/")}

    assert "/usr/bin/nvidia-debugdump" in binaries()
    (root / "usr/bin/nvidia-debugdump").unlink()
    assert "/usr/bin/nvidia-debugdump" in binaries()  # cached (a driver change rewrites the ld cache)
    cache = root / "etc/ld.so.cache"
    stat = cache.stat()
    os.utime(cache, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert "/usr/bin/nvidia-debugdump" not in binaries()
