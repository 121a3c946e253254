"""A small in-test Kubernetes API server for the driver tests: the endpoints the drivers call, with
Kubernetes semantics where the drivers depend on them.

- one global resourceVersion counter; every write bumps it and is recorded as a watch event;
- GET 404 (Status body, reason NotFound); POST of an existing name 409 AlreadyExists; PUT with a stale
  metadata.resourceVersion 409 Conflict; DELETE honours preconditions.resourceVersion;
- LIST returns metadata.resourceVersion; fieldSelector spec.nodeName / spec.driver on ResourceSlices;
- WATCH from a resourceVersion replays later events, streams new ones, sends BOOKMARKs when asked,
  ends after timeoutSeconds, and answers 410 Gone (as an ERROR event) for a version older than the
  retained history (compaction);
- JSON patch (test/add/replace/remove) on Nodes; Events are accepted and kept;
- Pods: a claim put with `reservedFor` pods gets those pods, bound to the node its allocation names and
  using the claim by name (what the scheduler and kubelet leave); LIST with fieldSelector spec.nodeName,
  paged with limit/continue; `claim_lists` counts cluster-wide claim LISTs;
- `put_raw_claim` stores a claim as raw JSON bytes, served as is (objects Python's encoder cannot write,
  e.g. nested thousands of levels deep); `claim_delay_s[name]` stalls a claim's GET.
Faults: `fail_all` (every call 503), `drop_watches()` (close every open watch), `compact()`.
`writes` counts successful writes per (resource, verb) for the zero-idle-writes checks.
"""

from __future__ import annotations

import copy
import json
import re
import socket
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

RESOURCE = "/apis/resource.k8s.io/v1"


class FakeKube:
    def __init__(self, history: int = 10000) -> None:
        self.lock = threading.Condition()
        self.rv = 100
        self.slices: dict[str, dict] = {}
        self.claims: dict[tuple[str, str], dict] = {}
        self.raw_claims: dict[tuple[str, str], bytes] = {}
        self.pods: dict[tuple[str, str], dict] = {}
        self.claim_lists = 0
        self.claim_delay_s: dict[str, float] = {}
        self.nodes: dict[str, dict] = {}
        self.events: list[dict] = []
        self.slice_events: list[tuple[int, str, dict]] = []  # (rv, type, object)
        self.history = history
        self.oldest_rv = self.rv
        self.writes: Counter = Counter()
        self.requests: Counter = Counter()
        self.fail_all = False
        self.watch_generation = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.server.handle_error = lambda request, address: None  # clients killed with -9 reset connections
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        }))
        return path

    def close(self) -> None:
        self.drop_watches()
        self.server.shutdown()
        self.server.server_close()

    # ----- direct (test-side) access
    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def add_node(self, name: str, allocatable: dict | None = None, taints: list | None = None) -> dict:
        with self.lock:
            node = {"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "uid": str(uuid.uuid4()), "resourceVersion": self._next_rv()},
                    "spec": {"taints": taints or []},
                    "status": {"allocatable": allocatable or {"cpu": "96", "memory": "2000Gi"}}}
            self.nodes[name] = node
            return copy.deepcopy(node)

    def put_claim(self, claim: dict) -> dict:
        with self.lock:
            claim = copy.deepcopy(claim)
            meta = claim.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta["resourceVersion"] = self._next_rv()
            self.claims[(meta["namespace"], meta["name"])] = claim
            nodes = [v for term in (((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector") or {})
                     .get("nodeSelectorTerms", []) for f in term.get("matchFields", []) for v in f.get("values", [])]
            for user in (claim.get("status") or {}).get("reservedFor") or []:
                if user.get("resource") == "pods" and nodes:
                    self.add_pod(meta["namespace"], user["name"], nodes[0], [meta["name"]], uid=user.get("uid"))
            return copy.deepcopy(claim)

    def put_raw_claim(self, namespace: str, name: str, body: bytes) -> None:
        with self.lock:
            self.raw_claims[(namespace, name)] = body

    def add_pod(self, namespace: str, name: str, node: str, claims: list[str], *, uid: str | None = None,
                from_template: bool = False) -> dict:
        """A pod bound to `node` using `claims` by name (`from_template`: named in status, as generated claims are)."""
        with self.lock:
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4()),
                                "resourceVersion": self._next_rv()},
                   "spec": {"nodeName": node, "resourceClaims": [
                       {"name": f"c{i}", **({"resourceClaimTemplateName": "t"} if from_template
                                            else {"resourceClaimName": c})} for i, c in enumerate(claims)]},
                   "status": {"phase": "Running"}}
            if from_template:
                pod["status"]["resourceClaimStatuses"] = [{"name": f"c{i}", "resourceClaimName": c}
                                                          for i, c in enumerate(claims)]
            self.pods[(namespace, name)] = pod
            return copy.deepcopy(pod)

    def delete_claim(self, namespace: str, name: str) -> None:
        with self.lock:
            self.claims.pop((namespace, name), None)

    def delete_slice(self, name: str) -> bool:
        with self.lock:
            obj = self.slices.pop(name, None)
            if obj is not None:
                self._slice_event("DELETED", obj, bump=True)
            return obj is not None

    def node_taints(self, name: str) -> list[dict]:
        with self.lock:
            return copy.deepcopy(self.nodes[name]["spec"].get("taints") or [])

    def slices_of(self, node: str, driver: str | None = None) -> list[dict]:
        with self.lock:
            return [copy.deepcopy(s) for s in self.slices.values() if s["spec"].get("nodeName") == node
                    and (driver is None or s["spec"]["driver"] == driver)]

    def device_count(self, node: str, driver: str) -> int:
        """Devices in a node's slices of one driver (cheap: no copies, for tight polling loops)."""
        with self.lock:
            return sum(len(s["spec"].get("devices") or []) for s in self.slices.values()
                       if s["spec"].get("nodeName") == node and s["spec"]["driver"] == driver)

    def drop_watches(self) -> None:
        with self.lock:
            self.watch_generation += 1
            self.lock.notify_all()

    def compact(self) -> None:
        """Forget the event history (as etcd compaction does): older watches get 410 Gone."""
        with self.lock:
            self.slice_events.clear()
            self.oldest_rv = self.rv

    def _slice_event(self, type_: str, obj: dict, bump: bool = False) -> None:
        obj = copy.deepcopy(obj)
        if bump:
            obj["metadata"]["resourceVersion"] = self._next_rv()
        self.slice_events.append((int(obj["metadata"]["resourceVersion"]), type_, obj))
        if len(self.slice_events) > self.history:
            dropped = self.slice_events[: len(self.slice_events) - self.history]
            del self.slice_events[: len(dropped)]
            self.oldest_rv = dropped[-1][0]
        self.lock.notify_all()


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
            "message": message}


