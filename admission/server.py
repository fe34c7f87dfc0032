"""`gpuslice admission-webhook`: POST /mutate over TLS answers an
AdmissionReview (admission/review.py); GET /healthz. Bodies are bounded
(the API server sends a pod), reads time out, and at most MAX_IN_FLIGHT
reviews run at once (more are answered 503 at once, and the API server's
failurePolicy decides)."""

from __future__ import annotations

import json
import ssl
import sys
from pathlib import Path
from typing import Any

from gpuslice import errors
from gpuslice.admission.review import Settings, answer
from gpuslice.http_json import JsonServer

MAX_BODY = 3 << 20  # the API server's request size limit is 3 MiB
MAX_IN_FLIGHT = 64


class Server(JsonServer):
    accepted = "POST /mutate"
    keep_alive = True  # the API server's webhook client pools its connections

    def __init__(self, settings: Settings, host: str, port: int, cert: Path, key: Path) -> None:
        super().__init__(host, port, MAX_BODY, MAX_IN_FLIGHT)
        self.settings = settings
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            tls.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as e:
            self.http.server_close()
            raise errors.InvalidArgument(f"TLS certificate {cert} and key {key}: {e}") from e
        self.use_tls(tls)

    def post(self, path: str, body: bytes) -> tuple[int, Any] | None:
        if path != "/mutate":
            return None
        try:
            return 200, answer(json.loads(body), self.settings)
        except (ValueError, errors.InvalidArgument) as e:
            return 400, {"error": str(e)}

    def describe(self) -> str:
        return f"POST /mutate (mode {self.settings.mode})"

    def serve(self) -> None:
        # a review takes ~30 us of Python; with one thread per kept connection, the default 5 ms
        # switch interval would let one thread's turn hold the others' answers back
        sys.setswitchinterval(0.0005)
        super().serve()
