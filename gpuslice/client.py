"""A client for the daemon's gpuslice.v1 API on its unix socket. The daemon's
answers come back as gpuslice's error kinds (errors.py), so a RESOURCE_EXHAUSTED
stays that kind through whoever calls; each is a grpc.RpcError too."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NoReturn, TypeVar

import grpc

from gpuslice import constants, errors
from gpuslice.proto import gpuslice_pb2 as pb
from gpuslice.proto import gpuslice_pb2_grpc as pb_grpc

SOCKET_ENV = constants.ENV_SOCKET
DEFAULT_SOCKET = constants.CONTROL_SOCKET
T = TypeVar("T")
SETTLED_S = 0.3  # compute_settled: seen settled twice this far apart (the controller ticks every 0.05 s)


def socket_path(explicit: str | Path | None = None) -> str:
    return str(explicit or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET)


class DaemonError(grpc.RpcError):
    """What the daemon answered (or that it could not be reached), with the
    gRPC status and details a grpc.RpcError has."""

    def __init__(self, status: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._status, self._details = status, details

    def code(self) -> grpc.StatusCode:
        return self._status

    def details(self) -> str:
        return self._details


# each kind once, as a DaemonError too: except errors.ResourceExhausted and except grpc.RpcError both catch it
_REMOTE: dict[type[errors.GpusliceError], type[DaemonError]] = {
    kind: type(f"Daemon{kind.__name__}", (DaemonError, kind), {})
    for kind in (*errors.KINDS.values(), errors.GpusliceError)
}


def _unavailable(status: grpc.StatusCode) -> bool:
    return status in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def raise_kind(e: grpc.RpcError) -> NoReturn:
    """The daemon's gRPC status as gpuslice's error kind (INTERNAL, UNKNOWN and
    the like: GpusliceError itself)."""
    status: grpc.StatusCode = e.code()
    details: str = e.details() or status.name
    code = errors.Code.UNAVAILABLE if _unavailable(status) else errors.Code.__members__.get(status.name)
    kind = errors.KINDS.get(code, errors.GpusliceError) if code else errors.GpusliceError
    raise _REMOTE[kind](status, details) from e


def _call(fn: Callable[..., T], request: object, timeout: float) -> T:
    try:
        return fn(request, timeout=timeout)
    except grpc.RpcError as e:
        raise_kind(e)


class AllocatorClient:
    def __init__(self, socket: str | Path | None = None, timeout: float = 10.0) -> None:
        self.channel = grpc.insecure_channel(f"unix:{socket_path(socket)}")
        self.stub = pb_grpc.AllocatorStub(self.channel)
        self.timeout = timeout

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> AllocatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def inventory(self) -> pb.InventoryReply:
        return _call(self.stub.Inventory, pb.InventoryRequest(), self.timeout)

    def reserve(
        self, container_id: str, annotations: dict[str, str], owner: str = "", workload: pb.Workload | None = None
    ) -> pb.Slice:
        req = pb.ReserveRequest(container_id=container_id, annotations=annotations, owner=owner, workload=workload)
        return _call(self.stub.Reserve, req, self.timeout)

    def reserve_claim(
        self, uid: str, shares: Iterable[pb.Share], owner: str = "", workload: pb.Workload | None = None
    ) -> pb.Slice:
        req = pb.ReserveClaimRequest(uid=uid, shares=list(shares), owner=owner, workload=workload)
        return _call(self.stub.ReserveClaim, req, self.timeout)

    def reserve_devices(self, key: str, resource: str, gpu_uuid: str, memory: int = 0, cores: int = 0,
                        owner: str = "", workload: pb.Workload | None = None) -> pb.Slice:  # fmt: skip
        req = pb.ReserveDevicesRequest(
            key=key, resource=resource, gpu_uuid=gpu_uuid, memory=memory, cores=cores, owner=owner, workload=workload
        )
        return _call(self.stub.ReserveDevices, req, self.timeout)

    def bind(self, container_id: str, pid: int) -> pb.Slice:
        return _call(self.stub.Bind, pb.BindRequest(container_id=container_id, pid=pid), self.timeout)

    def release(self, container_id: str) -> bool:
        return _call(self.stub.Release, pb.ReleaseRequest(container_id=container_id), self.timeout).released

    def get(self, container_id: str) -> pb.Slice:
        return _call(self.stub.Get, pb.GetRequest(container_id=container_id), self.timeout)

    def list(self) -> list[pb.Slice]:
        return list(_call(self.stub.List, pb.ListRequest(), self.timeout).slices)

    def resize(self, container_id: str, annotations: dict[str, str]) -> pb.Slice:
        req = pb.ResizeRequest(container_id=container_id, annotations=annotations)
        return _call(self.stub.Resize, req, self.timeout)

    def compute_settled(self, containers: Iterable[str] | None, timeout: float, at_least: int = 1,
                        stop: threading.Event | None = None) -> int | None:  # fmt: skip
        """When (time.monotonic_ns) the compute controller had these containers' slices (None:
        every slice, at least `at_least` GPUs of them) in use with their costs known: not
        `compute_fitting` (where the driver gives each sample period to one process, the
        daemon first fits the costs of slices that share a GPU, docs/compute.md), seen twice
        SETTLED_S apart; None if not within `timeout` seconds, or once `stop` is set."""
        names = None if containers is None else set(containers)
        deadline = time.monotonic_ns() + int(timeout * 1e9)
        first = None
        while (now := time.monotonic_ns()) < deadline:
            held = {s.container_id: s for s in self.list()}
            # a member of a ledger (a pod's containers under one allocation or claim) is controlled as the ledger
            asked = [s for n, s in held.items() if (n in names if names is not None else not s.member_of)]
            mine = [held.get(s.member_of, s) if s.member_of else s for s in asked]
            gpus = [g for s in mine for g in s.gpus]
            done = len(gpus) >= max(at_least, len(names or ())) and all(
                g.compute_used > 0 and not g.compute_fitting for g in gpus)  # fmt: skip
            first = (first or now) if done else None
            if first is not None and now - first >= SETTLED_S * 1e9:
                return first
            if stop is None:
                time.sleep(0.05)
            elif stop.wait(0.05):
                return None
        return None
