"""The Kubernetes API as the drivers use it: the official `kubernetes` client, JSON in and out.

Responses are read raw (`_preload_content=False`) and decoded with `json`: the drivers pass objects
through rather than convert them to the client's model classes, which saves CPU and keeps unknown
(newer) fields intact.

Memory: `import kubernetes` eagerly imports ~900 model modules (~55 MiB resident), more than the driver's
whole budget. `use_slim_import()` (called by the driver's entry point before anything imports the
client) registers the `kubernetes` and `kubernetes.client` packages without running their eager
`__init__`s; the same modules of the same pinned client are then imported on demand.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import sys
import types
from collections.abc import Iterator
from typing import Any

DEFAULT_TIMEOUT = (3.05, 15)  # (connect, read) seconds for ordinary calls


def use_slim_import() -> bool:
    """Register lazy `kubernetes` packages; False (and a no-op) when the client is already imported."""
    if "kubernetes" in sys.modules:
        return False
    spec = importlib.util.find_spec("kubernetes")
    if spec is None or not spec.submodule_search_locations:
        return False
    root = list(spec.submodule_search_locations)[0]

    def package(name: str, path: str, resolve) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__path__ = [path]
        mod.__package__ = name
        mod.__file__ = f"{path}/__init__.py"
        mod.__getattr__ = resolve  # PEP 562: names the eager __init__ would have bound, on first use
        sys.modules[name] = mod
        return mod

    def snake(name: str) -> str:
        return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()

    def resolve_root(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return importlib.import_module(f"kubernetes.{name}")

    def resolve_client(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        fixed = {"ApiClient": "api_client", "Configuration": "configuration"}
        if name in fixed:
            return getattr(importlib.import_module(f"kubernetes.client.{fixed[name]}"), name)
        if name.endswith("Api"):
            return getattr(importlib.import_module(f"kubernetes.client.api.{snake(name)}"), name)
        if name in ("rest", "exceptions", "models", "api"):
            return importlib.import_module(f"kubernetes.client.{name}")
        if name in ("ApiException", "ApiValueError", "ApiTypeError", "ApiKeyError", "OpenApiException"):
            return getattr(importlib.import_module("kubernetes.client.exceptions"), name)
        return getattr(importlib.import_module("kubernetes.client.models"), name)

    def resolve_models(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(importlib.import_module(f"kubernetes.client.models.{snake(name)}"), name)

    def resolve_apis(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(importlib.import_module(f"kubernetes.client.api.{snake(name)}"), name)

    package("kubernetes", root, resolve_root)
    package("kubernetes.client", f"{root}/client", resolve_client)
    package("kubernetes.client.models", f"{root}/client/models", resolve_models)
    package("kubernetes.client.api", f"{root}/client/api", resolve_apis)
    return True


class ApiError(Exception):
    """An API call failed; `status` is the HTTP status (0: no response, e.g. the server is unreachable)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status


def api_client(kubeconfig: str | None):
    """A client for the kubeconfig file, or the in-cluster service account when none is given."""
    from kubernetes.client import ApiClient, Configuration
    from kubernetes.config import incluster_config, kube_config

    cfg = Configuration()
    if kubeconfig:
        kube_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg, persist_config=False)
    else:
        incluster_config.load_incluster_config(client_configuration=cfg)
    cfg.retries = False  # the drivers retry with their own backoff, never inside a kubelet call
    return ApiClient(configuration=cfg)


def json_lines(resp) -> Iterator[dict]:
    """The JSON documents of a raw watch response (one per line), as they arrive."""
    buffer = b""
    for chunk in resp.stream(4096, decode_content=False):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)


class KubeApi:
    """The few API calls the drivers make, as plain dicts."""

    def __init__(self, client) -> None:
        from kubernetes.client import CoreV1Api, ResourceV1Api

        self.client = client
        self.resource = ResourceV1Api(client)
        self.core = CoreV1Api(client)

    def _call(self, fn, *args, timeout=DEFAULT_TIMEOUT, **kwargs) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            resp = fn(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
            body = resp.data
        except ApiException as exc:
            raise ApiError(exc.status or 0, _reason(exc)) from None
        except Exception as exc:  # urllib3 connection errors, timeouts
            raise ApiError(0, f"{type(exc).__name__}: {exc}") from None
        return json.loads(body) if body else {}

    # --- ResourceClaims
    def get_claim(self, namespace: str, name: str) -> dict:
        return self._call(self.resource.read_namespaced_resource_claim, name, namespace)

    def list_claims(self) -> list[dict]:
        return self._call(self.resource.list_resource_claim_for_all_namespaces).get("items") or []

    # --- ResourceSlices
    def list_slices(self, field_selector: str) -> tuple[list[dict], str]:
        out = self._call(self.resource.list_resource_slice, field_selector=field_selector)
        return out.get("items") or [], (out.get("metadata") or {}).get("resourceVersion", "")

    def watch_slices(self, field_selector: str, resource_version: str, timeout_s: int):
        """Yield watch events (dicts with type, object) until the server ends the watch."""
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self.resource.list_resource_slice(
                field_selector=field_selector, watch=True, resource_version=resource_version,
                allow_watch_bookmarks=True, timeout_seconds=timeout_s, _preload_content=False,
                _request_timeout=(3.05, timeout_s + 10))
        except ApiException as exc:
            raise ApiError(exc.status or 0, _reason(exc)) from None
        except Exception as exc:
            raise ApiError(0, f"{type(exc).__name__}: {exc}") from None
        try:
            yield from json_lines(resp)
        except Exception as exc:
            raise ApiError(0, f"watch interrupted: {type(exc).__name__}: {exc}") from None
        finally:
            resp.release_conn()

    def create_slice(self, body: dict) -> dict:
        return self._call(self.resource.create_resource_slice, body)

    def replace_slice(self, name: str, body: dict) -> dict:
        return self._call(self.resource.replace_resource_slice, name, body)

    def delete_slice(self, name: str, resource_version: str | None = None) -> None:
        body = {"preconditions": {"resourceVersion": resource_version}} if resource_version else None
        self._call(self.resource.delete_resource_slice, name, body=body)

    # --- Nodes and Events
    def get_node(self, name: str) -> dict:
        return self._call(self.core.read_node, name)

    def patch_node_json(self, name: str, ops: list[dict]) -> dict:
        return self._call(self.core.patch_node, name, ops)

    def create_event(self, namespace: str, body: dict) -> dict:
        return self._call(self.core.create_namespaced_event, namespace, body)


def _reason(exc) -> str:
    try:
        return json.loads(exc.body).get("message") or exc.reason
    except Exception:
        return str(exc.reason or exc)
