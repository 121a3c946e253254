"""CDI container edits for NVIDIA GPUs, equivalent to nvcdi's (nvidia-container-toolkit v1.20, "nvml" mode).

What the upstream DRA driver puts in every claim's spec (`cmd/gpu-kubelet-plugin/cdi.go`): nvcdi's
`GetCommonEdits()` at spec level and `GetDeviceSpecsByID(uuid)` per device. Restated here:

Common (spec level):
- device nodes /dev/nvidia-modeset, /dev/nvidia-uvm-tools, /dev/nvidia-uvm, /dev/nvidiactl (those present);
- mounts (ro,nosuid,nodev,rbind,rprivate) of the driver libraries, the graphics libraries and config files,
  the utility binaries and the GSP firmware; the persistenced / fabric-manager sockets
  (nosuid,nodev,rbind,rprivate,noexec); `/dev/null` on `/var/run/nvidia-container-devices/void`;
- env `NVIDIA_CTK_LIBCUDA_DIR=<driver library dirs>` and `NVIDIA_VISIBLE_DEVICES=void`. The last two (the
  void env and mount) are how nvcdi's wrapper stops an `nvidia` runtime in legacy or jit-cdi mode from
  injecting the GPUs a second time: "void" selects no device, for the env-var and the volume-mounts
  device-list strategies alike. Every claim's spec sets the same value, so a container with two claims
  keeps one consistent environment;
- createContainer hooks of the node's `nvidia-cdi-hook`: `create-symlinks` (the libcuda.so /
  opticalflow development links and each library's soname links that exist on the host, plus graphics
  links such as gbm/nvidia-drm_gbm.so), `enable-cuda-compat --host-driver-version=<v>`,
  `update-ldcache --folder <each library dir>`, `disable-device-node-modification`,
  `update-application-profile`.
Per device: its device nodes (/dev/nvidiaN; a MIG device also its GPU-instance and compute-instance
capability nodes /dev/nvidia-caps/nvidia-capM, as the upstream driver appends them) and a createRuntime
`apply-cuda-memory-limits --driver-root <root> --gpu-id <uuid>` hook (a MIG device carries its parent's,
as upstream builds MIG devices from the parent's spec).
"""

from __future__ import annotations

import os
from fnmatch import fnmatchcase

from . import elf
from .driver_root import DriverFile, DriverRoot

MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
IPC_OPTIONS = ["nosuid", "nodev", "rbind", "rprivate", "noexec"]
VOID_MOUNT = {"hostPath": "/dev/null", "containerPath": "/var/run/nvidia-container-devices/void",
              "options": ["ro", "nosuid", "nodev", "bind"]}
VOID_ENV = "NVIDIA_VISIBLE_DEVICES=void"
CONTROL_DEVICE_NODES = ("/dev/nvidia-modeset", "/dev/nvidia-uvm-tools", "/dev/nvidia-uvm", "/dev/nvidiactl")
DEFAULT_HOOK_PATH = "/usr/bin/nvidia-cdi-hook"
HOOK_ENV = ["NVIDIA_CTK_DEBUG=false"]
# Graphics libraries nvcdi adds through its graphics discoverer (library lookup; allocator filtered out of
# the mounts because it is a driver library already) and the config files it mounts.
GRAPHICS_LIBRARIES = ("libnvidia-egl-gbm.so.*.*", "libnvidia-egl-wayland.so.*.*", "libnvidia-egl-wayland2.so.*.*",
                      "libnvidia-egl-xcb.so.*.*", "libnvidia-egl-xlib.so.*.*", "libnvidia-allocator.so.{v}",
                      "libnvidia-vulkan-producer.so.{v}")
SHARE_CONFIGS = ("glvnd/egl_vendor.d/10_nvidia.json", "egl/egl_external_platform.d/15_nvidia_gbm.json",
                 "egl/egl_external_platform.d/10_nvidia_wayland.json",
                 "egl/egl_external_platform.d/09_nvidia_wayland2.json",
                 "egl/egl_external_platform.d/20_nvidia_xcb.json", "egl/egl_external_platform.d/20_nvidia_xlib.json",
                 "nvidia/nvoptix.bin", "X11/xorg.conf.d/10-nvidia.conf",
                 "X11/xorg.conf.d/nvidia-drm-outputclass.conf")
ETC_CONFIGS = ("OpenCL/vendors/nvidia.icd",)
VULKAN_CONFIGS = ("vulkan/icd.d/nvidia_icd.json", "vulkan/icd.d/nvidia_layers.json",
                  "vulkan/implicit_layer.d/nvidia_layers.json")
CONFIG_SEARCH_PATHS = ("/etc", "/usr/local/share", "/usr/share")


def hook(hook_path: str, name: str, args: list[str], lifecycle: str = "createContainer") -> dict:
    base = os.path.basename(hook_path)
    fixed = [base, "hook"] if base == "nvidia-ctk" else [base]
    return {"hookName": lifecycle, "path": hook_path, "args": [*fixed, name, *args], "env": list(HOOK_ENV)}


def _mount(root: DriverRoot, f: DriverFile, options: list[str], container_path: str | None = None) -> dict:
    return {"hostPath": root.host(f.path), "containerPath": container_path or f.path, "options": list(options)}


def _version_glob(pattern: str, filename: str) -> bool:
    """nvcdi's isDriverLibrary with version "*.*": `<name>.*.*` matched against a file name."""
    return fnmatchcase(filename, pattern + ".*.*")


