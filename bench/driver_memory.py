"""The daemon's reconciliation with the driver's per-process memory counts
(allocator/driver_memory.py) at DESIGN's 2,000 slices, each with a process
attached: the CPU one period costs, as a share of a core at the default
period (1 s), against the 2 % idle budget; beside it, the same loop without
the ledger writes, measured in the same run. The NVML read is one call per
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
ROUNDS = 20


def _files(directory: Path) -> list[SliceFiles]:
    out = []
    for i in range(SLICES):
        f = SliceFiles(directory, f"s{i:05d}")
        f.write_limits([GpuLimit(f"GPU-{i % 8}", 1 << 30, 10, False, 0, "normal")])
        slot = f.claim_slot(100000 + i)
        assert slot is not None and f.charge(slot, 0, 300 << 20)
        out.append(f)
    return out


def _time(fn, rounds: int) -> float:  # type: ignore[no-untyped-def]
    start = time.process_time()
    for _ in range(rounds):
        fn()
    return (time.process_time() - start) / rounds


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        files = _files(Path(d))
        counts = {f"GPU-{g}": {100000 + i: (300 << 20) + (i % 3) * (64 << 20) for i in range(g, SLICES, 8)}
                  for g in range(8)}  # fmt: skip
        r = Reconciler(lambda: files, counts.__getitem__, PERIOD_S)
        per_period = _time(r.once, ROUNDS)
        floor = _time(lambda: [(f.slot_pids(), f.gpu_count(), f.gpu_uuid(0)) for f in files], ROUNDS)
        share = per_period / PERIOD_S
        print(f"reconciliation of {SLICES} slices with a process each: {per_period * 1e3:6.1f} ms CPU per period "
              f"({share * 100:.2f} % of a core at {PERIOD_S:.0f} s)   /budget {share / IDLE_BUDGET:.2f}")  # fmt: skip
        print(f"  reading the slice files alone (the floor, same run): {floor * 1e3:6.1f} ms   "
              f"ratio {per_period / floor:.2f}")  # fmt: skip
