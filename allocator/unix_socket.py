"""A listening unix socket, each client served in a thread of its own under a
deadline: the slice socket's and the runtime socket's common part.

Clients are bounded three ways, so that one uid cannot slow another: a whole
request must arrive within `deadline_s` (a silent or dripping client is cut
off), a uid holds at most `per_uid` connections at once (more are closed at
accept), and the server at most `max_clients`.  The peer is identified at
accept by a pidfd (identity.peer_of), never by a bare pid."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections import Counter
from pathlib import Path

from gpuslice.allocator import identity

log = logging.getLogger(__name__)


class Deadline:
    """The time left to one client; reads and writes past it raise TimeoutError."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def arm(self, conn: socket.socket) -> None:
        left = self.at - time.monotonic()
        if left <= 0:
            raise TimeoutError("the client's time is up")
        conn.settimeout(left)

    def recv_exact(self, conn: socket.socket, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            self.arm(conn)
            chunk = conn.recv(size - len(data))
            if not chunk:
                break
            data += chunk
        return bytes(data)


class UnixSocketServer:
    """Accepts clients on `path` (created with `mode` from its first moment) and
    calls handle(conn, peer, deadline) for each in a thread of its own."""

    name = "unix-socket"
    deadline_s = 2.0
    per_uid = 8
    max_clients = 128

    def __init__(self, path: Path, mode: int) -> None:
        self.path = path
        self.mode = mode
        self._count_lock = threading.Lock()
        self._by_uid: Counter[int] = Counter()
        self._active = 0
        self.refused = 0  # connections closed at accept: over a cap, or a peer already gone
        self.sock = self._bind()
        self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)

    def _bind(self) -> socket.socket:
        self.path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o777 & ~self.mode)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, self.mode)
        sock.listen(128)
        self._inode = os.stat(self.path).st_ino
        return sock

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._close(self.sock)

    @staticmethod
    def _close(sock: socket.socket) -> None:
        # shutdown wakes a thread blocked in accept(); close alone would not
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    def ensure_bound(self) -> bool:
        """Bind the socket again where its file was removed or replaced; True when it did."""
        try:
            if os.stat(self.path).st_ino == self._inode:
                return False
        except FileNotFoundError:
            pass
        old = self.sock
        self.sock = self._bind()
        self._close(old)  # the accept loop wakes with an error and goes on with the new socket
        log.warning("%s: %s was gone; bound it again", self.name, self.path)
        return True

    def handle(self, conn: socket.socket, peer: identity.Peer, deadline: Deadline) -> None:
        raise NotImplementedError

    def _serve(self) -> None:
        while True:
            sock = self.sock
            try:
                conn, _ = sock.accept()
            except OSError:
                if sock is self.sock:
                    return  # stopped
                continue  # rebound: accept on the new socket
            try:
                peer = identity.peer_of(conn)
            except (identity.NoSuchProcess, OSError) as e:
                log.debug("%s: %s", self.name, e)
                self.refused += 1
                conn.close()
                continue
            if not self._admit(peer.uid):
                self.refused += 1
                peer.close()
                conn.close()
                continue
            threading.Thread(target=self._one, args=(conn, peer), name=f"{self.name}-client", daemon=True).start()

    def _admit(self, uid: int) -> bool:
        with self._count_lock:
            if self._active >= self.max_clients or self._by_uid[uid] >= self.per_uid:
                return False
            self._active += 1
            self._by_uid[uid] += 1
            return True

    def _one(self, conn: socket.socket, peer: identity.Peer) -> None:
        try:
            with conn:
                self.handle(conn, peer, Deadline(self.deadline_s))
        except (OSError, ValueError) as e:  # TimeoutError is an OSError
            log.warning("%s client (uid %d): %s", self.name, peer.uid, e)
        finally:
            peer.close()
            with self._count_lock:
                self._active -= 1
                self._by_uid[peer.uid] -= 1
                if not self._by_uid[peer.uid]:
                    del self._by_uid[peer.uid]
