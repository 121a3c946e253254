"""A small HTTP/1.1 GET server whose cost does not grow with what the network sends it.

The driver's liveness and metrics ports are reachable from the pod network, so anyone there may open
thousands of connections and leave them idle, trickle a request one byte at a time, or queue thousands of
requests. Rules that keep the kubelet's probe answered within its timeout and the memory flat regardless:

- one thread owns every socket (a `selectors` loop) and a fixed pool of `workers` threads computes the
  answers; no thread per connection, and no handler ever touches a socket;
- at most `max_connections` sockets are open; a new connection beyond that closes the connection that has
  been idle (reading or writing) the longest, so a flood of idle connections cannot lock out the next probe;
  if every open connection is waiting for a worker, the new one is closed instead;
- each connection must finish its request head (and then each keep-alive request, or its response write)
  within `idle_timeout_s` of its last progress, and a head is at most `max_request_bytes`;
- the accept queue is drained each turn of the loop, so queued connections do not delay the probe's SYN.

Only GET and HEAD without a body are served; anything else is answered 400/405 and closed.
"""

from __future__ import annotations

import collections
import errno
import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64
WORKERS = 2
IDLE_TIMEOUT_S = 5.0
MAX_REQUEST_BYTES = 8192
LISTEN_BACKLOG = 1024
ACCEPTS_PER_TURN = 512
ACCEPT_PAUSE_S = 0.1  # the process is out of file descriptors and nothing of ours can be closed
_READ_CHUNK = 4096


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: Mapping[str, str]  # lower-cased names


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Response]


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    buffer: bytearray = field(default_factory=bytearray)
    out: memoryview | None = None
    keep_alive: bool = False
    busy: bool = False  # its request is with a worker
    draining: bool = False  # answered and half-closed; what the client still sends is read and dropped


