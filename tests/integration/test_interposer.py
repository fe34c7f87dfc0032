"""The interposer in front of the simulator, the daemon holding the slice,
driven through cuda.bindings and pynvml from processes in a container's pid
namespace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

import gpuslice_sim
from tests.harness import CLIENTS, REPO
from tests.harness.interposer import Slice, wrapped_env
from tests.harness.machine import DEVICE_PATHS, Agent, GiB, MiB, needs_root

pytestmark = needs_root
STRESS = CLIENTS / "stress.py"
ROOT = REPO


@pytest.fixture
def one_gib(daemon, containers):
    return Slice(daemon, containers, "1Gi")


def test_slice_view_and_every_path_stops_at_the_limit(one_gib, started):
    a = one_gib.agent(started)
    assert a.call("meminfo") == {"error": "CUDA_SUCCESS", "free": GiB, "total": GiB}
    nv = a.call("nvml")
    assert nv["total"] == GiB and nv["free"] == GiB and nv["v2"] == [GiB, 0, GiB]
    for path in DEVICE_PATHS:
        full = a.call("alloc", path=path, size=GiB)
        assert full["error"] == "CUDA_SUCCESS", path
        assert a.call("meminfo")["free"] == 0, path
        assert one_gib.used() == GiB, path
        assert a.call("alloc", path=path, size=2 * MiB)["error"] == "CUDA_ERROR_OUT_OF_MEMORY", path
        assert a.call("alloc", path="mem", size=1)["error"] == "CUDA_ERROR_OUT_OF_MEMORY", path
        assert a.call("free", id=full["id"])["error"] == "CUDA_SUCCESS", path
        assert a.call("meminfo")["free"] == GiB, path
        assert one_gib.used() == 0, path
    # the GPU itself had room: the slice, not the GPU, said no
    assert a.call("alloc", path="host", size=2 * GiB)["error"] == "CUDA_SUCCESS"


def run_stress(s: Slice, procs: int, iterations: int, max_hold: int, max_size: int) -> tuple[list[dict], int]:
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], s.used())

    watcher = threading.Thread(target=sample)
    watcher.start()
    runs = [
        subprocess.Popen(
            s.box.command([sys.executable, str(STRESS), str(iterations), str(max_hold), str(max_size), str(seed)]),
            env=s.env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed in range(procs)
    ]
    results = []
    for r in runs:
        out, _ = r.communicate(timeout=600)
        assert r.returncode == 0
        results.append(json.loads(out))
    done.set()
    watcher.join()
    return results, peak[0]


def test_eight_processes_fit_exactly_and_end_at_zero(one_gib):
    # 8 processes x 4 held x at most 32 MiB never need more than the 1 GiB slice
    results, peak = run_stress(one_gib, 8, 2000, 4, 32 * MiB)
    assert sum(r["allocs"] for r in results) > 8 * 1000
    assert all(r["refused"] == 0 for r in results), results
    assert 0 < peak <= GiB
    assert one_gib.used() == 0


def test_eight_oversubscribing_processes_never_pass_the_limit(daemon, containers):
    s = Slice(daemon, containers, "256Mi")
    # one process alone may want 6 x 128 MiB: refusals are certain, concurrency or not
    results, peak = run_stress(s, 8, 2000, 6, 128 * MiB)
    assert sum(r["refused"] for r in results) > 0  # the limit was really pressed
    assert peak <= 256 * MiB
    assert s.used() == 0


def test_sigkill_returns_exactly_the_dead_process_share(one_gib, started):
    a, b = one_gib.agent(started), one_gib.agent(started)
    assert a.call("alloc", path="mem", size=300 * MiB)["error"] == "CUDA_SUCCESS"
    assert b.call("alloc", path="vmm", size=200 * MiB)["error"] == "CUDA_SUCCESS"
    assert one_gib.used() == 500 * MiB
    a.kill()
    deadline = time.monotonic() + 1.0
    while one_gib.used() != 200 * MiB and time.monotonic() < deadline:
        time.sleep(0.01)
    assert one_gib.used() == 200 * MiB
    assert b.call("meminfo")["free"] == GiB - 200 * MiB


def test_contexts_cost_their_reserve_and_their_end_frees_their_memory(daemon, containers, started):
    s = Slice(daemon, containers, "1Gi", context_reserve="100Mi")
    a = s.agent(started)  # its primary context
    assert s.used() == 100 * MiB
    assert a.call("meminfo")["free"] == GiB - 100 * MiB
    free = a.call("ctx_cycle", size=50 * MiB)["free"]
    assert free == [GiB - 100 * MiB, GiB - 200 * MiB, GiB - 250 * MiB, GiB - 100 * MiB]
    assert a.call("alloc", path="mem", size=300 * MiB)["error"] == "CUDA_SUCCESS"
    assert s.used() == 400 * MiB
    assert a.call("reset_primary")["error"] == "CUDA_SUCCESS"
    assert s.used() == 0  # the reset freed the context and what it held


def test_nvml_lists_only_this_containers_processes(one_gib, started):
    a, b = one_gib.agent(started), one_gib.agent(started)
    a_pid, b_pid = a.call("init")["pid"], b.call("init")["pid"]
    a.call("alloc", path="mem", size=64 * MiB)
    b.call("alloc", path="mem", size=32 * MiB)
    outsider = Agent({**one_gib.env, "GPUSLICE_ALLOW_UNSLICED": "1"})
    started.append(outsider)
    outsider.call("init")
    outsider.call("alloc", path="mem", size=128 * MiB)
    got = a.call("nvml")
    ours = {str(a_pid): 64 * MiB, str(b_pid): 32 * MiB}
    assert got["procs"] == got["details"]["compute"] == got["details"]["all"] == ours  # every way of listing them
    assert got["details"]["graphics"] == got["details"]["mps"] == {} and got["graphics"] == got["mps"] == []
    seen = outsider.call("nvml")
    assert str(outsider.pid) in seen["procs"] and str(outsider.pid) in seen["details"]["all"]  # the driver sees it


def tenant_and_outsider(one_gib, started) -> tuple[Agent, int, Agent]:
    """A process of the slice holding 64 MiB (its pid as the container names it), and one
    outside any slice with a context."""
    a = one_gib.agent(started)
    a_pid = a.call("init")["pid"]
    a.call("alloc", path="mem", size=64 * MiB)
    outsider = Agent({**one_gib.env, "GPUSLICE_ALLOW_UNSLICED": "1"})
    started.append(outsider)
    outsider.call("init")
    return a, a_pid, outsider


def test_nvml_never_lists_a_process_it_cannot_name_as_the_slices(one_gib, started):
    """A driver lists a process outside the caller's pid namespace as pid 0, and a slice's
    row reads 0 in the container's numbering until its process writes its own (a row the
    daemon claimed for a process still attaching): the outsider's row, its memory and its
    samples are still not the slice's."""
    a, a_pid, outsider = tenant_and_outsider(one_gib, started)
    outsider.call("alloc", path="mem", size=128 * MiB)
    outsider.call("launch_for", seconds=1.0)
    outsider.call("join")  # samples of its own, in the periods just past
    attaching = one_gib.files.claim_slot(os.getpid())  # claimed; its process has not written its own pid
    assert one_gib.files.usage.proc[attaching].ns_pid == 0
    got = a.call("nvml")
    assert got["procs"] == got["details"]["all"] == {str(a_pid): 64 * MiB}
    assert "0" not in got["samples"] and 0 not in got["sampled"] and got["util"] == 0
    seen = outsider.call("nvml")  # what the slice was not shown: the driver has the outsider's samples
    assert str(outsider.pid) in seen["samples"] and outsider.pid in seen["sampled"]
    one_gib.files.release_slot(attaching)


