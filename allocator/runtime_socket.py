"""The runtime socket: the OCI hook's and the runtime shim's one round trip
to the daemon (docs/oci-integration.md).  Both are small C programs
(hook/gpuslice_hook.c, runtime_shim/gpuslice_runtime.c) so that a container
start does not pay for an interpreter and a gRPC stack in every hook call;
the work they ask for runs here, on the SliceManager, as a gRPC call would.

Root only, like the control socket beside it.  Request: the verb on a line,
`key=value` lines, an empty line, the payload to the end.  Reply: one line,
`ok`, `ok VALUE` or `error MESSAGE`."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path

from gpuslice.allocator import metrics
from gpuslice.allocator.placement import PlacementError
from gpuslice.allocator.service import _status_of
from gpuslice.allocator.slices import Conflict, Invalid, NotFound, SliceManager
from gpuslice.allocator.unix_socket import UnixSocketServer
from gpuslice.cdi.spec import SpecError
from gpuslice.hook import stages
from gpuslice.runtime_shim import prepare

from gpuslice.request import RequestError

log = logging.getLogger(__name__)

SOCKET_NAME = "runtime.sock"  # beside the control socket (gpuslice/csrc/runtime_call.h)
MAX_REQUEST = 4 << 20
TIMEOUT_S = 30.0
# errors whose line says it all, and ones said after the call's context
SAID_ALREADY = (stages.HookError, prepare.ShimError, RequestError, SpecError)
FROM_SLICES = (Invalid, PlacementError, NotFound, Conflict, OSError, ValueError, KeyError)


def path_beside(control_socket: Path) -> Path:
    return control_socket.parent / SOCKET_NAME


class Request:
    def __init__(self, data: bytes) -> None:
        head, sep, self.payload = data.partition(b"\n\n")
        if not sep:
            raise ValueError("a request is a verb, key=value lines, an empty line and a payload")
        lines = head.decode().split("\n")
        self.verb = lines[0]
        self.keys = dict(line.split("=", 1) for line in lines[1:] if "=" in line)
        self.context = self.verb  # what an error line starts with


class RuntimeSocketServer(UnixSocketServer):
    name = "runtime-socket"
    timeout_s = TIMEOUT_S
    threaded = True  # a slow Reserve must not hold up another container's hook

    def __init__(self, path: Path, manager: SliceManager) -> None:
        self.manager = manager
        self.verbs: dict[str, Callable[[Request], str]] = {
            "createRuntime": self._create_runtime,
            "poststop": self._poststop,
            "ldcache-root": self._ldcache_root,
            "create": self._create,
        }
        super().__init__(path, 0o600)  # root only, like the control socket

    def handle(self, conn: socket.socket) -> None:
        chunks, size = [], 0
        while chunk := conn.recv(65536):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_REQUEST:
                raise ValueError(f"request larger than {MAX_REQUEST} bytes")
        conn.sendall((self.answer(b"".join(chunks)) + "\n").encode())

    def answer(self, data: bytes) -> str:
        start, verb, code = time.perf_counter(), "?", "OK"
        req: Request | None = None
        try:
            req = Request(data)
            verb = req.verb
            handler = self.verbs.get(verb)
            if handler is None:
                req.context = "runtime socket"
                raise ValueError(f"unknown verb {verb!r}; accepted: {', '.join(self.verbs)}")
            value = handler(req)
            return f"ok {value}" if value else "ok"
        except SAID_ALREADY as e:
            code = _status_of(e).name
            return "error " + one_line(str(e))
        except FROM_SLICES as e:
            code = _status_of(e).name
            return f"error {req.context if req else 'runtime socket'}: " + one_line(str(e))
        except Exception as e:
            code = "INTERNAL"
            log.exception("runtime socket %s failed", verb)
            return f"error {verb}: internal error: {e}"
        finally:
            method = f"runtime.{verb if verb in self.verbs else 'unknown'}"  # labels from a known set only
            metrics.RPC_SECONDS.labels(method).observe(time.perf_counter() - start)
            metrics.RPCS.labels(method, code).inc()

    # -- verbs ------------------------------------------------------------------------
    def _create_runtime(self, req: Request) -> str:
        state = stages.parse_state(req.payload)
        req.context = f"createRuntime for container {state['id']}"
        stages.create_runtime(state, self.manager)
        return ""

    def _poststop(self, req: Request) -> str:
        state = stages.parse_state(req.payload)
        req.context = f"poststop for container {state['id']}"
        stages.poststop(state, self.manager)
        return ""

    def _ldcache_root(self, req: Request) -> str:
        return stages.container_root(stages.parse_state(req.payload))

    def _create(self, req: Request) -> str:
        cid, bundle = req.keys.get("id", ""), req.keys.get("bundle", "")
        if not cid or not bundle:
            raise ValueError("create needs id= and bundle=")
        req.context = f"create {cid}"
        prepare.prepare(Path(bundle), cid, self.manager, req.keys.get("spec", ""))
        return ""


def one_line(text: str) -> str:
    return " ".join(text.strip("'\"").split())
