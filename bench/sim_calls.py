"""Cost of simulated driver calls through cuda.bindings, each as a ratio to
a trivial driver call (cuCtxGetCurrent) timed in the same run."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable

import click

import gpuslice_sim as sim
from gpuslice.cli.workload import KERNEL_PTX, check


def _per_call_ns(fn: Callable[[], object], n: int) -> float:
    best = float("inf")
    for _ in range(5):  # best of 5 trims scheduler noise
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def main() -> None:
    os.environ.setdefault(sim.STATE_DIR_ENV, tempfile.mkdtemp(prefix="gpuslice-bench-"))
    sim.activate()
    import pynvml
    from cuda.bindings import driver as cu

    check(cu.cuInit(0))
    dev = check(cu.cuDeviceGet(0))
    check(cu.cuCtxSetCurrent(check(cu.cuDevicePrimaryCtxRetain(dev))))
    fn = check(cu.cuModuleGetFunction(check(cu.cuModuleLoadData(KERNEL_PTX)), b"spin"))
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    def alloc_free() -> None:
        check(cu.cuMemFree(check(cu.cuMemAlloc(1 << 20))))

    cases = {
        "cuCtxGetCurrent (baseline)": lambda: cu.cuCtxGetCurrent(),
        "cuMemAlloc+cuMemFree 1 MiB": alloc_free,
        "cuLaunchKernel (1 block)": lambda: cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0),
        "nvmlDeviceGetMemoryInfo": lambda: pynvml.nvmlDeviceGetMemoryInfo(handle),
    }
    results = {name: _per_call_ns(f, 2000) for name, f in cases.items()}
    check(cu.cuCtxSynchronize())
    base = results["cuCtxGetCurrent (baseline)"]
    for name, ns in results.items():
        click.echo(f"{name:<32} {ns:10.0f} ns/call   {ns / base:6.2f}x baseline")