def test_accounting_lists_only_this_containers_processes(one_gib, started):
    """Where accounting mode is on, the slice reads the records of its own processes only:
    another tenant's pid and stats are not listed."""
    control = Agent({**one_gib.env, "LD_LIBRARY_PATH": str(gpuslice_sim.lib_dir())})
    started.append(control)
    assert control.call("accounting", enable=True) == {"pids": [], "stats": {}}
    a, a_pid, outsider = tenant_and_outsider(one_gib, started)
    assert sorted(control.call("accounting")["pids"]) == sorted([a.host_pid, outsider.pid])  # the driver has both
    got = a.call("accounting")
    assert got["pids"] == [a_pid] and list(got["stats"]) == [str(a_pid)]
    assert got["stats"][str(a_pid)]["running"] == 1
    assert a.call("accounting_stats", pid=0) == "Not Found"  # the outsider, as the container names it


def test_without_a_slice_the_gpu_is_unavailable_with_one_line(daemon):
    d = daemon()
    for env in ({**wrapped_env(d), "GPUSLICE_SLICE_SOCKET": "/nonexistent/slice.sock"}, wrapped_env(d)):
        code = (
            "import pynvml\nfrom cuda.bindings import driver as cu\nprint(cu.cuInit(0)[0].name)\n"
            "try:\n    pynvml.nvmlInit()\nexcept pynvml.NVMLError as e:\n    print(type(e).__name__)\n"
        )
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert r.stdout.split() == ["CUDA_ERROR_NOT_INITIALIZED", "NVMLError_NoPermission"], r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 2 and all(line.startswith("gpuslice: no GPU slice for this process: ") for line in lines)
        assert "GPUSLICE_ALLOW_UNSLICED" in lines[0]


