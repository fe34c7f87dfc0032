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

from gpuslice import constants, errors, request
from gpuslice.allocator import container_start, identity, metrics, oci
from gpuslice.allocator.slices import SliceManager
from gpuslice.allocator.unix_socket import Deadline, UnixSocketServer
from gpuslice.cdi.spec import SpecError

log = logging.getLogger(__name__)

MAX_REQUEST = constants.RUNTIME_REQUEST_MAX
# errors whose line names the container or annotation itself; the others are said after the call's context
SAID_ALREADY = (request.RequestError, oci.OciError, SpecError)


class Request:
    def __init__(self, data: bytes) -> None:
        head, sep, self.payload = data.partition(b"\n\n")
        if not sep:
            raise errors.InvalidArgument("a request is a verb, key=value lines, an empty line and a payload")
        try:
            lines = head.decode().split("\n")
        except UnicodeDecodeError as e:
            raise errors.InvalidArgument(f"a request's head is not UTF-8: {e}") from e
        self.verb = lines[0]
        self.keys = dict(line.split("=", 1) for line in lines[1:] if "=" in line)
        self.context = self.verb  # what an error line starts with


class RuntimeSocketServer(UnixSocketServer):
    name = "runtime-socket"
    max_request = MAX_REQUEST
    # root's hooks and shims, one per container start: a burst queues, never a reset
    max_pending = per_uid_queue = 4096

    def __init__(self, path: Path, manager: SliceManager, host: container_start.Host, deadline_s: float) -> None:
        # the config's runtime_request_timeout, for the whole request: a client sending a byte now and
        # then is cut off
        self.deadline_s = deadline_s
        self.manager = manager
        self.host = host
        self.verbs: dict[str, Callable[[Request], str]] = {
            "createRuntime": self._create_runtime,
            "poststop": self._poststop,
            "ldcache-root": self._ldcache_root,
            "create": self._create,
        }
        super().__init__(path, 0o600)  # root only, like the control socket

    def respond(self, conn: socket.socket, peer: identity.Peer, request: bytes | None, deadline: Deadline) -> None:
        if request is None:
            metrics.RPCS.labels("runtime.unknown", errors.Code.INVALID_ARGUMENT.name).inc()
            reply = f"error runtime socket: a request is at most {MAX_REQUEST} bytes"
        else:
            reply = self.answer(request)
        deadline.arm(conn)
        conn.sendall((reply + "\n").encode())

    def answer(self, data: bytes) -> str:
        start, verb, code = time.perf_counter(), "?", "OK"
        req: Request | None = None
        try:
            req = Request(data)
            verb = req.verb
            handler = self.verbs.get(verb)
            if handler is None:
                req.context = "runtime socket"
                raise errors.InvalidArgument(f"unknown verb {verb!r}; accepted: {', '.join(self.verbs)}")
            value = handler(req)
            return f"ok {value}" if value else "ok"
        except SAID_ALREADY as e:
            code = errors.code_of(e).name
            return "error " + errors.one_line(str(e))
        except errors.GpusliceError as e:
            code = errors.code_of(e).name
            return f"error {req.context if req else 'runtime socket'}: " + errors.one_line(str(e))
        except Exception as e:
            code = errors.Code.INTERNAL.name
            log.exception("runtime socket %s failed", verb)
            return f"error {verb}: internal error: {errors.one_line(str(e))}"
        finally:
            method = f"runtime.{verb if verb in self.verbs else 'unknown'}"  # labels from a known set only
            metrics.RPC_SECONDS.labels(method).observe(time.perf_counter() - start)
            metrics.RPCS.labels(method, code).inc()

    # -- verbs ------------------------------------------------------------------------
    def _create_runtime(self, req: Request) -> str:
        state = oci.parse_state(req.payload)
        req.context = f"createRuntime for container {state.id}"
        container_start.create_runtime(state, self.manager, self.host)
        return ""

    def _poststop(self, req: Request) -> str:
        state = oci.parse_state(req.payload)
        req.context = f"poststop for container {state.id}"
        container_start.poststop(state, self.manager)
        return ""

    def _ldcache_root(self, req: Request) -> str:
        return container_start.container_root(oci.parse_state(req.payload), self.host)

    def _create(self, req: Request) -> str:
        cid, bundle = req.keys.get("id", ""), req.keys.get("bundle", "")
        if not cid or not bundle:
            raise errors.InvalidArgument("create needs id= and bundle=")
        req.context = f"create {cid}"
        container_start.prepare(Path(bundle), cid, self.manager, self.host, req.keys.get("spec", ""))
        return ""
