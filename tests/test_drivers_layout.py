"""The drivers' package layout: a kubelet-plugin framework that knows no device family, one
package per family on top of it, and no import cycle between the drivers' modules.

Imports are read from the sources (ast), lazy ones inside functions included, so a family import tucked into a
function body is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from eks_dra.drivers.families import FAMILY_PACKAGES, get_family

DRIVERS = Path(__file__).resolve().parents[1] / "eks_dra" / "drivers"
FAMILY_MODULES = tuple(FAMILY_PACKAGES.values())
# Outside the framework: what names the family packages (the registry, the process entry point, the fixture tool).
COMPOSITION = ("eks_dra.drivers.families", "eks_dra.drivers.main", "eks_dra.drivers.fixture")
FAMILY_DEVICE_MODELS = ("eks_dra.devices.gpu", "eks_dra.devices.efa", "eks_dra.devices.neuron")


def module_name(path: Path) -> str:
    rel = path.relative_to(DRIVERS.parents[1]).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module `source` (the text of `module`) imports, relative imports resolved, `from x import y`
    counted as x.y as well as x (y may be a submodule)."""
    package = module if is_package else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{alias.name}" for alias in node.names)
    return out


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def driver_modules() -> dict[str, set[str]]:
    out = {}
    for path in sorted(DRIVERS.rglob("*.py")):
        if "proto" in path.parts:
            continue
        name = module_name(path)
        out[name] = imports_of(path.read_text(), name, path.name == "__init__.py")
    return out


def framework_violations(modules: dict[str, set[str]]) -> list[str]:
    banned = FAMILY_MODULES + COMPOSITION + FAMILY_DEVICE_MODELS
    return [f"{m} imports {i}" for m, imps in sorted(modules.items()) if within(m, ("eks_dra.drivers.framework",))
            for i in sorted(imps) if within(i, banned)]


def test_the_framework_imports_no_family():
    assert framework_violations(driver_modules()) == []


def test_the_layout_check_catches_a_family_import():
    source = "def f():\n    from ..gpu.host import GpuHost\n    return GpuHost\n"
    fake = {"eks_dra.drivers.framework.driver": imports_of(source, "eks_dra.drivers.framework.driver")}
    assert framework_violations(fake) == ["eks_dra.drivers.framework.driver imports eks_dra.drivers.gpu.host",
                                          "eks_dra.drivers.framework.driver imports eks_dra.drivers.gpu.host.GpuHost"]


@pytest.mark.parametrize("family", sorted(FAMILY_PACKAGES))
def test_a_family_imports_no_other_family(family):
    others = tuple(p for f, p in FAMILY_PACKAGES.items() if f != family)
    modules = driver_modules()
    mine = {m: imps for m, imps in modules.items() if within(m, (FAMILY_PACKAGES[family],))}
    assert len(mine) >= 4  # __init__, family, discovery, health at least
    assert [f"{m} imports {i}" for m, imps in mine.items() for i in imps if within(i, others + COMPOSITION)] == []


def cycles(modules: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles between the given modules (depth-first search, each cycle reported once)."""
    graph = {m: sorted(i for i in imps if i in modules and i != m) for m, imps in modules.items()}
    found, state = [], {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for n in graph[m]:
            if state.get(n) == "open":
                found.append(path[path.index(n):] + [n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return found


def test_no_import_cycle_between_the_drivers_modules():
    modules = {m: imps for m, imps in driver_modules().items() if not m.endswith("__init__")}
    assert cycles(modules) == []


def test_the_cycle_check_catches_a_cycle():
    # The old layout: discovery imported health_sources (to apply health) and health_sources imported discovery.
    fake = {"d.discovery": {"d.health_sources"}, "d.health_sources": {"d.discovery", "d.nvml"}, "d.nvml": set()}
    assert cycles(fake) == [["d.discovery", "d.health_sources", "d.discovery"]]


@pytest.mark.parametrize("family", sorted(FAMILY_PACKAGES))
def test_each_family_package_gives_its_device_family(family):
    fam = get_family(family)
    assert fam.name == family and type(fam).__module__ == f"{FAMILY_PACKAGES[family]}.family"
    assert fam.device_plugin_resources, "the device plugin this family must not share a node with"


def test_an_unknown_family_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown device family 'tpu'; expected one of gpu, efa, neuron"):
        get_family("tpu")


def test_nothing_heavy_is_imported_before_the_sockets_serve(tmp_path):
    """main() serves the kubelet sockets after importing only grpc, the protos and its own settings (start-up stays fast):
    no catalog, device model, family package, Kubernetes client or Prometheus before PluginServers.start()."""
    import json
    import subprocess
    import sys

    code = (
        "import json, os, sys\n"
        "from eks_dra.drivers.framework import plugin\n"
        "def start(self):\n"
        "    print(json.dumps(sorted(sys.modules)))\n"
        "    sys.stdout.flush()\n"
        "    os._exit(0)\n"
        "plugin.PluginServers.start = start\n"
        "from eks_dra.drivers import main\n"
        f"main.main(['gpu', '--node-name', 'n', '--plugins-dir', {str(tmp_path / 'p')!r}, "
        f"'--registry-dir', {str(tmp_path / 'r')!r}, '--host-root', {str(tmp_path)!r}])\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.splitlines()[-1])
    heavy = ("eks_dra.catalog", "eks_dra.devices.model", "eks_dra.devices.simulate", "eks_dra.devices.gpu",
             "eks_dra.devices.efa", "eks_dra.devices.neuron", "eks_dra.drivers.families", "eks_dra.drivers.framework.family",
             "kubernetes.client.rest", "kubernetes.client.api_client", "kubernetes.config.kube_config",
             "prometheus_client", "urllib3", "requests") + FAMILY_MODULES
    assert [m for m in loaded if within(m, heavy)] == []
    # kube.use_slim_import() registers the client's packages as empty placeholders, nothing under them yet
    assert [m for m in loaded if m.startswith("kubernetes")] == ["kubernetes", "kubernetes.client", "kubernetes.client.api",
                                                                 "kubernetes.client.models", "kubernetes.config"]
    assert "grpc" in loaded and "eks_dra.drivers.framework.proto.dra_v1_pb2" in loaded  # the check saw main's imports