def _matches(obj: dict, selector: str) -> bool:
    for term in filter(None, (selector or "").split(",")):
        key, _, value = term.partition("=")
        node = obj
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node != value:
            return False
    return True


def _json_patch(doc: dict, ops: list[dict]) -> dict:
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {})
        last = parts[-1]
        if op["op"] == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != op.get("value"):
                raise ValueError(f"test failed at {op['path']}")
        elif op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), op["value"])
            else:
                parent[last] = op["value"]
        elif op["op"] == "remove":
            if isinstance(parent, list):
                parent.pop(int(last))
            else:
                parent.pop(last)
        else:
            raise ValueError(f"unsupported op {op['op']}")
    return doc


def _handler(kube: FakeKube):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def setup(self) -> None:
            super().setup()
            # as Go's net/http does: without it Nagle + delayed ACK add 40 ms to every response
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def _send(self, code: int, body: dict) -> None:
            self._send_bytes(code, json.dumps(body).encode())

        def _send_bytes(self, code: int, data: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self):
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length)) if length else None

        def _route(self, verb: str) -> None:
            url = urlparse(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            kube.requests[(verb, url.path.rsplit("/", 1)[0] if verb != "POST" else url.path)] += 1
            body = self._body() if verb in ("POST", "PUT", "PATCH", "DELETE") else None
            if kube.fail_all:
                self._send(503, _status(503, "ServiceUnavailable", "injected outage"))
                return
            path = url.path
            try:
                if path == f"{RESOURCE}/resourceslices" and verb == "GET":
                    if str(query.get("watch")).lower() in ("true", "1"):
                        return self._watch(query)
                    return self._list_slices(query)
                if path == f"{RESOURCE}/resourceslices" and verb == "POST":
                    return self._create_slice(body)
                m = re.fullmatch(rf"{RESOURCE}/resourceslices/([^/]+)", path)
                if m:
                    return self._slice(verb, m.group(1), body)
                m = re.fullmatch(rf"{RESOURCE}/namespaces/([^/]+)/resourceclaims/([^/]+)", path)
                if m and verb == "GET":
                    time.sleep(kube.claim_delay_s.get(m.group(2), 0))
                    with kube.lock:
                        raw = kube.raw_claims.get((m.group(1), m.group(2)))
                        if raw is not None:
                            return self._send_bytes(200, raw)
                        claim = kube.claims.get((m.group(1), m.group(2)))
                        if claim is None:
                            return self._send(404, _status(404, "NotFound", f'resourceclaims "{m.group(2)}" not found'))
                        return self._send(200, copy.deepcopy(claim))
                if path == f"{RESOURCE}/resourceclaims" and verb == "GET":
                    with kube.lock:
                        kube.claim_lists += 1
                        items = [json.dumps(c).encode() for c in kube.claims.values()] + list(kube.raw_claims.values())
                        return self._send_bytes(200, b'{"kind": "ResourceClaimList", "metadata": {"resourceVersion": "'
                                                + str(kube.rv).encode() + b'"}, "items": [' + b", ".join(items) + b"]}")
                if path == "/api/v1/pods" and verb == "GET":
                    return self._list_pods(query)
                m = re.fullmatch(r"/api/v1/nodes/([^/]+)", path)
                if m:
                    return self._node(verb, m.group(1), body)
                m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/events", path)
                if m and verb == "POST":
                    with kube.lock:
                        body["metadata"]["resourceVersion"] = kube._next_rv()
                        kube.events.append(body)
                        kube.writes[("events", "create")] += 1
                    return self._send(201, body)
            except (ValueError, KeyError, TypeError) as exc:
                return self._send(400, _status(400, "BadRequest", str(exc)))
            self._send(404, _status(404, "NotFound", f"no route {verb} {path}"))

        def do_GET(self):  # noqa: N802
            self._route("GET")

        def do_POST(self):  # noqa: N802
            self._route("POST")

        def do_PUT(self):  # noqa: N802
            self._route("PUT")

        def do_PATCH(self):  # noqa: N802
            self._route("PATCH")

        def do_DELETE(self):  # noqa: N802
            self._route("DELETE")

        # ----- Pods
        def _list_pods(self, query):
            with kube.lock:
                items = [copy.deepcopy(p) for p in kube.pods.values() if _matches(p, query.get("fieldSelector", ""))]
                offset = int(query.get("continue") or 0)
                limit = int(query.get("limit") or 0) or len(items)
                page, more = items[offset:offset + limit], offset + limit < len(items)
                self._send(200, {"kind": "PodList", "apiVersion": "v1", "items": page, "metadata": {
                    "resourceVersion": str(kube.rv), **({"continue": str(offset + limit)} if more else {})}})

        # ----- ResourceSlices
        def _list_slices(self, query):
            with kube.lock:
                items = [copy.deepcopy(s) for s in kube.slices.values() if _matches(s, query.get("fieldSelector", ""))]
                self._send(200, {"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
                                 "metadata": {"resourceVersion": str(kube.rv)}, "items": items})

        def _create_slice(self, body):
            with kube.lock:
                meta = body.setdefault("metadata", {})
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                name = meta.get("name")
                if not name:
                    return self._send(422, _status(422, "Invalid", "metadata.name: Required value"))
                if len(body["spec"].get("devices") or []) > 128:
                    return self._send(422, _status(422, "Invalid", "spec.devices: Too many: must have at most 128"))
                if name in kube.slices:
                    return self._send(409, _status(409, "AlreadyExists", f'resourceslices "{name}" already exists'))
                meta["uid"] = str(uuid.uuid4())
                meta["resourceVersion"] = kube._next_rv()
                meta["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                kube.slices[name] = copy.deepcopy(body)
                kube.writes[("resourceslices", "create")] += 1
                kube._slice_event("ADDED", body)
                self._send(201, body)

        def _slice(self, verb, name, body):
            with kube.lock:
                current = kube.slices.get(name)
                if current is None:
                    return self._send(404, _status(404, "NotFound", f'resourceslices "{name}" not found'))
                if verb == "GET":
                    return self._send(200, copy.deepcopy(current))
                if verb == "PUT":
                    rv = (body.get("metadata") or {}).get("resourceVersion")
                    if rv and rv != current["metadata"]["resourceVersion"]:
                        return self._send(409, _status(409, "Conflict", f'Operation cannot be fulfilled on '
                                                       f'resourceslices "{name}": the object has been modified'))
                    if body["spec"].get("nodeName") != current["spec"].get("nodeName"):
                        return self._send(422, _status(422, "Invalid", "spec.nodeName: field is immutable"))
                    body["metadata"]["uid"] = current["metadata"]["uid"]
                    body["metadata"]["resourceVersion"] = kube._next_rv()
                    kube.slices[name] = copy.deepcopy(body)
                    kube.writes[("resourceslices", "update")] += 1
                    kube._slice_event("MODIFIED", body)
                    return self._send(200, body)
                if verb == "DELETE":
                    pre = ((body or {}).get("preconditions") or {}).get("resourceVersion")
                    if pre and pre != current["metadata"]["resourceVersion"]:
                        return self._send(409, _status(409, "Conflict", "precondition failed: resourceVersion"))
                    del kube.slices[name]
                    kube.writes[("resourceslices", "delete")] += 1
                    kube._slice_event("DELETED", current, bump=True)
                    return self._send(200, _status(200, "", "deleted") | {"status": "Success"})
            self._send(405, _status(405, "MethodNotAllowed", verb))

        def _watch(self, query):
            since = int(query.get("resourceVersion") or 0)
            timeout = float(query.get("timeoutSeconds") or 300)
            selector = query.get("fieldSelector", "")
            bookmarks = str(query.get("allowWatchBookmarks")).lower() in ("true", "1")
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def emit(event: dict) -> None:
                data = json.dumps(event).encode() + b"\n"
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            deadline = time.monotonic() + timeout
            with kube.lock:
                generation = kube.watch_generation
                if since and since < kube.oldest_rv:
                    emit({"type": "ERROR", "object": _status(410, "Expired", f"too old resource version: {since} "
                                                                              f"({kube.oldest_rv})")})
                    self.wfile.write(b"0\r\n\r\n")
                    return
            last = since
            last_bookmark = time.monotonic()
            try:
                while time.monotonic() < deadline:
                    with kube.lock:
                        if generation != kube.watch_generation:
                            break  # injected connection drop: end without the terminating chunk
                        pending = [(rv, t, o) for rv, t, o in kube.slice_events if rv > last]
                        if not pending:
                            kube.lock.wait(min(0.5, max(0.0, deadline - time.monotonic())))
                            pending = [(rv, t, o) for rv, t, o in kube.slice_events if rv > last]
                        current_rv = kube.rv
                    for rv, type_, obj in pending:
                        last = rv
                        if _matches(obj, selector):
                            emit({"type": type_, "object": obj})
                    if bookmarks and time.monotonic() - last_bookmark > 1.0:
                        last = max(last, current_rv)
                        emit({"type": "BOOKMARK", "object": {"kind": "ResourceSlice", "apiVersion": "resource.k8s.io/v1",
                                                             "metadata": {"resourceVersion": str(last)}}})
                        last_bookmark = time.monotonic()
                else:
                    self.wfile.write(b"0\r\n\r\n")
                    return
                self.close_connection = True
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        # ----- Nodes
        def _node(self, verb, name, body):
            with kube.lock:
                node = kube.nodes.get(name)
                if node is None:
                    return self._send(404, _status(404, "NotFound", f'nodes "{name}" not found'))
                if verb == "GET":
                    return self._send(200, copy.deepcopy(node))
                if verb == "PATCH":
                    if self.headers.get("Content-Type", "").split(";")[0] != "application/json-patch+json":
                        return self._send(415, _status(415, "UnsupportedMediaType", "json-patch only here"))
                    try:
                        patched = _json_patch(node, body)
                    except (ValueError, KeyError, IndexError) as exc:
                        return self._send(422, _status(422, "Invalid", str(exc)))
                    patched["metadata"]["resourceVersion"] = kube._next_rv()
                    kube.nodes[name] = patched
                    kube.writes[("nodes", "patch")] += 1
                    return self._send(200, copy.deepcopy(patched))
            self._send(405, _status(405, "MethodNotAllowed", verb))

    return Handler
