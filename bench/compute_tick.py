"""The compute controller's CPU per tick (allocator/compute.py) with N slices
that each have a process launching, spread over 8 GPUs: what one period
costs, and its share of a core at the packaged period (0.05 s, 20 ticks a
second). The slices' gates are the real ledger's (their files on a tmpfs or
wherever tempfile puts them); between ticks each slice launches a few
thousand threads (tokens taken from its gate, not timed) and the driver's
reading (a stand-in, one per GPU per tick, as NVML's is one call) gives each
process its part of the period.

GPUSLICE_BENCH_AGAINST=REV (a git revision of this checkout) times that
revision's allocator/compute.py too, tick by tick in turn with this one's on
slices of their own, and prints the ratio: two controllers measured side by
side in one run, whatever the machine's speed does meanwhile."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

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


def _controller(module: ModuleType, directory: Path, n: int):  # type: ignore[no-untyped-def]
    """A controller of `module` over N slices of its own, and a tick that launches first."""
    files, limits = _slices(directory, n)
    pids = {f"GPU-{g}": [100000 + i for i in range(g, n, GPUS)] for g in range(GPUS)}
    window = int(PERIOD_S * 1e9)

    def sample(uuid: str) -> Reading:
        mine = pids[uuid]
        return Reading({p: window / max(1, len(mine)) for p in mine}, window)

    clock = _Clock()
    c = module.ComputeController(lambda: files, limits.__getitem__, sample, PERIOD_S, clock=clock)

    def tick() -> float:
        _launch(files, 4096)
        clock.now += PERIOD_S
        start = time.process_time()
        c.tick()
        return time.process_time() - start

    return tick


def _against(rev: str) -> ModuleType:
    """allocator/compute.py as it was at `rev`, as a module of its own."""
    root = Path(__file__).resolve().parent.parent
    text = subprocess.run(["git", "-C", str(root), "show", f"{rev}:allocator/compute.py"], check=True,
                          capture_output=True, text=True).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "compute_then.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("compute_then", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["compute_then"] = module
    spec.loader.exec_module(module)
    return module


def _per_tick(n: int, modules: list[ModuleType]) -> list[tuple[float, float]]:
    """Per module, the median and least CPU seconds of a tick, N slices each with a launching
    process; the modules' ticks in turn."""
    with tempfile.TemporaryDirectory() as d:
        ticks = []
        for i, m in enumerate(modules):
            (Path(d) / str(i)).mkdir()
            ticks.append(_controller(m, Path(d) / str(i), n))
        took: list[list[float]] = [[] for _ in modules]
        for k in range(WARM + ROUNDS):
            for tick, mine in zip(ticks, took, strict=True):
                t = tick()
                if k >= WARM:
                    mine.append(t)
        return [(sorted(t)[ROUNDS // 2], min(t)) for t in took]


def main() -> None:
    from gpuslice.allocator import compute

    rev = os.environ.get("GPUSLICE_BENCH_AGAINST")
    modules = [compute] + ([_against(rev)] if rev else [])
    for n in COUNTS:
        (median, least), *then = _per_tick(n, modules)
        print(f"{n:5d} slices with a launching process on {GPUS} GPUs: {median * 1e3:7.2f} ms CPU a tick "
              f"(median of {ROUNDS}; least {least * 1e3:.2f}), {median / PERIOD_S * 100:6.1f} % of a core "
              f"at {PERIOD_S} s; {median / n * 1e6:5.1f} µs a slice")  # fmt: skip
        for was, _ in then:
            print(f"        at {rev}, in turn with it: {was * 1e3:7.2f} ms   ratio {median / was:.2f}")
