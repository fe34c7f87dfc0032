"""What every step of the kit is given (Kit: the daemon's client, the GPU, the CDI layout,
this call's deadline, where the daemon's files are) and how a case that failed reads."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from kit_report import Row, StepResult, check
from kit_slices import Gate, ProbeError

from gpuslice.allocator.slice_files import SliceFiles
from gpuslice.cli.selftest_node import Layout
from gpuslice.cli.selftest_slices import Box, WorkerError
from gpuslice.client import AllocatorClient
from gpuslice.inventory import Gpu

MiB, GiB = 1 << 20, 1 << 30
SHARE_POINTS = 3.0  # the selftest's tolerance for a share, in percentage points
FAILURES = (ProbeError, WorkerError, grpc.RpcError, OSError, subprocess.TimeoutExpired, KeyError, ValueError)
NO_CUDART = "cudart does not run on the simulator: frameworks run on a real GPU only"


def mib(n: int) -> str:
    return f"{n / MiB:.0f} MiB"


@dataclass
class Kit:
    client: AllocatorClient
    gpu: Gpu
    layout: Layout
    sim: bool
    reserve: int  # what the daemon charges per context: the measured context cost
    deadline: float  # monotonic: this call's end
    config: Path
    spec: Path
    gpuslice: Path
    out: Path
    slices: Path  # the daemon's slice files: a probe that overruns gets its gate's record
    daemon_log: Path  # a step that judges what the daemon said reads it

    def gate(self, box: Box) -> Gate:
        def record() -> dict:
            name = self.client.get(box.name).id
            if not (self.slices / f"{name}.usage").exists():
                return {"slice": name, "files": "gone"}
            return {"slice": name, **SliceFiles(self.slices, name).gate_record(0)}

        return record

    @property
    def limit(self) -> int:
        return (1 if self.sim else 4) * GiB

    def timeout(self, cap: float) -> float:
        return max(30.0, min(cap, self.deadline - time.monotonic() + 30))


def error_text(e: BaseException) -> str:
    return (e.details() or "") if isinstance(e, grpc.RpcError) else f"{type(e).__name__}: {e}"


def failed_case(step: str, label: str, expected: str, e: BaseException) -> tuple[list[Row], dict]:
    """A case that failed: its row, and what a probe that overran was doing (for the report)."""
    overrun = getattr(e, "overrun", "")
    observed = error_text(e) + (" (its stacks and gate: the report's end)" if overrun else "")
    return [check(step, label, expected, observed, False)], ({"overruns": {label: overrun}} if overrun else {})


def failed_step(step: str, label: str, expected: str, e: BaseException) -> StepResult:
    rows, facts = failed_case(step, label, expected, e)
    return StepResult(step, rows, 0, facts)
