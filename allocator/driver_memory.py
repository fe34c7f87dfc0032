"""The driver's count is the truth, the interposer is the gate: memory the
driver holds for a slice's processes beyond what they charged through the
interposer (a module's code loaded at a kernel's first launch, local memory
grown for a launch, a library's allocations through the driver's own paths:
shared/research/real-driver-facts.md) is read from the driver's per-process
counts every period and charged to the slice's ledger as its "driver-side"
figure. The interposer's next allocation is checked against it; cuMemGetInfo
and NVML in the slice show it; status, the metrics and Get report it.

Per process, what the driver counts beyond what it charged, never below
zero: a context's reserve (charged at attach) is a floor the driver's figure
replaces once it is larger, so nothing is counted twice. A process that
exits takes its part along at the next period (its row is gone)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pynvml

from gpuslice.allocator.slice_files import SliceFiles

log = logging.getLogger(__name__)

# a GPU's UUID -> {pid (this process's view): bytes the driver counts for it}
ProcessMemory = Callable[[str], dict[int, int]]


class NvmlProcessMemory:
    """Per-process used memory as NVML counts it (compute processes)."""

    def __init__(self) -> None:
        pynvml.nvmlInit()
        self.handles: dict[str, object] = {}

    def __call__(self, uuid: str) -> dict[int, int]:
        h = self.handles.get(uuid)
        if h is None:
            h = self.handles[uuid] = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())
        try:
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        except pynvml.NVMLError as e:  # e.g. a process came between the size and the data: next period
            log.debug("process memory of %s: %s", uuid, e)
            return {}
        return {int(p.pid): int(p.usedGpuMemory or 0) for p in procs}


@dataclass
class Over:
    """A slice GPU the driver alone put past its limit."""

    slice_id: str
    gpu: int
    over: int  # bytes past the limit


@dataclass
class Reconciler:
    files_in_use: Callable[[], list[SliceFiles]]
    read: ProcessMemory
    period: float = 1.0
    over: dict[tuple[str, int], int] = field(default_factory=dict)  # (slice, GPU index) -> bytes past its limit
    charged: dict[str, SliceFiles] = field(default_factory=dict)  # slices with a driver-side figure

    def once(self) -> None:
        readings: dict[str, dict[int, int]] = {}
        in_use = self.files_in_use()
        seen = {f.slice_id for f in in_use}
        for sid, files in list(self.charged.items()):
            if sid not in seen:  # its last process went: what the driver held for it went too
                for g in range(files.gpu_count()):
                    files.set_driver_side(g, 0)
                    self._say_if_over(files, g)
                del self.charged[sid]
        # each process's charges before the driver is read, and after: a free between the two reads
        # would otherwise count as the driver's own until the next period (and refuse allocations
        # that fit), and so would an allocation charged and freed between them that the driver's
        # count caught: what the process ever charged, read on both sides, bounds what it held
        before = [_held(f) for f in in_use]
        for files, held in zip(in_use, before, strict=True):
            pids = files.slot_pids()
            for g in range(files.gpu_count()):
                uuid = files.gpu_uuid(g)
                counts = readings.get(uuid)
                if counts is None:
                    counts = readings[uuid] = self.read(uuid)
                extra = sum(max(0, counts.get(pid, 0) - _most_held(files, slot, g, pid, held.get((slot, g))))
                            for slot, pid in pids.items())  # fmt: skip
                files.set_driver_side(g, extra)
                if extra:
                    self.charged[files.slice_id] = files
                self._say_if_over(files, g)

    def _say_if_over(self, files: SliceFiles, g: int) -> None:
        key = (files.slice_id, g)
        past = files.used()[g] - files.memory_limit(g)
        if past > 0 and key not in self.over:
            log.warning("slice %s GPU %d: the driver's own memory (%d bytes) puts it %d bytes past its limit; "
                        "its allocations are refused until it is back under", files.slice_id, g,
                        files.driver_side(g), past)  # fmt: skip
        if past > 0:
            self.over[key] = past
        elif self.over.pop(key, None) is not None:
            log.info("slice %s GPU %d: back under its limit", files.slice_id, g)

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.period):
            try:
                self.once()
            except Exception:  # the next period tries again; a reconciliation never stops the daemon
                log.exception("reconciling with the driver's counts failed")


@dataclass(frozen=True)
class Held:
    """A process row as read before the driver's count."""

    pid: int
    ever: int  # bytes it ever charged (read first)
    used: int  # bytes it held


def _held(files: SliceFiles) -> dict[tuple[int, int], Held]:
    # what it ever charged is read first: the ledger raises it after what the process holds, so a
    # charge made between the two reads is counted twice at worst, never missed
    return {(slot, g): Held(pid, files.proc_charged(slot, g), files.proc_used(slot, g))
            for slot, pid in files.slot_pids().items() for g in range(files.gpu_count())}  # fmt: skip


def _most_held(files: SliceFiles, slot: int, g: int, pid: int, before: Held | None) -> int:
    """The most the process of `slot` can have held on `g` while the driver was read: what it
    held before, plus all it charged since (frees only lower it)."""
    used, ever = files.proc_used(slot, g), files.proc_charged(slot, g)
    if before is None or before.pid != pid or ever < before.ever:  # a new process in the row
        return max(used, ever)
    return max(used, before.used + ever - before.ever)
