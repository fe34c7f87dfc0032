"""A client for the daemon's gpuslice.v1 API on its unix socket."""

from __future__ import annotations

import os
from pathlib import Path

import grpc

from gpuslice import constants
from gpuslice.proto import gpuslice_pb2 as pb
from gpuslice.proto import gpuslice_pb2_grpc as pb_grpc

SOCKET_ENV = constants.ENV_SOCKET
DEFAULT_SOCKET = constants.CONTROL_SOCKET


def socket_path(explicit: str | Path | None = None) -> str:
    return str(explicit or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET)


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
        return self.stub.Inventory(pb.InventoryRequest(), timeout=self.timeout)

    def reserve(self, container_id: str, annotations: dict[str, str], owner: str = "") -> pb.Slice:
        req = pb.ReserveRequest(container_id=container_id, annotations=annotations, owner=owner)
        return self.stub.Reserve(req, timeout=self.timeout)

    def bind(self, container_id: str, pid: int) -> pb.Slice:
        return self.stub.Bind(pb.BindRequest(container_id=container_id, pid=pid), timeout=self.timeout)

    def release(self, container_id: str) -> bool:
        return self.stub.Release(pb.ReleaseRequest(container_id=container_id), timeout=self.timeout).released

    def get(self, container_id: str) -> pb.Slice:
        return self.stub.Get(pb.GetRequest(container_id=container_id), timeout=self.timeout)

    def list(self) -> list[pb.Slice]:
        return list(self.stub.List(pb.ListRequest(), timeout=self.timeout).slices)

    def resize(self, container_id: str, annotations: dict[str, str]) -> pb.Slice:
        req = pb.ResizeRequest(container_id=container_id, annotations=annotations)
        return self.stub.Resize(req, timeout=self.timeout)
