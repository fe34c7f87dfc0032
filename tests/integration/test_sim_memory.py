"""Memory on the simulated GPU, seen through cuda.bindings and pynvml."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.harness.machine import DEVICE_PATHS, GiB, MiB, gpu


def test_two_processes_are_accounted_to_the_byte_and_sigkill_frees(make_machine, agents):
    m = make_machine([gpu("16Gi")])
    a, b = agents(m), agents(m)
    assert a.call("alloc", path="mem", size=3 * GiB + 12345)["error"] == "CUDA_SUCCESS"
    assert b.call("alloc", path="mem", size=1 * GiB + 777)["error"] == "CUDA_SUCCESS"
    used = 4 * GiB + 12345 + 777
    for agent in (a, b):
        info = agent.call("meminfo")
        assert info["total"] == 16 * GiB
        assert info["free"] == 16 * GiB - used
    nv = b.call("nvml")
    assert nv["total"] == 16 * GiB and nv["used"] == used and nv["free"] == 16 * GiB - used
    assert nv["v2"] == [16 * GiB, used, 16 * GiB - used]
    assert nv["procs"] == {str(a.pid): 3 * GiB + 12345, str(b.pid): 1 * GiB + 777}

    a.kill()
    nv = b.call("nvml")
    assert nv["used"] == 1 * GiB + 777
    assert nv["procs"] == {str(b.pid): 1 * GiB + 777}
    assert b.call("meminfo")["free"] == 15 * GiB - 777


@pytest.mark.parametrize("path", DEVICE_PATHS)
def test_every_allocation_path_stops_at_capacity(make_machine, agents, path):
    cap = 256 * MiB
    m = make_machine([gpu("256Mi")])
    a = agents(m)
    full = a.call("alloc", path=path, size=cap)
    assert full["error"] == "CUDA_SUCCESS"
    assert a.call("meminfo")["free"] == 0
    # anything more, by this path, is refused
    assert a.call("alloc", path=path, size=2 * MiB)["error"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert a.call("alloc", path="mem", size=1)["error"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert a.call("free", id=full["id"])["error"] == "CUDA_SUCCESS"
    assert a.call("meminfo")["free"] == cap


def test_oom_counts_every_process(make_machine, agents):
    m = make_machine([gpu("1Gi")])
    a, b = agents(m), agents(m)
    assert a.call("alloc", path="mem", size=768 * MiB)["error"] == "CUDA_SUCCESS"
    assert b.call("alloc", path="vmm", size=512 * MiB)["error"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert b.call("alloc", path="vmm", size=256 * MiB)["error"] == "CUDA_SUCCESS"


def test_pinned_host_memory_is_not_device_memory(make_machine, agents):
    m = make_machine([gpu("1Gi")])
    a = agents(m)
    assert a.call("alloc", path="host", size=2 * GiB)["error"] == "CUDA_SUCCESS"
    assert a.call("meminfo")["free"] == GiB


def test_memcpy_round_trip_64mib(make_machine, agents):
    a = agents(make_machine())
    r = a.call("roundtrip", size=64 * MiB)
    assert r == {"error": "CUDA_SUCCESS", "same": True}


def test_large_gpu_costs_no_host_memory_until_touched(make_machine, agents):
    a = agents(make_machine([gpu("80Gi")]))
    assert a.call("alloc", path="mem", size=79 * GiB)["error"] == "CUDA_SUCCESS"
    status = Path(f"/proc/{a.pid}/status").read_text().splitlines()
    rss_kib = int(next(line.split()[1] for line in status if line.startswith("VmRSS")))
    assert rss_kib < 1024 * 1024  # far below the 79 GiB it holds


def test_context_memory_is_charged_per_context(make_machine, agents):
    m = make_machine([gpu("4Gi", context_memory="300Mi")])
    a = agents(m)
    assert a.call("meminfo")["free"] == 4 * GiB - 300 * MiB
    nv = a.call("nvml")
    assert nv["procs"] == {str(a.pid): 300 * MiB}
    a.kill()
    deadline = time.monotonic() + 5
    other = agents(m, init=False)
    while other.call("nvml")["used"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert other.call("nvml")["used"] == 0


FORK = r"""
import os, pynvml
from cuda.bindings import driver as cu
cu.cuInit(0)
_, dev = cu.cuDeviceGet(0)
_, ctx = cu.cuDevicePrimaryCtxRetain(dev)
cu.cuCtxSetCurrent(ctx)
err, p = cu.cuMemAlloc(1 << 30)
assert not err
pid = os.fork()
if pid == 0:
    # CUDA state does not cross fork: the child starts over with its own slot
    assert cu.cuMemAlloc(1)[0] == cu.CUresult.CUDA_ERROR_NOT_INITIALIZED
    cu.cuInit(0)
    _, ctx = cu.cuDevicePrimaryCtxRetain(dev)
    cu.cuCtxSetCurrent(ctx)
    assert not cu.cuMemAlloc(512 << 20)[0]
    os._exit(0)  # no cleanup, like a crash
