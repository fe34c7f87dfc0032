"""`gpuslice admission-webhook`: POST /mutate over TLS answers an
AdmissionReview (admission/review.py); GET /healthz. Bodies are bounded
(the API server sends a pod), reads time out, and at most MAX_IN_FLIGHT
reviews run at once (more are answered 503 at once, and the API server's
failurePolicy decides)."""

from __future__ import annotations

import json
import logging
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpuslice import errors
from gpuslice.admission.review import Settings, answer
from gpuslice.http_json import read_bounded, send_json

log = logging.getLogger(__name__)

MAX_BODY = 3 << 20  # the API server's request size limit is 3 MiB
MAX_IN_FLIGHT = 64


class Server:
    def __init__(self, settings: Settings, host: str, port: int, cert: Path, key: Path) -> None:
        self.settings = settings
        self.slots = threading.BoundedSemaphore(MAX_IN_FLIGHT)
        self.http = ThreadingHTTPServer((host, port), self._handler())
        self.http.daemon_threads = True
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            tls.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as e:
            self.http.server_close()
            raise errors.InvalidArgument(f"TLS certificate {cert} and key {key}: {e}") from e
        self.http.socket = tls.wrap_socket(self.http.socket, server_side=True)
        self.stopping = threading.Event()

    @property
    def port(self) -> int:
        return int(self.http.server_address[1])

    def serve(self) -> None:
        # a review takes ~30 us of Python; with one thread per kept connection, the default 5 ms
        # switch interval would let one thread's turn hold the others' answers back
        sys.setswitchinterval(0.0005)
        log.info("serving POST /mutate on %s:%d (mode %s)", *self.http.server_address[:2], self.settings.mode)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.stopping.wait()
        self.http.shutdown()
        self.http.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 10  # a slow sender, or a kept connection left idle, cannot hold a thread
            protocol_version = "HTTP/1.1"  # kept alive: the API server's webhook client pools its connections
            # the headers and the body go out as two writes: with Nagle on, the second waits for the
            # caller's delayed ACK (40 ms on Linux)
            disable_nagle_algorithm = True

            def log_message(self, fmt: str, *args: object) -> None:
                log.debug(fmt, *args)

            def _send(self, code: int, body: Any) -> None:
                send_json(self, code, body)

            def do_GET(self) -> None:
                if self.path == "/healthz":
                    return self._send(200, {"ok": True})
                self._send(404, {"error": f"no {self.path} (accepted: POST /mutate, GET /healthz)"})

            def do_POST(self) -> None:
                if self.path.split("?", 1)[0] != "/mutate":
                    return self._send(404, {"error": f"no {self.path} (accepted: POST /mutate)"})
                raw = read_bounded(self, MAX_BODY, server.slots)
                if raw is None:
                    return None
                try:
                    self._send(200, answer(json.loads(raw), server.settings))
                except (ValueError, errors.InvalidArgument) as e:
                    self._send(400, {"error": str(e)})
                finally:
                    server.slots.release()

        return Handler
