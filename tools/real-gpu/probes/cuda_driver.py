"""The driver API through NVIDIA's own Python client (cuda.bindings), so it
runs on the simulator as on a GPU. argv:
  LIMIT mem|vmm          the memory scenario on cuMemAlloc or cuMemCreate (VMM)
  context                a bare context and 2 MiB, held (the kit reads what the driver counts)
  hold SIZE              SIZE allocated and held until killed"""

from __future__ import annotations

import os
import sys
import time

from common import CHUNK, Memory, MiB, hold, main, memory_run
from cuda.bindings import driver as cu


class CudaError(RuntimeError):
    pass


def ok(ret: tuple) -> object:
    err, *rest = ret if isinstance(ret, tuple) else (ret,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise CudaError(cu.cuGetErrorName(err)[1].decode())
    return rest[0] if len(rest) == 1 else rest


def context() -> None:
    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(0))
    ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(dev))))


class Driver(Memory):
    def __init__(self, path: str) -> None:
        if path not in ("mem", "vmm"):
            raise ValueError(f"path {path!r}: mem or vmm")
        self.path = path
        self.held: list[tuple] = []

    def warm(self) -> None:
        context()

    def info(self) -> dict:
        free, total = ok(cu.cuMemGetInfo())
        return {"free": int(free), "total": int(total)}

    def alloc(self) -> object:
        if self.path == "mem":
            ptr = ok(cu.cuMemAlloc(CHUNK))
            self.held.append(("mem", ptr))
            return ptr
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = 0
        handle = ok(cu.cuMemCreate(CHUNK, prop, 0))
        va = ok(cu.cuMemAddressReserve(CHUNK, 0, 0, 0))
        ok(cu.cuMemMap(va, CHUNK, 0, handle, 0))
        access = cu.CUmemAccessDesc()
        access.location = prop.location
        access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        ok(cu.cuMemSetAccess(va, CHUNK, [access], 1))
        self.held.append(("vmm", (handle, va)))
        return handle

    def is_oom(self, e: BaseException) -> bool:
        return isinstance(e, CudaError) and str(e) == "CUDA_ERROR_OUT_OF_MEMORY"

    def release(self) -> None:
        for kind, obj in self.held:
            if kind == "mem":
                ok(cu.cuMemFree(obj))
            else:
                handle, va = obj
                ok(cu.cuMemUnmap(va, CHUNK))
                ok(cu.cuMemRelease(handle))
                ok(cu.cuMemAddressFree(va, CHUNK))
        self.held.clear()


def run(argv: list[str]) -> dict:
    what = argv[0] if argv else ""
    if what.isdigit():
        return memory_run(Driver(argv[1]), int(what))
    if what == "context":
        context()
        ok(cu.cuMemAlloc(2 * MiB))
        hold("warm", pid=os.getpid())
        return {"allocated": 2 * MiB}
    if what == "hold":
        context()
        size = int(argv[1])
        ok(cu.cuMemAlloc(size))
        hold("held", allocated=size, pid=os.getpid())
        while True:  # until the kit kills it: what the driver and the daemon do then is the check
            time.sleep(1)
    print(f"cuda_driver.py: unknown scenario {what!r} (LIMIT, context, hold)", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main(run)
