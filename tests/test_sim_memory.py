"""Memory on the simulated GPU, seen through cuda.bindings and pynvml."""

from __future__ import annotations

import time

import pytest

from tests.conftest import GiB, MiB, gpu

DEVICE_PATHS = ["mem", "pitch", "managed", "async", "pool", "vmm", "array", "array3d", "mipmap"]


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
    rss_kib = int(
        next(
            line.split()[1]
            for line in open(f"/proc/{a.pid}/status").read().splitlines()
            if line.startswith("VmRSS")
        )
    )
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