def test_fork_child_attaches_as_its_own_process(one_gib):
    code = r"""
import os, json
from cuda.bindings import driver as cu
cu.cuInit(0); _, dev = cu.cuDeviceGet(0); _, ctx = cu.cuDevicePrimaryCtxRetain(dev); cu.cuCtxSetCurrent(ctx)
assert cu.cuMemAlloc(100 << 20)[0] == 0
pid = os.fork()
if pid == 0:
    cu.cuInit(0); _, ctx = cu.cuDevicePrimaryCtxRetain(dev); cu.cuCtxSetCurrent(ctx)
    assert cu.cuMemAlloc(50 << 20)[0] == 0
    os._exit(0)
os.waitpid(pid, 0)
print(json.dumps({"free": cu.cuMemGetInfo()[1]}))
"""
    r = subprocess.run(
        one_gib.box.command([sys.executable, "-c", code]), env=one_gib.env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 1.0
    while one_gib.used() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert one_gib.used() == 0  # both processes gone, both shares returned


def test_no_signal_handlers_installed(one_gib):
    # SigCgt is the kernel's record of caught signals, whoever installed them
    code = (
        "from cuda.bindings import driver as cu\n"
        "def caught():\n    return [l for l in open('/proc/self/status') if l.startswith('SigCgt')][0]\n"
        "before = caught()\nassert cu.cuInit(0)[0] == 0\n"
        "_, d = cu.cuDeviceGet(0)\n_, c = cu.cuDevicePrimaryCtxRetain(d)\ncu.cuCtxSetCurrent(c)\n"
        "cu.cuMemAlloc(1 << 20)\nprint(before == caught())\n"
    )
    r = subprocess.run(
        one_gib.box.command([sys.executable, "-c", code]), env=one_gib.env, capture_output=True, text=True, timeout=60
    )
    assert r.stdout.strip() == "True", r.stderr


def test_monitoring_tools_read_the_same_through_the_interposer(one_gib, started):
    """What nvidia-smi-style monitors call, through the interposer in a slice
    and straight from the simulator: the same answers, no call missing (a
    passively cooled GPU has no fan: NOT_SUPPORTED, as a real one says)."""
    inside = one_gib.agent(started).call("monitor")
    direct = Agent({**one_gib.env, "LD_LIBRARY_PATH": str(gpuslice_sim.lib_dir())})
    started.append(direct)
    outside = direct.call("monitor")
    assert inside == outside
    assert inside["fan"] == "error: Not Supported"
    failed = {k: v for k, v in inside.items() if isinstance(v, str) and k != "fan"}
    assert failed == {}
    assert inside["power_limit"] == 400_000 and inside["sm_clock"] == inside["max_sm_clock"] == 1410
    assert inside["ecc_mode"] == [1, 1] and inside["ecc_uncorrected"] == 0 and inside["compute_mode"] == 0


def test_a_retained_vmm_handle_keeps_its_memory_charged_until_its_last_release(one_gib, started):
    """cuMemRetainAllocationHandle adds a reference: after the creator's release
    and the unmap the driver still holds the memory, so the slice does too,
    and lets no other allocation into it; the last release gives it back, to
    the byte, round after round."""
    a = one_gib.agent(started)
    got = a.call("vmm_references", size=512 * MiB, rounds=4)
    assert got["total"] == GiB
    for step in got["steps"]:
        assert step["free_while_retained"] == GiB - 512 * MiB  # still charged
        assert step["more_fit"] is False  # the slice never passes its limit
        assert step["free_after"] == GiB
    assert one_gib.used() == 0


def test_shared_vmm_memory_stays_charged_and_foreign_imports_are_refused(one_gib, started, tmp_path):
    """An exported handle can be kept alive by an importer the interposer cannot
    count, so its charge stays until the exporting process ends; importing it
    back is one more reference. Memory another process exported is refused in
    a slice: holding its handle would keep memory alive that no ledger charges."""
    owner, other = one_gib.agent(started), one_gib.agent(started)
    got = owner.call("vmm_share", size=256 * MiB)
    assert (got["create"], got["export"], got["import"]) == ("CUDA_SUCCESS",) * 3 and got["same_handle"]
    assert got["after_one_release"] == got["after_both"] == GiB - 256 * MiB  # pinned: it was exported
    other.call("fd_inbox", path=str(tmp_path / "inbox"))
    exported = owner.call("vmm_export", size=256 * MiB, send_to=str(tmp_path / "inbox"))
    assert exported["free"] == GiB - 512 * MiB
    imported = other.call("vmm_import")
    assert imported["error"] == "CUDA_ERROR_NOT_SUPPORTED"
    assert imported["free_while_held"] == GiB - 512 * MiB  # the refused import holds nothing
    owner.close()
    deadline = time.monotonic() + 1.0
    while one_gib.used() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert one_gib.used() == 0  # the exporter's end gives its pinned charges back


def test_in_a_slice_nvml_utilization_is_the_slices_own(one_gib, started, containers):
    """Another tenant's kernels keep the GPU busy; an idle slice's NVML says 0 %
    and lists no samples of the other's, and the busy one sees its own use."""
    client = one_gib.client
    client.reserve("busy", {"gpuslice.io/memory": "1Gi"})
    box = containers()
    client.bind("busy", box.init_pid)
    busy = Agent(one_gib.env, prefix=box.command([]))
    started.append(busy)
    info = busy.call("init")
    assert info["error"] == "CUDA_SUCCESS"
    idle = one_gib.agent(started)
    busy.call("launch_for", seconds=2.5)
    time.sleep(1.6)
    seen_idle, seen_busy = idle.call("nvml"), busy.call("nvml")
    busy.call("join")
    assert seen_idle["util"] == 0 and seen_idle["samples"] == {}, seen_idle
    assert seen_busy["util"] >= 85 and list(seen_busy["samples"]) == [str(info["pid"])], seen_busy


def test_a_jit_link_round_trip_through_the_interposer(one_gib, started):
    got = one_gib.agent(started).call("jit_link")
    assert set(got["steps"].values()) == {"CUDA_SUCCESS"} and got["size"] == 1024 and got["round_trip"], got


def test_gpuslice_resize_moves_a_running_containers_limit_and_refuses_one_below_what_it_holds(one_gib, started):
    """`gpuslice resize`, the container named by a start of its ID: the process in the slice sees
    the new limit through cuMemGetInfo and NVML at once and allocates up to it, not past it; a limit
    below what it holds is refused in one line, and the limit it had stays."""

    def resize(*args: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "gpuslice.cli", "resize", *args, "--socket", str(one_gib.d.socket)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)

    a = one_gib.agent(started)
    held = a.call("alloc", path="mem", size=768 * MiB)
    assert held["error"] == "CUDA_SUCCESS"
    r = resize("bo", "--memory", "2Gi", "--cores", "60")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    [row] = [line.split() for line in r.stdout.splitlines() if line.startswith("box ")]
    assert row[4:6] == ["2.0", "GiB"] and row[8] == "60"
    assert a.call("meminfo") == {"error": "CUDA_SUCCESS", "free": 2 * GiB - 768 * MiB, "total": 2 * GiB}
    assert a.call("nvml")["total"] == 2 * GiB
    rest = a.call("alloc", path="mem", size=2 * GiB - 768 * MiB)
    assert rest["error"] == "CUDA_SUCCESS"
    assert a.call("alloc", path="mem", size=2 * MiB)["error"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert a.call("free", id=rest["id"])["error"] == "CUDA_SUCCESS"
    r = resize("box", "--memory", "512Mi")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "gpuslice resize: slice uses 768.0 MiB on GPU 0, more than the new limit 512.0 MiB"
    ]
    assert a.call("meminfo")["total"] == 2 * GiB
    assert one_gib.client.get("box").gpus[0].memory_limit == 2 * GiB
