"""The daemon at 2,000 slices (DESIGN.md budget: `gpuslice status` < 0.5 s,
idle CPU < 2 % of a core): how fast slices are reserved as they pile up (the
first 500 against the last 500), how long `gpuslice status` and the List RPC
take at 2,000, and the idle daemon's CPU over 10 s, with each slice bound to
a live process (the sweeper checks them all) and the compute controller
running."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import click

from bench import node
from gpuslice.cli import sim_daemon

SLICES = 2000
STATUS_BUDGET_S = 0.5
STATUS_RUNS = 5
IDLE_BUDGET = 0.02  # of one core
IDLE_WINDOW_S = 10.0


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _reserve_all(d: sim_daemon.RunningDaemon) -> list[float]:
    """Seconds per Reserve+Bind, slice by slice."""
    took = []
    with d.client() as c:
        for i in range(SLICES):
            t0 = time.perf_counter()
            c.reserve(f"s{i}", {"gpuslice.io/memory": "64Mi"})
            c.bind(f"s{i}", os.getpid())
            took.append(time.perf_counter() - t0)
    return took


def _status_seconds(d: sim_daemon.RunningDaemon) -> tuple[float, int]:
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "gpuslice.cli", "status", "--socket", str(d.socket)],
        capture_output=True,
        text=True,
        check=True,
    )
    return time.perf_counter() - t0, out.stdout.count("\n")


def main() -> None:
    # the sweeper at its default interval
    with node([{"memory": "80Gi"}, {"memory": "80Gi"}], sweep_interval=5.0) as d:
        took = _reserve_all(d)
        first, last = 500 / sum(took[:500]), 500 / sum(took[-500:])
        click.echo(f"Reserve+Bind, slices 1-500:     {first:7.0f} /s")
        click.echo(f"Reserve+Bind, slices 1501-2000: {last:7.0f} /s   last/first {last / first:.2f}")
        with d.client() as c:
            t0 = time.perf_counter()
            listed = len(c.list())
            list_s = time.perf_counter() - t0
        runs = sorted(_status_seconds(d) for _ in range(STATUS_RUNS))  # a new process each: the median
        (status_s, lines), least = runs[STATUS_RUNS // 2], runs[0][0]
        click.echo(f"List RPC at {listed} slices:       {list_s * 1e3:7.0f} ms")
        click.echo(
            f"gpuslice status at {listed}:      {status_s * 1e3:7.0f} ms   ({lines} lines; median of {STATUS_RUNS}, "
            f"least {least * 1e3:.0f} ms)   /budget {status_s / STATUS_BUDGET_S:.2f}"
        )
        time.sleep(1.0)  # the last calls' work is done
        cpu0, t0 = _cpu_seconds(d.proc.pid), time.monotonic()
        time.sleep(IDLE_WINDOW_S)
        idle = (_cpu_seconds(d.proc.pid) - cpu0) / (time.monotonic() - t0)
        click.echo(
            f"idle daemon CPU at {listed} slices: {idle * 100:5.2f} % of a core   /budget {idle / IDLE_BUDGET:.2f}"
        )
