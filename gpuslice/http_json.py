"""JSON over HTTP for the components Kubernetes calls: the scheduler extender
and the admission webhook (and the API stand-in the tests run). A reply sized
and typed, a request body read within bounds, and `JsonServer`, which serves
POST routes and GET /healthz on threads until its `stopping` is set: a
thread per connection on a `BoundedHTTPServer` (at most `MAX_CONNECTIONS`
of them; the daemon's metrics are served on one too), each one's TLS
handshake and reads under its timeout."""

from __future__ import annotations

import json
import logging
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 256  # open at once; one more is closed as it is accepted


def send_json(handler: BaseHTTPRequestHandler, code: int, body: Any) -> None:
    data = json.dumps(body).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def read_bounded(handler: BaseHTTPRequestHandler, max_body: int, slots: threading.BoundedSemaphore) -> bytes | None:
    """The request's body, with one of the slots taken (the caller releases it);
    None once an error was answered: no length (411), more than `max_body`
    bytes (413), or every slot busy (503, at once: the caller's retry decides)."""
    handler.close_connection = True  # until the body is read: an unread one would be taken for the next request
    try:
        length = int(handler.headers.get("Content-Length", ""))
    except ValueError:
        send_json(handler, 411, {"error": "a Content-Length is required"})
        return None
    if not 0 <= length <= max_body:
        send_json(handler, 413, {"error": f"a body of {length} bytes (accepted: up to {max_body})"})
        return None
    if not slots.acquire(blocking=False):
        send_json(handler, 503, {"error": "every slot is busy; try again"})
        return None
    data = handler.rfile.read(length)
    handler.close_connection = handler.request_version != "HTTP/1.1" or handler.headers.get("Connection") == "close"
    return data


class JsonServer:
    """POST routes answered in JSON by `post`, and GET /healthz. Bodies are
    bounded (`max_body`), a read times out after 10 s, and at most
    `max_in_flight` calls run at once (more are answered 503 at once: the
    caller's retry or failure policy decides)."""

    accepted = ""  # the POST routes, for the line a request to another path gets
    keep_alive = False  # HTTP/1.1: the caller's client pools its connections

    def __init__(self, host: str, port: int, max_body: int, max_in_flight: int) -> None:
        self.max_body = max_body
        self.slots = threading.BoundedSemaphore(max_in_flight)
        self.http = BoundedHTTPServer((host, port), _handler(self))
        self.tls = False
        self.stopping = threading.Event()

    def use_tls(self, context: ssl.SSLContext) -> None:
        """Serve over TLS. The handshake is the connection's thread's, under its read
        timeout: done as each connection is accepted, one caller that connects and sends
        nothing would stop every other from being accepted."""
        self.http.socket = context.wrap_socket(self.http.socket, server_side=True, do_handshake_on_connect=False)
        self.tls = True

    @property
    def port(self) -> int:
        return int(self.http.server_address[1])

    def post(self, path: str, body: bytes) -> tuple[int, Any] | None:
        """The status and body answering `body` posted to `path`; None: no such route."""
        raise NotImplementedError

    def describe(self) -> str:
        """What the start-up line says is served."""
        return self.accepted

    def serve(self) -> None:
        log.info("serving %s on %s:%d", self.describe(), *self.http.server_address[:2])
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.stopping.wait()
        self.http.shutdown()
        self.http.server_close()


class BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, at most MAX_CONNECTIONS at once: one more is closed as
    it is accepted, so a flood of idle connections cannot grow the process's threads
    without end (its handler's `timeout` ends each idle one). IPv6 where the address
    is one."""

    daemon_threads = True
    request_queue_size = 128  # the listen backlog (socketserver's 5 drops callers connecting together)

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self.connections = threading.BoundedSemaphore(MAX_CONNECTIONS)
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)

    def process_request(self, request: socket.socket, client_address: Any) -> None:  # type: ignore[override]
        if not self.connections.acquire(blocking=False):
            log.debug("%d connections open: one from %s closed", MAX_CONNECTIONS, client_address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.connections.release()  # no thread took it
            raise

    def process_request_thread(self, request: socket.socket, client_address: Any) -> None:  # type: ignore[override]
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release()


def _handler(server: JsonServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = 10  # a slow sender, or a kept connection left idle, cannot hold a thread
        protocol_version = "HTTP/1.1" if server.keep_alive else "HTTP/1.0"
        # a reply's status line, headers and body are buffered and sent in one write (one TLS
        # record) when the request is done: the handler's flush after each request sends them
        wbufsize = 1 << 16
        disable_nagle_algorithm = True  # a reply must never wait for the caller's delayed ACK (40 ms)
        handshaken = True

        def setup(self) -> None:
            super().setup()  # the timeout set on the connection first
            if server.tls:
                try:
                    self.connection.do_handshake()
                except OSError as e:  # ssl.SSLError and a timeout are OSErrors
                    log.debug("TLS handshake with %s: %s", self.client_address, e)
                    self.handshaken = False

        def handle(self) -> None:
            if self.handshaken:
                super().handle()

        def log_message(self, fmt: str, *args: object) -> None:
            log.debug(fmt, *args)

        def do_GET(self) -> None:
            if self.path == "/healthz":
                return send_json(self, 200, {"ok": True})
            send_json(self, 404, {"error": f"no {self.path} (accepted: {server.accepted}, GET /healthz)"})

        def do_POST(self) -> None:
            body = read_bounded(self, server.max_body, server.slots)
            if body is None:
                return
            try:
                answer = server.post(self.path.split("?", 1)[0], body)
            finally:
                server.slots.release()
            if answer is None:
                return send_json(self, 404, {"error": f"no {self.path} (accepted: {server.accepted})"})
            send_json(self, *answer)

    return Handler
