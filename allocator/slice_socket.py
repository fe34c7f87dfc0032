"""The slice socket: a tiny versioned binary protocol (gpuslice_slice.h) for
the interposer.  The caller is identified by the pidfd its connection carries
(unix_socket, identity.peer_of), never by what it says nor by a bare pid; it
learns only about its own container's slice and gets that slice's files as
file descriptors (SCM_RIGHTS).  Any uid may connect, in any number: each
client has 2 s for its request, silent ones never hold up an attach, and a
uid's requests wait behind its own (unix_socket)."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

from gpuslice.allocator import identity
from gpuslice.allocator.slice_files import constant, ffi_and_lib
from gpuslice.allocator.slices import NoSlice, SliceFull, SliceManager
from gpuslice.allocator.unix_socket import Deadline, UnixSocketServer
from gpuslice.allocator.watcher import ProcessWatcher

log = logging.getLogger(__name__)


class SliceSocketServer(UnixSocketServer):
    name = "slice-socket"

    def __init__(self, path: Path, manager: SliceManager, watcher: ProcessWatcher) -> None:
        self.manager = manager
        self.watcher = watcher
        self.ffi, _ = ffi_and_lib()
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o755)
        self.request_size = self.ffi.sizeof("struct gpuslice_request")
        super().__init__(path, 0o666)  # any uid inside a container may ask about its own slice

    def complete(self, data: bytearray) -> bool:
        return len(data) >= self.request_size

    def _reply(self, conn: socket.socket, status: str, message: str = "", slot: int = 0, gpus: int = 0,
               fds: tuple[int, ...] = ()) -> None:  # fmt: skip
        rep = self.ffi.new("struct gpuslice_reply *")
        rep.magic = constant("GPUSLICE_REPLY_MAGIC")
        rep.version = constant("GPUSLICE_SLICE_VERSION")
        rep.status = constant(status)
        rep.proc_slot = slot
        rep.gpu_count = gpus
        rep.message = message.encode()[:239]
        data = bytes(self.ffi.buffer(rep))
        if fds:
            socket.send_fds(conn, [data], list(fds))
        else:
            conn.sendall(data)

    def respond(self, conn: socket.socket, peer: identity.Peer, request: bytes | None, deadline: Deadline) -> None:
        deadline.arm(conn)
        size = self.request_size
        raw = (request or b"")[:size]
        req = self.ffi.from_buffer("struct gpuslice_request *", bytearray(raw)) if len(raw) == size else None
        if req is None or req.magic != constant("GPUSLICE_REQUEST_MAGIC") or req.op != constant("GPUSLICE_OP_ATTACH"):
            return self._reply(conn, "GPUSLICE_BAD_REQUEST", "expected an ATTACH request (gpuslice_slice.h)")
        oldest, newest = constant("GPUSLICE_SLICE_OLDEST_VERSION"), constant("GPUSLICE_SLICE_VERSION")
        if not oldest <= req.version <= newest:
            return self._reply(
                conn,
                "GPUSLICE_BAD_REQUEST",
                f"protocol version {req.version} unsupported; this daemon speaks {oldest} to {newest}",
            )
        try:
            who = identity.of_pidfd(peer.pidfd)
        except identity.NoSuchProcess:
            return None  # it is gone: nobody to answer
        try:
            got = self.manager.attach(who)
        except NoSlice as e:
            return self._reply(conn, "GPUSLICE_NO_SLICE", str(e))
        except SliceFull as e:
            return self._reply(conn, "GPUSLICE_SLICE_FULL", str(e))
        if not self.watcher.watch_pidfd(peer.pidfd, who.pid, got.files, got.slot):
            return None  # it exited meanwhile: its slot is free again
        fds = got.files.open_fds()
        try:
            self._reply(conn, "GPUSLICE_OK", slot=got.slot, gpus=got.files.gpu_count(), fds=fds)
        finally:
            for fd in fds:
                os.close(fd)
