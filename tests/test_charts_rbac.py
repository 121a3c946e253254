"""The drivers' RBAC grants exactly the API calls the driver code makes: nothing unused, nothing missing.

The calls are read from eks_dra/drivers/framework/kube.py with `ast` (each `KubeApi` method's HTTP method, path
and query), turned into (API group, resource, verb, namespace) as the API server's request-info resolver does
(k8s.io/apiserver/pkg/endpoints/request/requestinfo.go), and compared with the rules the rendered chart binds
to each driver's ServiceAccount. A namespaced call's namespace is the constant every caller passes (found in
eks_dra/drivers), or any namespace when a caller passes a variable.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from charts.environments import ALL, synthesized
from charts.k8s_objects import of_kind

from eks_dra.drivers.framework import kube

DRIVERS = Path(kube.__file__).resolve().parents[1]
ANY = "*"  # any namespace, or a cluster-scoped resource: only a ClusterRole grants it
VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}
Use = tuple[str, str, str, str]  # (API group, resource, verb, namespace)


def _module_constants(tree: ast.Module) -> dict[str, str]:
    return {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for t in node.targets if isinstance(t, ast.Name)}


def _path_template(node: ast.expr, constants: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The path with each interpolated argument as `{param}`, and {segment placeholder: method parameter}."""
    if isinstance(node, ast.Constant):
        return node.value, {}
    assert isinstance(node, ast.JoinedStr), ast.unparse(node)
    text, params = "", {}
    for part in node.values:
        if isinstance(part, ast.Constant):
            text += part.value
            continue
        value = part.value
        if isinstance(value, ast.Name) and value.id in constants:
            text += constants[value.id]
            continue
        if isinstance(value, ast.Call):  # quote(name)
            (value,) = value.args
        assert isinstance(value, ast.Name), ast.unparse(part)
        text += "{" + value.id + "}"
        params["{" + value.id + "}"] = value.id
    return text, params


def _api_calls() -> dict[str, tuple[str, str, bool]]:
    """KubeApi method -> (HTTP method, path template, is a watch), from its `self._call`/`self._request` calls."""
    tree = ast.parse(inspect.getsource(kube))
    constants = _module_constants(tree)
    api = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KubeApi")
    out = {}
    for method in api.body:
        if not isinstance(method, ast.FunctionDef) or method.name.startswith("_"):
            continue
        calls = [c for c in ast.walk(method) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                 and c.func.attr in ("_call", "_request")]
        assert len(calls) == 1, f"KubeApi.{method.name}: one API call per method"
        (call,) = calls
        http, path_node, *rest = call.args
        query = rest[0] if rest else next((k.value for k in call.keywords if k.arg == "query"), None)
        if isinstance(query, ast.Name):  # a local list built in the method
            query = next(a.value for a in ast.walk(method) if isinstance(a, ast.Assign)
                         and any(isinstance(t, ast.Name) and t.id == query.id for t in a.targets))
        if isinstance(path_node, ast.Name):  # a path built in the method first
            path_node = next(a.value for a in ast.walk(method) if isinstance(a, ast.Assign)
                             and any(isinstance(t, ast.Name) and t.id == path_node.id for t in a.targets))
        watch = query is not None and "('watch', 'true')" in ast.unparse(query)
        out[method.name] = (http.value, *_path_template(path_node, constants), watch)
    return out


def _resource(path: str) -> tuple[str, str, str | None, bool]:
    """(group, resource, namespace placeholder or None, names one object) of an API path."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespace = None
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    assert len(rest) in (1, 2), f"{path}: subresources are not handled here"
    return group, rest[0], namespace, len(rest) == 2


def _namespaces_passed(method: str, param: str) -> set[str]:
    """What the callers of `KubeApi.<method>` in eks_dra/drivers pass for `param`: constants, or ANY."""
    index = list(inspect.signature(getattr(kube.KubeApi, method)).parameters).index(param) - 1  # self
    found: set[str] = set()
    for source in DRIVERS.rglob("*.py"):
        tree = ast.parse(source.read_text())
        constants = _module_constants(tree)
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == method):
                continue
            arg = call.args[index] if len(call.args) > index else next(k.value for k in call.keywords if k.arg == param)
            if isinstance(arg, ast.Constant):
                found.add(arg.value)
            else:
                found.add(constants.get(arg.id, ANY) if isinstance(arg, ast.Name) else ANY)
    assert found, f"KubeApi.{method} is never called; remove it"
    return found


def used_by_the_drivers() -> set[Use]:
    uses: set[Use] = set()
    for method, (http, path, params, watch) in _api_calls().items():
        group, resource, namespace, named = _resource(path)
        if http == "GET":
            verb = "get" if named else ("watch" if watch else "list")
        elif http == "DELETE":
            verb = "delete" if named else "deletecollection"
        else:
            verb = VERBS[http]
        spaces = _namespaces_passed(method, params[namespace]) if namespace else {ANY}
        uses |= {(group, resource, verb, ANY if ANY in spaces else ns) for ns in spaces}
    return uses


def granted(docs, namespace: str, account: str) -> set[Use]:
    """What the roles bound to the ServiceAccount grant: ClusterRoles everywhere, Roles in their namespace."""
    subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    roles = {(d["kind"], d["metadata"].get("namespace", ANY), d["metadata"]["name"]): d
             for d in [*of_kind(docs, "ClusterRole"), *of_kind(docs, "Role")]}
    out: set[Use] = set()
    for binding in [*of_kind(docs, "ClusterRoleBinding"), *of_kind(docs, "RoleBinding")]:
        if subject not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        scope = ANY if ref["kind"] == "ClusterRole" else binding["metadata"]["namespace"]
        role = roles[(ref["kind"], scope, ref["name"])]
        assert binding["kind"] == "RoleBinding" or ref["kind"] == "ClusterRole"
        for rule in role["rules"]:
            assert not rule.get("resourceNames") and not rule.get("nonResourceURLs"), rule
            out |= {(g, r, v, scope) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return out


def test_the_driver_calls_are_read_from_the_code() -> None:
    """The reader sees every call the drivers make today (a guard for the reader itself)."""
    uses = used_by_the_drivers()
    assert ("resource.k8s.io", "resourceslices", "watch", ANY) in uses
    assert ("resource.k8s.io", "resourceclaims", "get", ANY) in uses  # claims of any namespace
    assert ("", "events", "create", "default") in uses
    assert ("", "nodes", "patch", ANY) in uses
    # Nothing else in the drivers talks to the API server behind KubeApi's back.
    for source in DRIVERS.rglob("*.py"):
        if source.name != "kube.py":
            assert "call_api" not in source.read_text(), source


@pytest.mark.parametrize("key", ALL)
def test_driver_roles_grant_exactly_the_calls_the_code_makes(key: str) -> None:
    _, docs = synthesized(key)
    uses = used_by_the_drivers()
    accounts = {(ds["metadata"]["namespace"], ds["spec"]["template"]["spec"]["serviceAccountName"])
                for ds in of_kind(docs, "DaemonSet")
                if ds["spec"]["template"]["spec"]["containers"][0].get("command", [""])[0] == "eks-dra-driver"}
    for ns, name in sorted(accounts):
        grants = granted(docs, ns, name)
        assert not grants - uses, f"{key}: {name}: granted but unused: {sorted(grants - uses)}"
        assert not uses - grants, f"{key}: {name}: used but not granted: {sorted(uses - grants)}"