os.waitpid(pid, 0)
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
import json
procs = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
print(json.dumps({"used": pynvml.nvmlDeviceGetMemoryInfo(h).used, "pids": procs, "me": os.getpid()}))
"""


def test_fork_child_is_its_own_process_and_its_exit_frees_only_its_memory(make_machine):
    r = make_machine().python(FORK)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["used"] == 1 << 30
    assert out["pids"] == [out["me"]]


def test_a_pools_reuse_attributes_can_be_turned_off_and_on(make_machine, agents):
    seen = agents(make_machine()).call("pool_reuse")
    assert len(seen) == 3 and all(values == [1, 0, 1] for values in seen.values()), seen  # on by default, as documented


def test_every_pointer_attribute_answers_as_cuda_h_documents(make_machine, agents):
    a = agents(make_machine())
    plain, pooled = (
        a.call("pointer_attributes", path="mem", size=MiB),
        a.call("pointer_attributes", path="pool", size=MiB),
    )
    for attrs in (plain, pooled):
        assert attrs["CU_POINTER_ATTRIBUTE_RANGE_SIZE"] == attrs["CU_POINTER_ATTRIBUTE_MAPPING_SIZE"] == MiB
        assert attrs["CU_POINTER_ATTRIBUTE_RANGE_START_ADDR"] == attrs["CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR"]
        assert attrs["CU_POINTER_ATTRIBUTE_ACCESS_FLAGS"] == 3 and attrs["CU_POINTER_ATTRIBUTE_MAPPED"] == 1
        assert attrs["CU_POINTER_ATTRIBUTE_LOCALITY_DOMAIN_ORDINAL"] == -1
        # device memory has no host address; P2P tokens are deprecated: the only refusals
        assert {k for k, v in attrs.items() if isinstance(v, str)} == {
            "CU_POINTER_ATTRIBUTE_HOST_POINTER",
            "CU_POINTER_ATTRIBUTE_P2P_TOKENS",
        }
    assert (
        plain["CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE"] == 1
        and plain["CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE"] == 0
    )
    assert (
        pooled["CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE"] == 0
        and pooled["CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE"] != 0
    )
    assert plain["CU_POINTER_ATTRIBUTE_BUFFER_ID"] != pooled["CU_POINTER_ATTRIBUTE_BUFFER_ID"]


def test_vmm_handles_shared_as_file_descriptors(make_machine, agents, tmp_path):
    """A handle created exportable is exported as a file descriptor; imported
    back by its own process it is the same handle with one more reference (the
    memory stays until both are released); another process's import is a
    handle of its own, charged to it while held."""
    m = make_machine([gpu("4Gi")])
    owner, other = agents(m), agents(m)
    size = 512 * MiB
    got = owner.call("vmm_share", size=size)
    assert (got["create"], got["export"], got["import"]) == ("CUDA_SUCCESS",) * 3 and got["same_handle"]
    assert got["after_one_release"] == got["start"] - size  # the import's reference holds it
    assert got["after_both"] == got["start"]
    assert got["export_unrequested"] == "CUDA_ERROR_INVALID_VALUE"  # not created exportable
    other.call("fd_inbox", path=str(tmp_path / "inbox"))
    exported = owner.call("vmm_export", size=size, send_to=str(tmp_path / "inbox"))
    assert exported["error"] == "CUDA_SUCCESS"
    imported = other.call("vmm_import")
    assert imported["error"] == "CUDA_SUCCESS"
    assert imported["free_while_held"] == 4 * GiB - size and imported["free_after"] == 4 * GiB
