"""The selftest's compute shares: two workers under hard 30 and 70 %, each
one's share measured as its throughput against the same worker's rate alone
on the GPU (docs/selftest.md).

Not by NVML: an H100 with driver 580 gives each per-process sample period to
one process, the GPU's use to the one that ran most in it
(tests/data/real-gpu/h100-2026-11-26), so two time-sliced processes cannot be
told apart by their samples. The work each worker got done can: a fixed-work
kernel (not a spin on the clock, which ends on time however little of the GPU
its context had) launched back to back, whose launches over a window in
steady state are its work."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc

from gpuslice import request
from gpuslice.cli.selftest_node import Layout
from gpuslice.cli.selftest_report import Check, failed
from gpuslice.cli.selftest_slices import Box, Halt, WorkerError, explained, slice_box
from gpuslice.client import AllocatorClient
from gpuslice.inventory import Gpu

SHARES = (30, 70)
SHARE_TOLERANCE = 3.0  # percentage points
SETTLE_S = 3.0  # the controller's budgets settle before the shares are measured, or from the costs fitted:
FIT_WAIT_S = 12.0  # where the driver gives each period to one process, the daemon first fits the two
# slices' costs together (docs/compute.md): a fit whose rows never make their shares sure to a quarter
# of a point ends at 16 rows of 3 readings, 9.6 s at 200 ms and its first readings (the H200's matmul
# pairs' rows left their shares 0.40 points unsure at 16: since stop 69 such fits end there)
ALONE_S, ALONE_SETTLE_S = 2.0, 0.5  # the rate alone: measured over this, after this
WORK_WAVES, WORK_ITERS = 10, 2000  # whole waves of ~75 us on an H100; the simulator models its own
SLICE_MEMORY = 256 << 20


class Progress:
    """A worker running `work`, and the launches it had made at each moment it reported."""

    def __init__(self, box: Box, seconds: float) -> None:
        self.proc = box.start("work", f"{seconds:.1f}", str(WORK_WAVES), str(WORK_ITERS))
        self.points: list[tuple[int, int]] = []  # (CLOCK_MONOTONIC ns, launches made)
        self.error = ""
        self.started = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                out = json.loads(line)
            except ValueError:
                continue
            if "error" in out:
                self.error = explained(f"work: {out['error']}")
            elif "t" in out:
                self.points.append((int(out["t"]), int(out["launches"])))
            self.started.set()
        self.started.set()

    def wait_started(self, timeout: float) -> None:
        if not self.started.wait(timeout) or self.error or self.proc.poll() not in (None, 0):
            raise WorkerError(self.error or "the worker did not start")

    def rate(self, start_ns: int, end_ns: int) -> float:
        """Launches per second over [start, end], between the reports nearest inside it."""
        inside = [p for p in self.points if start_ns <= p[0] <= end_ns]
        if len(inside) < 2 or inside[-1][0] == inside[0][0]:
            raise WorkerError(self.error or f"the worker reported no progress over {(end_ns - start_ns) / 1e9:.1f} s")
        (t0, n0), (t1, n1) = inside[0], inside[-1]
        return (n1 - n0) / ((t1 - t0) / 1e9)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self._reader.join(5)


@contextmanager
def running(box: Box, seconds: float) -> Iterator[Progress]:
    p = Progress(box, seconds)
    try:
        p.wait_started(60)
        yield p
    finally:
        p.stop()


def _measure(workers: list[Progress], settle: float, seconds: float, halt: Halt) -> list[float]:
    """Each worker's rate over `seconds`, after `settle`."""
    start = time.monotonic_ns() + int(settle * 1e9)
    halt.wait(settle + seconds)
    return [p.rate(start, start + int(seconds * 1e9)) for p in workers]


def share_checks(
    client: AllocatorClient, gpu: Gpu, layout: Layout, seconds: float, halt: Halt, reserve: int = 0
) -> list[Check]:
    """The worker's rate alone on the GPU, then two workers under hard shares."""
    tag = f"GPU {gpu.index}"
    try:
        with (
            slice_box(client, gpu, layout, {request.MEMORY: str(SLICE_MEMORY + reserve)}, halt) as box,
            running(box, ALONE_SETTLE_S + ALONE_S + 1) as p,
        ):
            (alone,) = _measure([p], ALONE_SETTLE_S, ALONE_S, halt)
        with (
            slice_box(client, gpu, layout, _share(SHARES[0], reserve), halt) as a,
            slice_box(client, gpu, layout, _share(SHARES[1], reserve), halt) as b,
            running(a, FIT_WAIT_S + SETTLE_S + seconds + 1) as pa,
            running(b, FIT_WAIT_S + SETTLE_S + seconds + 1) as pb,
        ):
            began = time.monotonic_ns()
            settled = client.compute_settled([a.name, b.name], FIT_WAIT_S, stop=halt.event)
            halt.wait(0)  # stopped while the costs were fitted: no measuring
            fitted = (settled - began) / 1e9 if settled is not None else None
            rates = _measure([pa, pb], max(SETTLE_S - (fitted or 0.0), 0.5), seconds, halt)
    except (grpc.RpcError, WorkerError, OSError, subprocess.TimeoutExpired) as e:
        why = (e.details() or "") if isinstance(e, grpc.RpcError) else str(e)
        return [failed(f"{tag} hard shares", f"{SHARES[0]} and {SHARES[1]} %", why)]
    return [
        Check(f"{tag} hard share {share} %",
              f"{share} ± {SHARE_TOLERANCE:g} % over {seconds:g} s (its work against its rate alone)",
              f"{100 * rate / alone:.1f} % ({rate:.0f} launches/s, alone {alone:.0f}"
              + (f"; costs fitted in {fitted:.1f} s)" if fitted and fitted > 0.5 else
                 f"; costs not fitted in {FIT_WAIT_S:g} s)" if fitted is None else ")"),
              abs(100 * rate / alone - share) <= SHARE_TOLERANCE)
        for share, rate in zip(SHARES, rates, strict=True)
    ]  # fmt: skip


def _share(cores: int, reserve: int) -> dict[str, str]:
    return {request.MEMORY: str(SLICE_MEMORY + reserve), request.CORES: str(cores), request.POLICY: "hard"}
