"""Per-process accounting as the simulated driver keeps it (sim/sim_accounting.c,
sim/sim_nvml_accounting.c), read through pynvml: off by default (NOT_SUPPORTED),
turned on by root; a record for each process that makes a context while it is
on, read while it runs and after it ended, as nvml.h's nvmlAccountingStats group
describes it."""

from __future__ import annotations

from tests.harness import REPO
from tests.harness.machine import MiB, gpu, needs_root

pytestmark = needs_root  # nvmlDeviceSetAccountingMode is root's


def test_a_process_has_a_record_while_it_runs_and_after_it_ended(make_machine, agents):
    m = make_machine([gpu("4Gi", context_memory="300Mi")])
    control = agents(m, init=False)
    assert control.call("accounting")["error"] == "Not Supported"  # off, as a driver starts
    before = agents(m)  # its context predates the mode: no record
    assert control.call("accounting", enable=True) == {"pids": [], "stats": {}}
    tenant = agents(m)
    pid = tenant.pid
    tenant.call("alloc", path="mem", size=64 * MiB)
    tenant.call("launch_for", seconds=0.3)
    tenant.call("join")
    got = control.call("accounting")
    assert got["pids"] == [pid]
    running = got["stats"][str(pid)]
    assert running["running"] == 1 and running["time_ms"] == 0  # time: 0 until it ends
    assert running["max_memory"] == 364 * MiB and 0 < running["gpu"] <= 100
    tenant.close()
    ended = control.call("accounting")
    assert ended["pids"] == [pid]
    stats = ended["stats"][str(pid)]
    assert stats["running"] == 0 and stats["time_ms"] >= 300  # its life, at least the launches' 0.3 s
    assert stats["max_memory"] == 364 * MiB and stats["start_us"] == running["start_us"]
    assert control.call("accounting_stats", pid=before.pid) == "Not Found"


def test_the_kit_reads_a_running_processs_gpu_time_from_its_accounting(make_machine, agents):
    """tools/real-gpu/kit_accounting.py on the simulated driver: a tenant that kept the GPU
    busy for 0.5 s has about 500 ms of GPU time while it still runs (its `time` is 0 then,
    as nvml.h says; the kit read that alone before, and so 0)."""
    m = make_machine([gpu("4Gi")])
    control = agents(m, init=False)
    control.call("accounting", enable=True)
    tenant = agents(m)
    tenant.call("launch_for", seconds=0.5)
    tenant.call("join")
    code = (
        f"import sys, pynvml; sys.path.insert(0, {str(REPO / 'tools/real-gpu')!r}); import kit_accounting\n"
        "pynvml.nvmlInit(); uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))\n"
        f"print(kit_accounting.gpu_ms(uuid, [{tenant.pid}, 999999])[0])\n"
    )
    r = m.python(code)
    assert r.returncode == 0, r.stderr
    assert 400 <= float(r.stdout) <= 650, r.stdout
