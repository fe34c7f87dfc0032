"""A listening unix socket whose clients send one request and get one reply:
the slice socket's and the runtime socket's common part.

Any number of clients may connect, and what each costs is bounded instead:
one thread (the loop) accepts every connection at once and reads requests
without blocking, each into a buffer of at most `max_request` bytes. A
connection whose request has not arrived within `deadline_s` is closed, and
past `max_pending` such connections the oldest is closed to make room; an
honest client, which sends its request as it connects, is never the oldest.
A whole request goes to a queue per uid, and `workers` threads take from the
uids in turn, so a uid with many requests waits behind itself, not others;
each uid's queue holds at most `per_uid_queue`.  Nothing a client sends is
waited on by a worker. The peer is identified at accept by a pidfd
(identity.peer_of), never by a bare pid."""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
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


@dataclass
class Pending:
    """A connection whose request is still arriving."""

    conn: socket.socket
    peer: identity.Peer
    deadline: Deadline
    data: bytearray = field(default_factory=bytearray)
    oversize: bool = False  # more than max_request arrived: the rest is read and dropped

    def close(self) -> None:
        self.peer.close()
        self.conn.close()


class FairQueue:
    """Whole requests by uid; get() takes from the uids in turn."""

    def __init__(self, per_uid: int) -> None:
        self.per_uid = per_uid
        self._by_uid: dict[int, collections.deque[Pending]] = {}
        self._turns: collections.deque[int] = collections.deque()
        self._ready = threading.Condition()
        self.closed = False

    def put(self, uid: int, item: Pending) -> bool:
        with self._ready:
            queue = self._by_uid.get(uid)
            if queue is None:
                queue = self._by_uid[uid] = collections.deque()
                self._turns.append(uid)
            elif len(queue) >= self.per_uid:
                return False
            queue.append(item)
            self._ready.notify()
            return True

    def get(self) -> Pending | None:
        """The next request, or None once closed."""
        with self._ready:
            while not self._turns:
                if self.closed:
                    return None
                self._ready.wait()
            uid = self._turns.popleft()
            queue = self._by_uid[uid]
            item = queue.popleft()
            if queue:
                self._turns.append(uid)
            else:
                del self._by_uid[uid]
            return item

    def close(self) -> None:
        with self._ready:
            self.closed = True
            self._ready.notify_all()