def _library_links(root: DriverRoot, libraries: list[DriverFile]) -> list[str]:
    """create-symlinks arguments for the driver libraries, in nvcdi's order."""
    links: list[str] = []
    for f in libraries:
        directory, name = os.path.split(f.path)
        candidates = []
        if _version_glob("libcuda.so", name):
            candidates.append(f"libcuda.so.1::{directory}/libcuda.so")
        elif _version_glob("libGLX_nvidia.so", name):
            candidates.append(f"{name}::{directory}/libGLX_indirect.so.0")
        elif _version_glob("libnvidia-opticalflow.so", name):
            candidates.append(f"libnvidia-opticalflow.so.1::{directory}/libnvidia-opticalflow.so")
        if _version_glob("*", name):
            soname = elf.soname(f.local)
            if soname and soname != name and (f.local.parent / soname).is_symlink():
                candidates.append(f"{name}::{directory}/{soname}")
            target = soname or name
            dev_link = _so_link(target)
            if dev_link and dev_link != target and (f.local.parent / dev_link).is_symlink():
                candidates.append(f"{target}::{directory}/{dev_link}")
        for link in candidates:
            if link not in links:
                links.append(link)
    return links


def _so_link(soname: str) -> str:
    """libfoo.so.1.2 -> libfoo.so (nvcdi's getSoLink)."""
    while True:
        stem, ext = os.path.splitext(soname)
        if not ext:
            return ""
        if ext == ".so":
            return soname
        soname = stem


def _configs(root: DriverRoot) -> list[dict]:
    out: list[dict] = []
    seen: set[str] = set()
    for names, container_root in ((SHARE_CONFIGS, "/usr/share"), (ETC_CONFIGS, "/etc"), (VULKAN_CONFIGS, "/etc")):
        for name in names:
            for d in CONFIG_SEARCH_PATHS:
                path = f"{d}/{name}"
                if root.local(path).is_file():
                    if path not in seen:
                        seen.add(path)
                        out.append(_mount(root, DriverFile(root.local(path), path), MOUNT_OPTIONS,
                                          f"{container_root}/{name}"))
                    break
    return out


def common_edits(root: DriverRoot, hook_path: str, control_nodes: list[str]) -> dict:
    """The spec-level container edits of every GPU claim. Raises DriverRootError (names what is missing)."""
    version = root.version()
    libraries = root.libraries()
    lib_paths = {f.path for f in libraries}
    graphics = []
    gbm_links = []
    for pattern in GRAPHICS_LIBRARIES:
        for p in root.locate_library(pattern.format(v=version)):
            name = os.path.basename(p)
            if name == f"libnvidia-allocator.so.{version}":
                gbm_links.append(f"../libnvidia-allocator.so.1::{os.path.dirname(p)}/gbm/nvidia-drm_gbm.so")
                continue
            if name == f"libnvidia-vulkan-producer.so.{version}":
                gbm_links.append(f"{name}::{os.path.dirname(p)}/libnvidia-vulkan-producer.so")
            if p not in lib_paths:
                graphics.append(DriverFile(root.local(p), p))
    binaries = [f for f in (root.binary(n) for n in ("nvidia-xconfig",)) if f is not None] + root.binaries()
    mounts = [_mount(root, f, MOUNT_OPTIONS) for f in [*libraries, *graphics]]
    mounts += _configs(root)
    mounts += [_mount(root, f, MOUNT_OPTIONS) for f in [*binaries, *root.firmware()]]
    mounts += [_mount(root, f, IPC_OPTIONS) for f in root.ipc()]
    mounts.append(dict(VOID_MOUNT))
    hooks = []
    if gbm_links:
        hooks.append(hook(hook_path, "create-symlinks", [a for link in gbm_links for a in ("--link", link)]))
    links = _library_links(root, libraries)
    if links:
        hooks.append(hook(hook_path, "create-symlinks", [a for link in links for a in ("--link", link)]))
    hooks.append(hook(hook_path, "enable-cuda-compat", [f"--host-driver-version={version}"]))
    folders = list(dict.fromkeys(os.path.dirname(f.path) for f in libraries if _is_lib_name(f.path)))
    if folders:
        hooks.append(hook(hook_path, "update-ldcache", [a for d in folders for a in ("--folder", d)]))
    hooks.append(hook(hook_path, "disable-device-node-modification", []))
    hooks.append(hook(hook_path, "update-application-profile", []))
    return {
        "env": [f"NVIDIA_CTK_LIBCUDA_DIR={':'.join(root.library_dirs())}", VOID_ENV],
        "deviceNodes": [{"path": p} for p in CONTROL_DEVICE_NODES if p in control_nodes],
        "mounts": mounts,
        "hooks": hooks,
    }


def _is_lib_name(path: str) -> bool:
    """nvcdi's isLibName: lib?*.so, or .so followed by a dotted suffix."""
    base = os.path.basename(path)
    if not fnmatchcase(base, "lib?*.so*"):
        return False
    tail = base.split(".so")[-1]
    return tail == "" or tail.startswith(".")


def device_hooks(hook_path: str, host_driver_root: str, uuid: str) -> list[dict]:
    """The per-device hook nvcdi adds to every full GPU (and, through the parent, to its MIG devices)."""
    return [hook(hook_path, "apply-cuda-memory-limits", ["--driver-root", host_driver_root, "--gpu-id", uuid],
                 "createRuntime")]
