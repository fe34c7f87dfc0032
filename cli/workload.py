"""A CUDA driver-API workload, run through NVIDIA's own client
(cuda.bindings.driver): allocate, copy and check bytes, launch kernels.
The demo runs it on the simulated GPU; it works the same on a real one."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass

import click

# PTX for one kernel; the simulator runs it for (waves x wave_time)
KERNEL_PTX = b"""
.version 8.0
.target sm_80
.address_size 64
.visible .entry spin(.param .u64 n)
{
    ret;
}
"""


class CudaFailure(RuntimeError):
    pass


def check(result):
    """Unpack a cuda.bindings result tuple, raising on an error code."""
    from cuda.bindings import driver as cu

    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        raise CudaFailure(name.decode() if isinstance(name, bytes) else str(err))
    return rest[0] if len(rest) == 1 else tuple(rest)


@dataclass
class Report:
    pid: int
    device: str
    total_bytes: int
    free_bytes_after_alloc: int
    allocated_bytes: int
    copy_ok: bool
    kernels: int
    seconds: float


def run(device: int, alloc_bytes: int, seconds: float, grid: int) -> Report:
    from cuda.bindings import driver as cu

    check(cu.cuInit(0))
    dev = check(cu.cuDeviceGet(device))
    name = check(cu.cuDeviceGetName(128, dev)).split(b"\0")[0].decode()
    ctx = check(cu.cuDevicePrimaryCtxRetain(dev))
    check(cu.cuCtxSetCurrent(ctx))
    ptr = check(cu.cuMemAlloc(alloc_bytes))
    free, total = check(cu.cuMemGetInfo())
    payload = os.urandom(min(alloc_bytes, 1 << 20))
    check(cu.cuMemcpyHtoD(ptr, payload, len(payload)))
    back = bytearray(len(payload))
    check(cu.cuMemcpyDtoH(back, ptr, len(payload)))
    module = check(cu.cuModuleLoadData(KERNEL_PTX))
    fn = check(cu.cuModuleGetFunction(module, b"spin"))
    stream = check(cu.cuStreamCreate(0))
    start = time.monotonic()
    kernels = 0
    while time.monotonic() - start < seconds:
        check(cu.cuLaunchKernel(fn, grid, 1, 1, 256, 1, 1, 0, stream, 0, 0))
        kernels += 1
        if kernels % 64 == 0:
            check(cu.cuStreamSynchronize(stream))
    check(cu.cuStreamSynchronize(stream))
    elapsed = time.monotonic() - start
    check(cu.cuMemFree(ptr))
    check(cu.cuStreamDestroy(stream))
    check(cu.cuModuleUnload(module))
    check(cu.cuDevicePrimaryCtxRelease(dev))
    return Report(os.getpid(), name, total, free, alloc_bytes, bytes(back) == payload, kernels, elapsed)


@click.command()
@click.option("--device", type=click.IntRange(0), default=0, show_default=True, help="GPU index")
@click.option("--alloc-mib", type=click.IntRange(1), default=512, show_default=True, help="device memory to allocate")
@click.option("--seconds", type=click.FloatRange(0.1, 600), default=2.0, show_default=True,
              help="how long to launch kernels")  # fmt: skip
@click.option("--grid", type=click.IntRange(1), default=864, show_default=True, help="blocks per kernel launch")
def main(device: int, alloc_mib: int, seconds: float, grid: int) -> None:
    """Run the workload and print its report as one JSON line."""
    try:
        report = run(device, alloc_mib << 20, seconds, grid)
    except CudaFailure as e:
        click.echo(f"workload: CUDA call failed: {e}", err=True)
        sys.exit(1)
    click.echo(json.dumps(asdict(report)))


if __name__ == "__main__":
    main()
