"""Process identity read through a ProcFs: the node's /proc in the daemon,
a directory of the same files here (a fake that the real reader reads)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuslice.allocator import identity

STAT = "{pid} (tricky) name) S 1 {pid} {pid} 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0 0 0"


def fake_proc(root: Path, pid: int, cgroup: str, start: int, ns: int) -> None:
    d = root / str(pid)
    (d / "ns").mkdir(parents=True)
    (d / "cgroup").write_text(cgroup)
    (d / "stat").write_text(STAT.format(pid=pid, start=start))
    (d / "ns" / "pid").symlink_to(f"pid:[{ns}]")  # as the kernel's link reads


@pytest.mark.parametrize(("cgroup", "want"), [
    ("0::/kubepods/pod1/ctr\n", "/kubepods/pod1/ctr"),  # v2
    ("12:memory:/docker/abc\n1:name=systemd:/system.slice/x.service\n0::/y\n", "/y"),  # hybrid: v2 wins
    ("12:memory:/docker/abc\n1:name=systemd:/system.slice/x.service\n", "/system.slice/x.service"),
    ("5:cpu:/legacy\n", "/legacy"),
])  # fmt: skip
def test_identity_from_a_proc_tree(tmp_path, cgroup, want):
    fake_proc(tmp_path, 4242, cgroup, 98765, 4026532178)
    proc = identity.ProcFs(tmp_path)
    who = identity.of_pid(4242, proc)
    assert who == identity.Identity(4242, 4026532178, want, 98765)  # a command name with ")" and spaces
    assert identity.alive(4242, 98765, proc) and not identity.alive(4242, 98766, proc)  # a reused pid
    assert not identity.alive(4243, 98765, proc)
    with pytest.raises(identity.NoSuchProcess, match="no process 4243"):
        identity.of_pid(4243, proc)


def test_a_pidfds_pid_and_its_end(tmp_path):
    fdinfo = tmp_path / "self" / "fdinfo"
    fdinfo.mkdir(parents=True)
    (fdinfo / "7").write_text("pos:\t0\nflags:\t02000002\nPid:\t4242\nNSpid:\t4242\t1\n")
    (fdinfo / "8").write_text("pos:\t0\nflags:\t02000002\nPid:\t-1\n")  # the process exited
    proc = identity.ProcFs(tmp_path)
    assert identity.pid_of_pidfd(7, proc) == 4242
    with pytest.raises(identity.NoSuchProcess, match="has exited"):
        identity.pid_of_pidfd(8, proc)


def test_the_real_proc_reads_this_process_as_os_stat_does():
    me = identity.of_pid(os.getpid())
    assert me.pid_ns == os.stat("/proc/self/ns/pid").st_ino and me.start_time > 0


def test_the_slice_manager_knows_processes_through_the_proc_it_is_given(tmp_path):
    """SliceManager reads who a process is through its ProcFs: bound to a pid
    that exists only in the fake tree, found by its namespace, swept when the
    fake says the pid was reused."""
    from gpuslice.allocator.records import Workload
    from gpuslice.allocator.slices import SliceManager
    from gpuslice.allocator.store import SliceStore
    from gpuslice.inventory import Gpu, Inventory
    from gpuslice.request import Parsed, parse

    proc = tmp_path / "proc"
    fake_proc(proc, os.getpid(), "0::/system.slice/gpuslice.service\n", 1, 4026531836)  # the daemon
    fake_proc(proc, 777777, "0::/kubepods/pod1/ctr\n", 5000, 4026532999)  # a container's init
    gpus = (Gpu(0, "GPU-0", "sim", "0000:01:00.0", 16 << 30, 0, 0),)
    m = SliceManager(SliceStore(tmp_path / "state.db"), Inventory("580", 13000, gpus, {}), tmp_path / "files",
                     proc=identity.ProcFs(proc))  # fmt: skip
    asked = {"gpuslice.io/memory": "1Gi"}
    m.reserve("c1", Parsed(parse(asked), asked), "test", Workload())  # type: ignore[arg-type]
    m.bind("c1", 777777)
    found = m.slice_of(identity.of_pid(777777, identity.ProcFs(proc)))
    assert found is not None and found.container_id == "c1"
    assert m.sweep(60) == [] and m.gpus_held() == ["GPU-0"]
    (proc / "777777" / "stat").write_text(STAT.format(pid=777777, start=5001))  # the pid reused
    assert m.sweep(60) == ["c1"] and m.gpus_held() == []  # the GPUs slices hold, kept as they go