class UnixSocketServer:
    """Accepts clients on `path` (created with `mode` from its first moment);
    respond(conn, peer, request, deadline) answers each whole request in a
    worker thread."""

    name = "unix-socket"
    deadline_s = 2.0  # for the whole request to arrive, and the reply to leave
    max_request = 4096
    max_pending = 4096
    per_uid_queue = 64
    workers = 8

    def __init__(self, path: Path, mode: int) -> None:
        self.path = path
        self.mode = mode
        self._pending: collections.OrderedDict[int, Pending] = collections.OrderedDict()  # oldest first
        self._queue = FairQueue(self.per_uid_queue)
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stopped = False
        self.sock = self._bind()
        self._listening: socket.socket | None = None
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)

    def _bind(self) -> socket.socket:
        self.path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        old = os.umask(0o777 & ~self.mode)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, self.mode)
        sock.listen(socket.SOMAXCONN)
        self._inode = os.stat(self.path).st_ino
        return sock

    def start(self) -> None:
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread.start()
        for i in range(self.workers):
            threading.Thread(target=self._work, name=f"{self.name}-worker-{i}", daemon=True).start()

    def stop(self) -> None:
        self._stopped = True
        self._queue.close()
        self._wake()
        self._close(self.sock)

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    @staticmethod
    def _close(sock: socket.socket) -> None:
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
        self.sock = self._bind()
        self._wake()  # the loop listens on the new socket and closes the old one
        log.warning("%s: %s was gone; bound it again", self.name, self.path)
        return True

    # -- what a server says --------------------------------------------------------------
    def complete(self, data: bytearray) -> bool:
        """Whether `data` is a whole request; otherwise it ends where the client shuts its side."""
        return False

    def respond(self, conn: socket.socket, peer: identity.Peer, request: bytes | None, deadline: Deadline) -> None:
        """Answer one request (None: it was longer than max_request)."""
        raise NotImplementedError

    # -- the loop: accept, read, hand over -----------------------------------------------
    def _loop(self) -> None:
        while not self._stopped:
            if self._listening is not self.sock:
                self._listen_on(self.sock)
            first = next(iter(self._pending.values()), None)
            timeout = max(0.0, first.deadline.at - time.monotonic()) if first else None
            for key, _ in self._selector.select(timeout):
                if key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                elif key.data == "listen":
                    self._accept_all()
                else:
                    self._read(key.data)
            self._expire()
        for item in list(self._pending.values()):
            self._drop(item)

    def _listen_on(self, sock: socket.socket) -> None:
        if self._listening is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(self._listening)
            self._close(self._listening)
        self._listening = sock
        with contextlib.suppress(ValueError, OSError):  # already closed by stop()
            self._selector.register(sock, selectors.EVENT_READ, "listen")

    def _accept_all(self) -> None:
        while True:
            try:
                conn, _ = self._listening.accept()  # type: ignore[union-attr]
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE) and self._pending:
                    self._drop(next(iter(self._pending.values())))  # room for this one
                    continue
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    log.warning("%s: %s; connections wait in the backlog", self.name, e)
                    time.sleep(0.01)
                return  # closed, or rebound: the loop picks up the new socket
            self._admit(conn)

    def _admit(self, conn: socket.socket) -> None:
        try:
            peer = identity.peer_of(conn)
        except (identity.NoSuchProcess, OSError) as e:
            log.debug("%s: %s", self.name, e)
            conn.close()
            return
        if len(self._pending) >= self.max_pending:
            self._drop(next(iter(self._pending.values())))
        conn.setblocking(False)
        item = Pending(conn, peer, Deadline(self.deadline_s))
        self._pending[conn.fileno()] = item
        self._selector.register(conn, selectors.EVENT_READ, item)
        self._read(item)  # the request usually came with the connection

    def _read(self, item: Pending) -> None:
        while True:
            try:
                chunk = item.conn.recv(65536)
            except BlockingIOError:
                if self.complete(item.data) and not item.oversize:
                    self._hand_over(item)
                return
            except OSError:
                self._drop(item)
                return
            if not chunk:  # the client shut its side: the request ends here
                self._hand_over(item)
                return
            if len(item.data) + len(chunk) > self.max_request:
                item.oversize = True
                item.data.clear()
            if not item.oversize:
                item.data += chunk

    def _hand_over(self, item: Pending) -> None:
        self._forget(item)
        if not self._queue.put(item.peer.uid, item):
            item.close()  # the uid's queue is full: it waits behind itself, and this one goes

    def _forget(self, item: Pending) -> None:
        self._pending.pop(item.conn.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(item.conn)

    def _drop(self, item: Pending) -> None:
        self._forget(item)
        item.close()

    def _expire(self) -> None:
        now = time.monotonic()
        while self._pending:
            item = next(iter(self._pending.values()))
            if item.deadline.at > now:
                return
            log.debug(
                "%s: a client of uid %d sent no whole request in %.1f s", self.name, item.peer.uid, self.deadline_s
            )
            self._drop(item)

    # -- the workers ------------------------------------------------------------------------
    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                with item.conn:
                    item.conn.setblocking(True)
                    request = None if item.oversize else bytes(item.data)
                    self.respond(item.conn, item.peer, request, item.deadline)
            except (OSError, ValueError) as e:  # TimeoutError is an OSError
                log.warning("%s client (uid %d): %s", self.name, item.peer.uid, e)
            except Exception:
                log.exception("%s: answering a client failed", self.name)
            finally:
                item.peer.close()