class BoundedHttpServer:
    """Serve `routes` (path -> handler) on address:port from one loop thread and `workers` handler threads."""

    def __init__(self, name: str, address: str, port: int, routes: Mapping[str, Handler], *,
                 max_connections: int = MAX_CONNECTIONS, workers: int = WORKERS,
                 idle_timeout_s: float = IDLE_TIMEOUT_S, max_request_bytes: int = MAX_REQUEST_BYTES) -> None:
        self.name, self.routes = name, dict(routes)
        self.max_connections, self.idle_timeout_s, self.max_request_bytes = (
            max_connections, idle_timeout_s, max_request_bytes)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        try:
            self._listener = socket.create_server((address, port), family=family, backlog=LISTEN_BACKLOG)
        except OSError as exc:
            raise OSError(f"{name}: cannot listen on {address}:{port}: {exc.strerror or exc}") from None
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._wake_reader, self._wake_writer = socket.socketpair()
        for s in (self._wake_reader, self._wake_writer):
            s.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_reader, selectors.EVENT_READ)
        # Connections not with a worker, oldest progress first: the eviction and timeout order.
        self._idle: collections.OrderedDict[_Connection, float] = collections.OrderedDict()
        self._busy: set[_Connection] = set()
        self._answered: queue.SimpleQueue[tuple[_Connection, bytes, bool]] = queue.SimpleQueue()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=name)
        self._stopping = threading.Event()
        self._accept_paused_until = 0.0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> BoundedHttpServer:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stopping.set()
        self._wake()
        self._thread.join(timeout_s)
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def open_connections(self) -> int:
        return len(self._idle) + len(self._busy)

    # ----- the loop (the only code that touches sockets)
    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                self._resume_accepting(now)
                for key, mask in self._selector.select(self._next_timeout(now)):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_reader:
                        self._drain_wakes()
                    elif mask & selectors.EVENT_READ:
                        self._read(key.data)
                    else:
                        self._write(key.data)
                self._send_answers()
                self._expire(time.monotonic())
        finally:
            for conn in [*self._idle, *self._busy]:
                self._close(conn)
            for s in (self._listener, self._wake_reader, self._wake_writer):
                s.close()
            self._selector.close()

    def _next_timeout(self, now: float) -> float:
        deadlines = [now + self.idle_timeout_s]
        if self._idle:
            deadlines.append(next(iter(self._idle.values())) + self.idle_timeout_s)
        if self._accept_paused_until:
            deadlines.append(self._accept_paused_until)
        return max(0.0, min(deadlines) - now)

    def _expire(self, now: float) -> None:
        while self._idle:
            conn, since = next(iter(self._idle.items()))
            if now - since < self.idle_timeout_s:
                return
            self._close(conn)

    def _touch(self, conn: _Connection) -> None:
        self._idle[conn] = time.monotonic()
        self._idle.move_to_end(conn)

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            try:
                sock, _addr = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM) and self._idle:
                    self._close(next(iter(self._idle)))  # a descriptor for the newcomer
                    continue
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._pause_accepting()
                return  # ECONNABORTED and the like: the client gave up; the next turn accepts again
            if self.open_connections >= self.max_connections:
                if not self._idle:  # everyone open is waiting for a worker: the newcomer waits its turn elsewhere
                    sock.close()
                    continue
                self._close(next(iter(self._idle)))
            sock.setblocking(False)
            conn = _Connection(sock)
            self._selector.register(sock, selectors.EVENT_READ, conn)
            self._touch(conn)

    def _pause_accepting(self) -> None:
        self._selector.unregister(self._listener)
        self._accept_paused_until = time.monotonic() + ACCEPT_PAUSE_S
        log.warning(f"{self.name}: out of file descriptors; not accepting for {ACCEPT_PAUSE_S} s")

    def _resume_accepting(self, now: float) -> None:
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._selector.register(self._listener, selectors.EVENT_READ)

    def _read(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(_READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        if conn.draining:
            return  # not progress: the idle timeout still counts from the answer
        conn.buffer += data
        self._touch(conn)
        self._dispatch_if_complete(conn)

    def _dispatch_if_complete(self, conn: _Connection) -> None:
        end = conn.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(conn.buffer) > self.max_request_bytes:
                self._answer_now(conn, _plain(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large"))
            return
        head = bytes(conn.buffer[:end]).decode("latin-1")
        del conn.buffer[:end + 4]
        request, keep_alive, refusal = _parse(head)
        if refusal is not None:
            self._answer_now(conn, refusal)
            return
        handler = self.routes.get(request.path)
        if handler is None:
            self._answer_now(conn, _plain(HTTPStatus.NOT_FOUND, f"no {request.path}; try {', '.join(self.routes)}"),
                             keep_alive)
            return
        conn.busy = True
        self._selector.unregister(conn.sock)  # nothing more is read until this request is answered
        self._idle.pop(conn, None)
        self._busy.add(conn)
        self._pool.submit(self._handle, conn, handler, request, keep_alive)

    def _handle(self, conn: _Connection, handler: Handler, request: Request, keep_alive: bool) -> None:
        try:
            response = handler(request)
        except Exception as exc:  # noqa: BLE001 - a handler's bug answers 500, the server keeps serving
            log.exception(f"{self.name}: handler for {request.path} failed")
            response = _plain(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")
        self._answered.put((conn, _encode(response, keep_alive, head_only=request.method == "HEAD"), keep_alive))
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_writer.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # a wake byte is already pending, or the server is closing

    def _drain_wakes(self) -> None:
        try:
            while self._wake_reader.recv(_READ_CHUNK):
                pass
        except (BlockingIOError, OSError):
            pass

    def _send_answers(self) -> None:
        while True:
            try:
                conn, payload, keep_alive = self._answered.get_nowait()
            except queue.Empty:
                return
            self._busy.discard(conn)
            conn.busy = False
            self._selector.register(conn.sock, selectors.EVENT_WRITE, conn)
            self._start_write(conn, payload, keep_alive)

    def _answer_now(self, conn: _Connection, response: Response, keep_alive: bool = False) -> None:
        self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._start_write(conn, _encode(response, keep_alive, head_only=False), keep_alive)

    def _start_write(self, conn: _Connection, payload: bytes, keep_alive: bool) -> None:
        conn.out, conn.keep_alive = memoryview(payload), keep_alive
        self._touch(conn)
        self._write(conn)

    def _write(self, conn: _Connection) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except BlockingIOError:
            return
        except OSError:
            self._close(conn)
            return
        conn.out = conn.out[sent:]
        self._touch(conn)
        if conn.out:
            return
        conn.out = None
        if not conn.keep_alive:
            self._drain_and_close(conn)
            return
        self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
        self._dispatch_if_complete(conn)  # a pipelined request already read

    def _drain_and_close(self, conn: _Connection) -> None:
        """Half-close and wait for the client's end (or the idle timeout): closing with unread bytes sends
        a reset, which can destroy the answer before the client reads it (as Go's net/http closeWriteAndWait)."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.draining = True
        conn.buffer.clear()
        self._selector.modify(conn.sock, selectors.EVENT_READ, conn)

    def _close(self, conn: _Connection) -> None:
        self._idle.pop(conn, None)
        self._busy.discard(conn)
        if not conn.busy:
            try:
                self._selector.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
        conn.sock.close()


def _parse(head: str) -> tuple[Request, bool, Response | None]:
    """The request, whether to keep the connection, and a refusal to send instead (then close)."""
    lines = head.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return Request("", "", {}), False, _plain(HTTPStatus.BAD_REQUEST, "expected an HTTP/1.x request line")
    method, target, version = parts
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    request = Request(method, target.split("?", 1)[0], headers)
    if method not in ("GET", "HEAD"):
        return request, False, _plain(HTTPStatus.METHOD_NOT_ALLOWED, "only GET and HEAD are served",
                                      {"Allow": "GET, HEAD"})
    if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
        return request, False, _plain(HTTPStatus.BAD_REQUEST, "a GET here has no body")
    connection = headers.get("connection", "").lower()
    keep_alive = connection == "keep-alive" if version == "HTTP/1.0" else connection != "close"
    return request, keep_alive, None


def _plain(status: HTTPStatus, text: str, headers: Mapping[str, str] | None = None) -> Response:
    return Response(int(status), (text + "\n").encode(), headers=headers or {})


def _encode(response: Response, keep_alive: bool, *, head_only: bool) -> bytes:
    reason = HTTPStatus(response.status).phrase
    lines = [f"HTTP/1.1 {response.status} {reason}", f"Content-Type: {response.content_type}",
             f"Content-Length: {len(response.body)}", f"Connection: {'keep-alive' if keep_alive else 'close'}",
             *(f"{k}: {v}" for k, v in response.headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else response.body)
