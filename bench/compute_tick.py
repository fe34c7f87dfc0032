"""The compute controller's CPU per tick (allocator/compute.py) with N slices
that each have a process launching, spread over 8 GPUs: what one period
costs, and its share of a core at the packaged period (0.05 s, 20 ticks a
second). The slices' gates are the real ledger's (their files on a tmpfs or
wherever tempfile puts them); between ticks each slice launches a few
thousand threads (tokens taken from its gate, not timed) and the driver's
reading (a stand-in, one per GPU per tick, as NVML's is one call) gives each
process its part of the period."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from gpuslice.allocator.compute import ComputeController
from gpuslice.allocator.slice_files import GpuLimit, SliceFiles
from gpuslice.allocator.utilization import Reading

GPUS = 8
PERIOD_S = 0.05
COUNTS = (16, 128, 2000)
WARM = 40  # ticks before the timed ones: two seconds of readings, the costs fitted
ROUNDS = 21


class _Clock:
    """The controller's clock: one period a tick, as its thread's ticks are."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _slices(directory: Path, n: int) -> tuple[dict[str, SliceFiles], dict[str, list[GpuLimit]]]:
    files, limits = {}, {}
    for i in range(n):
        sid = f"s{i:05d}"
        lim = [GpuLimit(f"GPU-{i % GPUS}", 1 << 30, 100 // max(1, n // GPUS) or 1, i % 2 == 0, 0, "normal")]
        f = SliceFiles(directory, sid)
        f.write_limits(lim)
        assert f.claim_slot(100000 + i) is not None
        files[sid], limits[sid] = f, lim
    return files, limits


def _launch(files: dict[str, SliceFiles], threads: int) -> None:
    """What each slice's process launched since the last tick (the interposer's take from its gate)."""
    for f in files.values():
        f.usage.gate[0].tokens -= threads


def _per_tick(n: int) -> tuple[float, float]:
    """The median and least CPU seconds of a tick, N slices each with a launching process."""
    with tempfile.TemporaryDirectory() as d:
        files, limits = _slices(Path(d), n)
        pids = {f"GPU-{g}": [100000 + i for i in range(g, n, GPUS)] for g in range(GPUS)}
        window = int(PERIOD_S * 1e9)

        def sample(uuid: str) -> Reading:
            mine = pids[uuid]
            return Reading({p: window / max(1, len(mine)) for p in mine}, window)

        clock = _Clock()
        c = ComputeController(lambda: files, limits.__getitem__, sample, PERIOD_S, clock=clock)
        took = []
        for k in range(WARM + ROUNDS):
            _launch(files, 4096)
            clock.now += PERIOD_S
            start = time.process_time()
            c.tick()
            if k >= WARM:
                took.append(time.process_time() - start)
        took.sort()
        return took[ROUNDS // 2], took[0]


def main() -> None:
    for n in COUNTS:
        median, least = _per_tick(n)
        print(f"{n:5d} slices with a launching process on {GPUS} GPUs: {median * 1e3:7.2f} ms CPU a tick "
              f"(median of {ROUNDS}; least {least * 1e3:.2f}), {median / PERIOD_S * 100:6.1f} % of a core "
              f"at {PERIOD_S} s; {median / n * 1e6:5.1f} µs a slice")  # fmt: skip
