"""Memory the simulated driver allocates for a process by itself, outside
any call an interposer sees, as the real driver does (shared/research/
real-driver-facts.md; sim/sim_cuda_driver_memory.c): a module's code and
constants when a kernel of it is first launched (lazy, the default since
CUDA 12.2) or at load (CUDA_MODULE_LOADING=EAGER), and local memory for
every resident thread, grown for a launch or a stack limit and kept. NVML's
per-process count and the device's free memory show all of it, through
NVIDIA's own clients."""

from __future__ import annotations

import json

import pytest

from tests.harness.machine import MiB, gpu

PTX = """.version 8.0
.target sm_90
.address_size 64
.visible .entry small()
{
 ret;
}
.visible .entry deep()
{
 .local .align 8 .b8 frame[4096];
 ret;
}
"""

SCRIPT = r"""
import json, os, pynvml
from cuda.bindings import driver as cu
PTX = %r
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
def used():
    return {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}.get(os.getpid(), 0)
def free():
    return int(cu.cuMemGetInfo()[1])
def after(result):
    return [used(), free(), getattr(result, "name", str(result))]
def launch(fn):
    err, = cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0)
    return cu.cuCtxSynchronize()[0] if not err else err
assert not cu.cuInit(0)[0]
_, dev = cu.cuDeviceGet(0)
_, ctx = cu.cuDevicePrimaryCtxRetain(dev)
cu.cuCtxSetCurrent(ctx)
out = {"context": [used(), free()]}
err, mod = cu.cuModuleLoadData(PTX.encode() + b"\0")
out["loaded"] = after(err)
_, small = cu.cuModuleGetFunction(mod, b"small")
_, deep = cu.cuModuleGetFunction(mod, b"deep")
out["small"] = after(launch(small))
out["again"] = after(launch(small))
out["deep"] = after(launch(deep))
out["stack_8k"] = after(cu.cuCtxSetLimit(cu.CUlimit.CU_LIMIT_STACK_SIZE, 8192)[0])
out["stack_2k"] = after(cu.cuCtxSetLimit(cu.CUlimit.CU_LIMIT_STACK_SIZE, 2048)[0])
out["too_deep"] = after(cu.cuCtxSetLimit(cu.CUlimit.CU_LIMIT_STACK_SIZE, 1 << 20)[0])
out["unloaded"] = after(cu.cuModuleUnload(mod)[0])
cu.cuDevicePrimaryCtxRelease(dev)
out["released"] = [used()]
print(json.dumps(out))
"""

SMS, THREADS = 4, 2048  # resident threads per SM: CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR
TOTAL, CONTEXT, MODULE = 4096 * MiB, 300 * MiB, 6 * MiB


def run(make_machine, **env) -> dict:
    m = make_machine([gpu("4Gi", context_memory="300Mi", module_memory="6Mi", local_memory="true", sms=SMS)])
    r = m.python(SCRIPT % PTX) if not env else _with_env(m, env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _with_env(m, env):  # type: ignore[no-untyped-def]
    m.env = {**m.env, **env}
    return m.python(SCRIPT % PTX)


def test_a_module_is_charged_at_its_first_launch_and_local_memory_grows_and_is_kept(make_machine):
    out = run(make_machine)
    ctx = CONTEXT
    assert out["context"] == [ctx, TOTAL - ctx]
    assert out["loaded"][:2] == [ctx, TOTAL - ctx]  # lazy: nothing at load
    assert out["small"] == [ctx + MODULE, TOTAL - ctx - MODULE, "CUDA_SUCCESS"]  # its first launch
    assert out["again"][:2] == out["small"][:2]  # once per module
    grown = (4096 - 1024) * SMS * THREADS  # the kernel's frame, beyond the default stack, for every resident thread
    assert out["deep"][:2] == [ctx + MODULE + grown, TOTAL - ctx - MODULE - grown]
    stack = (8192 - 4096) * SMS * THREADS
    assert out["stack_8k"][:2] == [ctx + MODULE + grown + stack, TOTAL - ctx - MODULE - grown - stack]
    assert out["stack_2k"][:2] == out["stack_8k"][:2]  # kept, never shrunk
    assert out["too_deep"] == [*out["stack_8k"][:2], "CUDA_ERROR_OUT_OF_MEMORY"]  # 8 GiB: does not fit
    assert out["unloaded"][:2] == [ctx + grown + stack, TOTAL - ctx - grown - stack]  # the module's goes with it
    assert out["released"] == [0]  # the context's local memory with the context


def test_eager_loading_charges_the_module_at_load(make_machine):
    out = run(make_machine, CUDA_MODULE_LOADING="EAGER")
    assert out["loaded"][:2] == [CONTEXT + MODULE, TOTAL - CONTEXT - MODULE]
    assert out["small"][:2] == out["loaded"][:2]


@pytest.mark.parametrize(("key", "value", "said"), [
    ("module_memory", "lots", "gpus[0].module_memory: must be a size such as 2Mi or 0"),
    ("local_memory", "yes", "gpus[0].local_memory: must be true or false"),
])  # fmt: skip
def test_a_bad_value_is_one_line(make_machine, tmp_path, key, value, said):
    import subprocess
    import sys

    cfg = tmp_path / "sim.yaml"
    cfg.write_text(f"gpus:\n  - {{memory: 4Gi, {key}: {value}}}\n")
    r = subprocess.run([sys.executable, "-m", "gpuslice.cli", "sim", "check", str(cfg)], capture_output=True, text=True)
    assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
