"""A pid namespace as containers have it. The real driver's cuInit (570 and
later) names its threads through /proc/<getpid()>/task/<gettid()>/comm and
fails with CUDA_ERROR_OPERATING_SYSTEM when it cannot: on an H200 (driver 580)
every check gpuslice ran in a pid namespace that kept the host's /proc failed
so. The simulator follows the same rule; every namespace gpuslice makes has
its own /proc."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuslice.cli.selftest_slices import WorkerError, _reply
from tests.harness.machine import needs_root

pytestmark = needs_root

CU_INIT = "from cuda.bindings import driver as cu; print(int(cu.cuInit(0)[0]))"


def cu_init(machine, prefix: list[str]) -> str:  # type: ignore[no-untyped-def]
    r = subprocess.run(
        [*prefix, sys.executable, "-c", CU_INIT], env=machine.env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_the_simulator_fails_cuinit_in_a_pid_namespace_with_the_hosts_proc(make_machine):
    m = make_machine()
    assert cu_init(m, []) == "0"
    assert cu_init(m, ["unshare", "--pid", "--mount", "--fork"]) == "304"  # CUDA_ERROR_OPERATING_SYSTEM
    assert cu_init(m, ["unshare", "--pid", "--mount", "--mount-proc", "--fork"]) == "0"


def test_gpuslices_pid_namespace_has_its_own_proc_and_keeps_the_working_directory(make_machine, containers, tmp_path):
    m = make_machine()
    box = containers()
    assert cu_init(m, box.command([])) == "0"
    code = "import os; print(os.getpid(), open('/proc/self/status').read().count('NSpid'), os.getcwd())"
    r = subprocess.run(
        box.command([sys.executable, "-c", code], cwd=str(tmp_path)), capture_output=True, text=True, timeout=60
    )
    pid, _, cwd = r.stdout.split()
    assert int(pid) > 1 and cwd == str(tmp_path)  # a namespace's number, seen in its own /proc
    # its /proc shows only the namespace's processes: init (1) and whoever runs
    listed = subprocess.run(box.command(["ls", "/proc"]), capture_output=True, text=True, timeout=60).stdout.split()
    assert "1" in listed and all(int(p) < 100 for p in listed if p.isdigit())


def test_a_failed_cuinit_names_its_likely_causes():
    with pytest.raises(
        WorkerError, match=r"view: cuInit: CUDA_ERROR_OPERATING_SYSTEM .*/proc is not its pid namespace's.*memfd_create"
    ):
        _reply('{"error": "cuInit: CUDA_ERROR_OPERATING_SYSTEM"}', "", "view")
