"""The Kubernetes API as the drivers use it: the official `kubernetes` client, JSON in and out.

Responses are read raw (`_preload_content=False`) and decoded with `json`: the drivers pass objects
through rather than convert them to the client's model classes, which saves CPU and keeps unknown
(newer) fields intact.

Memory: `import kubernetes` eagerly imports ~900 model modules (~55 MiB resident), more than the driver's
whole budget. `use_slim_import()` (called by the driver's entry point before anything imports the
client) registers the `kubernetes`, `kubernetes.client` and `kubernetes.config` packages without running
their eager `__init__`s; the same modules of the same pinned client are then imported on demand (in a
cluster: no kubeconfig loader, no OAuth or YAML libraries). The calls go through the client's `ApiClient`
(its auth, TLS, token refresh and errors) by path, not through the generated `CoreV1Api`/`ResourceV1Api`
classes, whose modules alone cost ~3.5 MiB resident for the nine calls the drivers make.
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
from urllib.parse import quote

DEFAULT_TIMEOUT = (3.05, 15)  # (connect, read) seconds for ordinary calls
# Pods per page of the node's pod list: a page is one JSON document held in memory at once, and a pod may
# be up to the API server's 1.5 MiB object limit.
POD_PAGE = 25


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

    def resolve_config(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if importlib.util.find_spec(f"kubernetes.config.{name}") is not None:
            return importlib.import_module(f"kubernetes.config.{name}")
        for module in ("kube_config", "incluster_config", "config_exception"):
            found = getattr(importlib.import_module(f"kubernetes.config.{module}"), name, None)
            if found is not None:
                return found
        raise AttributeError(name)

    package("kubernetes.config", f"{root}/config", resolve_config)
    return True


class ApiError(Exception):
    """An API call failed; `status` is the HTTP status (0: no response, e.g. the server is unreachable)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status


class MalformedObject(ApiError):
    """The server answered, but the object cannot be decoded (not JSON, nested too deep, not an object).

    It concerns that one object only: callers skip it and go on with the others."""


def decode(data: bytes, what: str) -> dict:
    """One API object (or list) as a dict; MalformedObject naming `what` when it cannot be decoded.

    Rule: every response body is decoded here. Opaque configs are free-form JSON that the API server stores
    as given, so anyone who may create a ResourceClaim can make one nested deeper than Python's decoder
    recurses (RecursionError) or otherwise unreadable; that must fail that object, never the caller's loop.
    """
    try:
        out = json.loads(data)
    except RecursionError:
        raise MalformedObject(200, f"{what}: the object is nested deeper than {sys.getrecursionlimit()} levels; "
                                   "it cannot be read (fix or delete that object)") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise MalformedObject(200, f"{what}: the response is not valid JSON ({exc}); it cannot be read") from None
    if not isinstance(out, dict):
        raise MalformedObject(200, f"{what}: the response is a JSON {type(out).__name__}, not an object")
    return out


def api_client(kubeconfig: str | None):
    """A client for the kubeconfig file, or the in-cluster service account when none is given."""
    from kubernetes.client import ApiClient, Configuration

    cfg = Configuration()
    if kubeconfig:
        from kubernetes.config import kube_config

        kube_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg, persist_config=False)
    else:
        from kubernetes.config import incluster_config

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
                yield decode(line, "watch event")


RESOURCE = "/apis/resource.k8s.io/v1"
JSON_PATCH = "application/json-patch+json"


