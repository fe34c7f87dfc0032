"""A listening unix socket served by its own thread: the slice socket's and the
runtime socket's common part."""

from __future__ import annotations

import logging
import os
import socket
import threading
from pathlib import Path

log = logging.getLogger(__name__)


class UnixSocketServer:
    """Accepts clients on `path` (created with `mode` from its first moment) and
    calls handle(conn) for each, in the accepting thread, or in a thread of its
    own when `threaded`."""

    name = "unix-socket"
    timeout_s = 2.0
    threaded = False

    def __init__(self, path: Path, mode: int) -> None:
        self.path = path
        path.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o777 & ~mode)
        try:
            self.sock.bind(str(path))
        finally:
            os.umask(old)
        os.chmod(path, mode)
        self.sock.listen(128)
        self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.sock.close()

    def handle(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.threaded:
                threading.Thread(target=self._one, args=(conn,), name=f"{self.name}-client", daemon=True).start()
            else:
                self._one(conn)

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(self.timeout_s)
            try:
                self.handle(conn)
            except (OSError, ValueError) as e:
                log.warning("%s client: %s", self.name, e)
