"""The demo: CUDA workloads sharing a simulated GPU, watched through NVML."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from gpuslice import inventory, simulator
from gpuslice.cli.gpu_table import render
from gpuslice.units import format_bytes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoResult:
    reports: list[dict]
    peak_used: int
    peak_utilization: int


def run(workers: int, alloc_mib: int, seconds: float, config: str | None, echo=print) -> DemoResult:
    state = tempfile.mkdtemp(prefix="gpuslice-demo-")
    simulator.require()
    import gpuslice_sim as sim

    env = {**os.environ, **sim.environment(config=config, state_dir=state)}
    # this process watches through NVML; it must see the same machine
    os.environ.update({k: v for k, v in env.items() if k.startswith("GPUSLICE_SIM")})
    sim.activate()
    echo("== simulated GPUs before the workload ==")
    echo(render(inventory.read()))
    cmd = [sys.executable, "-m", "gpuslice.cli.workload", "--alloc-mib", str(alloc_mib), "--seconds", str(seconds)]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(workers)]
    peak_used = peak_util = 0
    time.sleep(min(1.2, seconds / 2))
    while any(p.poll() is None for p in procs):
        inv = inventory.read()
        peak_used = max(peak_used, inv.gpus[0].memory_used)
        peak_util = max(peak_util, inv.gpus[0].utilization)
        echo(f"\n== while {workers} processes share GPU 0 ==")
        echo(render(inv))
        time.sleep(1.0)
    reports = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"workload process {p.pid} failed with exit status {p.returncode}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    echo("\n== workload reports ==")
    for r in reports:
        echo(
            f"pid {r['pid']}: {r['device']}: sees total {format_bytes(r['total_bytes'])}, "
            f"free {format_bytes(r['free_bytes_after_alloc'])} after its {format_bytes(r['allocated_bytes'])}; "
            f"copy round trip {'ok' if r['copy_ok'] else 'CORRUPT'}; {r['kernels']} kernels in {r['seconds']:.1f} s"
        )
    echo("\n== after the workload ==")
    echo(render(inventory.read()))
    return DemoResult(reports, peak_used, peak_util)
