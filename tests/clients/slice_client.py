"""Stands in for the interposer on the slice socket: ATTACH, receive the
slice's ledger fds, charge some bytes against the limit, then wait. argv: the
socket, the bytes to charge, the seconds to wait, and the protocol version it
speaks (this one's unless given: an older one maps and charges as it did).

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


def attach_request(version: int | None = None) -> bytes:
    """What the interposer sends first: ATTACH (gpuslice_slice.h), in this version unless given."""
    version = constant("GPUSLICE_SLICE_VERSION") if version is None else version
    return struct.pack("=IHH", constant("GPUSLICE_REQUEST_MAGIC"), version, constant("GPUSLICE_OP_ATTACH"))


def charge_as_version_3(usage, limits, slot: int, nbytes: int) -> bool:  # type: ignore[no-untyped-def]
    """What a version 3 interposer's ledger did (one process here: no race to guard against):
    the slice's total and the process's row, nothing after the gates."""
    if usage.used[0] + nbytes > limits.gpu[0].memory_limit:
        return False
    usage.used[0] += nbytes
    usage.proc[slot].used[0] += nbytes
    return True


def main() -> None:
    path, charge = sys.argv[1], int(sys.argv[2])
    version = int(sys.argv[4]) if len(sys.argv) > 4 else constant("GPUSLICE_SLICE_VERSION")
    ffi, lib = ffi_and_lib()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.sendall(attach_request(version))
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
        old = version < constant("GPUSLICE_SLICE_VERSION")  # it knows the usage file up to the gates
        mapped = ffi.offsetof("struct gpuslice_usage", "charged") if old else ffi.sizeof("struct gpuslice_usage")
        use_map = mmap.mmap(usage_fd, mapped)
        limits = ffi.cast("struct gpuslice_limits *", ffi.from_buffer(lim_map))
        usage = ffi.cast("struct gpuslice_usage *", ffi.from_buffer(use_map))
        out["limit"] = int(limits.gpu[0].memory_limit)
        out["charged"] = (
            charge_as_version_3(usage, limits, reply.proc_slot, charge)
            if old
            else lib.gpuslice_usage_charge(usage, limits, reply.proc_slot, 0, charge) == 0
        )
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
