"""Reserve+Bind+Release latency through the daemon's gRPC API on the
simulator, with 1 and with 32 concurrent clients, against the 5 ms p99
budget of DESIGN.md."""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import click
from gpuslice.allocator import sim_daemon

BUDGET_MS = 5.0


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def _client_loop(d: sim_daemon.RunningDaemon, tag: str, n: int, out: dict[str, list[float]]) -> None:
    with d.client() as c:
        for i in range(n):
            cid = f"{tag}-{i}"
            t0 = time.perf_counter()
            c.reserve(cid, {"gpuslice.io/memory": "64Mi", "gpuslice.io/cores": "1"})
            t1 = time.perf_counter()
            c.bind(cid, os.getpid())
            t2 = time.perf_counter()
            c.release(cid)
            t3 = time.perf_counter()
            out["Reserve"].append((t1 - t0) * 1e3)
            out["Bind"].append((t2 - t1) * 1e3)
            out["Release"].append((t3 - t2) * 1e3)
            out["Reserve+Bind+Release"].append((t3 - t0) * 1e3)


def run(d: sim_daemon.RunningDaemon, clients: int, per_client: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {k: [] for k in ("Reserve", "Bind", "Release", "Reserve+Bind+Release")}
    threads = [
        threading.Thread(target=_client_loop, args=(d, f"c{clients}-{t}", per_client, out)) for t in range(clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="gpuslice-bench-") as tmp:
        d_dir = Path(tmp)
        config = sim_daemon.write_config(d_dir, [{"memory": "80Gi"}, {"memory": "80Gi"}])
        d = sim_daemon.start(d_dir, config)
        try:
            for clients, per_client in ((1, 300), (32, 20)):
                results = run(d, clients, per_client)
                click.echo(f"{clients} concurrent client(s), {clients * per_client} sequences:")
                for name, ms in results.items():
                    p99 = _pct(ms, 0.99)
                    budget = f"   p99/budget {p99 / BUDGET_MS:.2f}" if name in ("Reserve", "Bind") else ""
                    click.echo(f"  {name:<22} p50 {statistics.median(ms):7.2f} ms   p99 {p99:7.2f} ms{budget}")
        finally:
            d.kill()
