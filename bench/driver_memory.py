"""The daemon's reconciliation with the driver's per-process memory counts
(allocator/driver_memory.py) at DESIGN's 2,000 slices, each with a process
attached: the CPU one period costs, as a share of a core at the default
period (1 s), against the 2 % idle budget, when nothing moved since the last
period (each slice's rows read and compared); beside it, in the same run, a
period after every slice's process charged or freed (each worked out again),
the first period (all of every slice's rows read) and every slice's rows
and GPUs read once, alone. The NVML read is one call per
GPU per period (the fake stands for it here; the simulator's answers it in
the scale bench's daemon). The interposer's allocation path is untouched: it
still only reads its counters (`./dev.sh bench interposer-calls` counts the
same instructions)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from gpuslice.allocator.driver_memory import Reconciler
from gpuslice.allocator.slice_files import GpuLimit, SliceFiles

SLICES = 2000
IDLE_BUDGET = 0.02
PERIOD_S = 1.0
ROUNDS = 21


def _files(directory: Path) -> list[SliceFiles]:
    out = []
    for i in range(SLICES):
        f = SliceFiles(directory, f"s{i:05d}")
        f.write_limits([GpuLimit(f"GPU-{i % 8}", 1 << 30, 10, False, 0, "normal")])
        slot = f.claim_slot(100000 + i)
        assert slot is not None and f.charge(slot, 0, 300 << 20)
        out.append(f)
    return out


def _times(fn, rounds: int) -> list[float]:  # type: ignore[no-untyped-def]
    """CPU seconds of each of `rounds` calls, sorted."""
    out = []
    for _ in range(rounds):
        start = time.process_time()
        fn()
        out.append(time.process_time() - start)
    return sorted(out)


def _moving(files: list[SliceFiles], r: Reconciler) -> float:
    """The median CPU of a period after every slice's process charged or freed (not timed)."""
    out = []
    for n in range(ROUNDS):
        for f in files:
            if n % 2:
                f.uncharge(0, 0, 1 << 20)
            else:
                assert f.charge(0, 0, 1 << 20)
        start = time.process_time()
        r.once()
        out.append(time.process_time() - start)
    return sorted(out)[ROUNDS // 2]


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        files = _files(Path(d))
        counts = {f"GPU-{g}": {100000 + i: (300 << 20) + (i % 3) * (64 << 20) for i in range(g, SLICES, 8)}
                  for g in range(8)}  # fmt: skip
        r = Reconciler(lambda: files, counts.__getitem__, PERIOD_S)
        first = _times(r.once, 1)[0]  # every slice worked out from all its rows: nothing known of it yet
        settled = _times(r.once, ROUNDS)  # nothing moved since: each slice's rows read and compared
        moving = _moving(files, r)
        floor = _times(lambda: [(f.rows(ever_first=True), f.gpu_count(), f.gpu_uuid(0)) for f in files], ROUNDS)
        median, low = settled[ROUNDS // 2], settled[0]
        share = median / PERIOD_S
        print(f"reconciliation of {SLICES} slices with a process each, nothing moving: {median * 1e3:6.1f} ms CPU "
              f"per period, median of {ROUNDS} (least {low * 1e3:.1f}; {share * 100:.2f} % of a core at "
              f"{PERIOD_S:.0f} s)   /budget {share / IDLE_BUDGET:.2f}")  # fmt: skip
        print(f"  every slice's process charged or freed 1 MiB since the last period: {moving * 1e3:6.1f} ms "
              f"(median); the first period (all rows read): {first * 1e3:6.1f} ms")  # fmt: skip
        print(f"  reading every slice's rows once and its GPUs alone (same run, median): "
              f"{floor[ROUNDS // 2] * 1e3:6.1f} ms   ratio {median / floor[ROUNDS // 2]:.2f}")  # fmt: skip
