"""What gpuslice's gRPC servers share: our error kinds as gRPC statuses, and
unix sockets that only root (the kubelet, the CLI as root) may connect to."""

from __future__ import annotations

import os
from pathlib import Path

import grpc

from gpuslice import errors


def status_of(e: BaseException) -> grpc.StatusCode:
    """The gRPC status of one of our error kinds (INTERNAL for anything else)."""
    return grpc.StatusCode[errors.code_of(e).name]


def listen_root_only(server: grpc.Server, socket: Path, own_dir: bool) -> None:
    """Serve on `socket`, 0600 whatever umask the process inherited: whoever
    reaches a plugin's socket can prepare, unprepare or allocate for any pod.
    `own_dir`: the socket's directory is ours and 0700 (the kubelet's
    registry and device-plugin directories are the kubelet's)."""
    if own_dir:
        socket.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(socket.parent, 0o700)  # made earlier, or under another umask
    else:
        socket.parent.mkdir(parents=True, exist_ok=True)
    socket.unlink(missing_ok=True)  # a socket left by a plugin that died
    old = os.umask(0o177)  # gRPC creates the socket here, at bind: never a moment with a wider mode
    try:
        server.add_insecure_port(f"unix://{socket}")
    finally:
        os.umask(old)
    os.chmod(socket, 0o600)