class KubeApi:
    """The few API calls the drivers make, as plain dicts."""

    def __init__(self, client) -> None:
        self.client = client

    def _request(self, method: str, path: str, query: list | None = None, body: Any = None,
                 timeout=DEFAULT_TIMEOUT, content_type: str = "application/json"):
        """One call through the client's ApiClient; the raw urllib3 response (raises the client's errors)."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        return self.client.call_api(path, method, {}, query or [], headers, body=body, auth_settings=["BearerToken"],
                                    _return_http_data_only=True, _preload_content=False, _request_timeout=timeout)

    def _call(self, method: str, path: str, query: list | None = None, body: Any = None, **kwargs) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            data = self._request(method, path, query, body, **kwargs).data
        except ApiException as exc:
            raise ApiError(exc.status or 0, _reason(exc)) from None
        except Exception as exc:  # urllib3 connection errors, timeouts
            raise ApiError(0, f"{type(exc).__name__}: {exc}") from None
        return decode(data, f"{method} {path}") if data else {}

    # --- ResourceClaims
    def get_claim(self, namespace: str, name: str, timeout_s: float | None = None) -> dict:
        """One claim; `timeout_s` bounds the whole call (connect and read), e.g. by a kubelet call's deadline."""
        path = f"{RESOURCE}/namespaces/{quote(namespace)}/resourceclaims/{quote(name)}"
        claim = self._call("GET", path, timeout=DEFAULT_TIMEOUT if timeout_s is None else max(timeout_s, 0.001))
        if not isinstance(claim.get("metadata"), dict) or not isinstance(claim.get("status", {}), dict):
            raise MalformedObject(200, f"GET {path}: metadata or status is not an object")
        return claim

    # --- Pods
    def pod_claim_names(self, node: str) -> Iterator[tuple[str, str]]:
        """(namespace, name) of every ResourceClaim a pod bound to `node` uses, each once.

        The names are resolved as the kubelet does (k8s.io/dynamic-resource-allocation/resourceclaim Name):
        `spec.resourceClaims[].resourceClaimName` names a claim directly; a claim made from a template (and the
        scheduler's claim for extended resources) is named in the pod's status. The pods are read in pages
        (`limit`/`continue`), so memory stays bounded by a page, not by the cluster.
        """
        seen: set[tuple[str, str]] = set()
        token = ""
        while True:
            query = [("fieldSelector", f"spec.nodeName={node}"), ("limit", POD_PAGE)]
            if token:
                query.append(("continue", token))
            try:
                page = self._call("GET", "/api/v1/pods", query)
            except ApiError as exc:
                if exc.status == 410 and token:  # the continue token expired (compaction): read the list again
                    token = ""
                    continue
                raise
            for pod in page.get("items") or []:
                for name in _claim_names(pod):
                    key = (str((pod.get("metadata") or {}).get("namespace", "")), name)
                    if key not in seen:
                        seen.add(key)
                        yield key
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return

    # --- ResourceSlices
    def list_slices(self, field_selector: str) -> tuple[list[dict], str]:
        out = self._call("GET", f"{RESOURCE}/resourceslices", [("fieldSelector", field_selector)])
        return out.get("items") or [], (out.get("metadata") or {}).get("resourceVersion", "")

    def watch_slices(self, field_selector: str, resource_version: str, timeout_s: int):
        """Yield watch events (dicts with type, object) until the server ends the watch."""
        from kubernetes.client.exceptions import ApiException

        query = [("fieldSelector", field_selector), ("watch", "true"), ("resourceVersion", resource_version),
                 ("allowWatchBookmarks", "true"), ("timeoutSeconds", timeout_s)]
        try:
            resp = self._request("GET", f"{RESOURCE}/resourceslices", query, timeout=(3.05, timeout_s + 10))
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
        return self._call("POST", f"{RESOURCE}/resourceslices", body=body)

    def replace_slice(self, name: str, body: dict) -> dict:
        return self._call("PUT", f"{RESOURCE}/resourceslices/{quote(name)}", body=body)

    def delete_slice(self, name: str, resource_version: str | None = None) -> None:
        body = {"preconditions": {"resourceVersion": resource_version}} if resource_version else None
        self._call("DELETE", f"{RESOURCE}/resourceslices/{quote(name)}", body=body)

    # --- Nodes and Events
    def get_node(self, name: str) -> dict:
        return self._call("GET", f"/api/v1/nodes/{quote(name)}")

    def patch_node_json(self, name: str, ops: list[dict]) -> dict:
        return self._call("PATCH", f"/api/v1/nodes/{quote(name)}", body=ops, content_type=JSON_PATCH)

    def create_event(self, namespace: str, body: dict) -> dict:
        return self._call("POST", f"/api/v1/namespaces/{quote(namespace)}/events", body=body)


def _claim_names(pod: dict) -> list[str]:
    """The ResourceClaim names one pod uses (see KubeApi.pod_claim_names); malformed entries are skipped."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    entries = [*(spec.get("resourceClaims") or []), *(status.get("resourceClaimStatuses") or []),
               status.get("extendedResourceClaimStatus") or {}]
    return [e["resourceClaimName"] for e in entries
            if isinstance(e, dict) and isinstance(e.get("resourceClaimName"), str) and e["resourceClaimName"]]


def _reason(exc) -> str:
    try:
        return json.loads(exc.body).get("message") or exc.reason
    except Exception:
        return str(exc.reason or exc)
