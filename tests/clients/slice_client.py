"""Stands in for the interposer on the slice socket: ATTACH, receive the
slice's ledger fds, charge some bytes against the limit, then wait.

Prints one JSON line: status, message, slot, the limit it read, whether the
charge fit (the harness adds its host pid: inside, it knows only its namespace's)."""

from __future__ import annotations

import json
import mmap
import socket
import struct
import sys
import time

from gpuslice.allocator.slice_files import constant, ffi_and_lib


def attach_request() -> bytes:
    """What the interposer sends first: ATTACH (gpuslice_slice.h)."""
    return struct.pack(
        "=IHH", constant("GPUSLICE_REQUEST_MAGIC"), constant("GPUSLICE_SLICE_VERSION"), constant("GPUSLICE_OP_ATTACH")
    )


def main() -> None:
    path, charge = sys.argv[1], int(sys.argv[2])
    ffi, lib = ffi_and_lib()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.sendall(attach_request())
    size = ffi.sizeof("struct gpuslice_reply")
    data, fds, _flags, _addr = socket.recv_fds(s, size, 2)
    reply = ffi.from_buffer("struct gpuslice_reply *", bytearray(data))
    out = {
        "status": int(reply.status),
        "message": ffi.string(reply.message).decode(),
        "slot": int(reply.proc_slot),
    }
    if reply.status == constant("GPUSLICE_OK"):
        limits_fd, usage_fd = fds
        lim_map = mmap.mmap(limits_fd, ffi.sizeof("struct gpuslice_limits"), prot=mmap.PROT_READ)
        use_map = mmap.mmap(usage_fd, ffi.sizeof("struct gpuslice_usage"))
        limits = ffi.cast("struct gpuslice_limits *", ffi.from_buffer(lim_map))
        usage = ffi.from_buffer("struct gpuslice_usage *", use_map)
        out["limit"] = int(limits.gpu[0].memory_limit)
        out["charged"] = lib.gpuslice_usage_charge(usage, limits, reply.proc_slot, 0, charge) == 0
        try:  # the limits file must be read-only for the slice's processes
            lim_rw = mmap.mmap(limits_fd, ffi.sizeof("struct gpuslice_limits"))
            out["limits_writable"] = True
            lim_rw.close()
        except (PermissionError, OSError):
            out["limits_writable"] = False
    print(json.dumps(out), flush=True)
    time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 0)


if __name__ == "__main__":
    main()
