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
exits takes its part along at once: its exit wakes the reading (`wake`).

A process of a slice's container that holds memory on the GPU without
having attached loaded a libcuda.so.1 of its own (an image's compat driver
on its library path, or the driver's file opened by path): the interposer
never saw it. All the driver counts for it is charged to the slice, so the
slice's other processes are held to the limit it leaves them, and it is
named once in the log and counted in gpuslice_unsliced_processes_total.
Its own allocations and launches are not the interposer's to refuse
(docs/enforcement.md)."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import pynvml

from gpuslice.allocator import metrics
from gpuslice.allocator.slice_files import Rows, SliceFiles, constant

log = logging.getLogger(__name__)

# a GPU's UUID -> {pid (this process's view): bytes the driver counts for it}
ProcessMemory = Callable[[str], dict[int, int]]
WAKE_SPACING_S = 0.02  # the least time between two reads of the driver, woken or not
Reading = tuple[int, int, int | None]  # a process's pid, the driver's count, the most it held (None: unsliced)


def _said(readings: list[Reading]) -> str:
    return "; ".join(f"{pid} {n}, unsliced" if most is None else f"{pid} {n} of {most}"
                     for pid, n, most in readings) or "none attached"  # fmt: skip


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


def _no_owner(pid: int) -> SliceFiles | None:
    return None


@dataclass
class Reconciler:
    files_in_use: Callable[[], list[SliceFiles]]
    read: ProcessMemory
    period: float = 1.0
    gpus: Callable[[], Iterable[str]] = tuple  # the UUIDs of the GPUs slices hold, looked at for unsliced processes
    owner_of: Callable[[int], SliceFiles | None] = _no_owner  # a process's slice by its container (SliceManager)
    on_unsliced: Callable[[int, SliceFiles], None] | None = None  # told of each once named (the `kill` policy)
    over: dict[tuple[str, int], int] = field(default_factory=dict)  # (slice, GPU index) -> bytes past its limit
    charged: dict[str, SliceFiles] = field(default_factory=dict)  # slices with a driver-side figure
    unsliced: dict[tuple[int, str], str] = field(default_factory=dict)  # (pid, GPU) -> its slice, once named
    suspects: dict[tuple[int, str], float] = field(default_factory=dict)  # (pid, GPU) seen unattached -> first seen
    clock: Callable[[], float] = time.monotonic
    _worked: dict[str, _Worked] = field(default_factory=dict, init=False, repr=False)  # slice -> last worked out
    _set: dict[str, list[int]] = field(default_factory=dict, init=False, repr=False)  # slice -> figure last set
    _soon: threading.Event = field(default_factory=threading.Event, init=False, repr=False)  # wake()

    def once(self) -> None:
        in_use = self.files_in_use()
        # each process's charges before the driver is read, and after: a free between the two reads
        # would otherwise count as the driver's own until the next period (and refuse allocations
        # that fit), and so would an allocation charged and freed between them that the driver's
        # count caught: what the process ever charged, read on both sides, bounds what it held.
        # A row released meanwhile (its process exited: charges zeroed, then its pid) read as a
        # process holding nothing that the driver, not yet let go, still counted: a slice whose
        # rows were released across the reads keeps its figure, and is read again at once
        before = self._before(in_use)
        gpus = dict.fromkeys(u for b in before for u in b[3]) | dict.fromkeys(self.gpus())
        readings = {u: self.read(u) for u in gpus}
        after = [b[0].rows(ever_first=False, count=b[4].n_rows) for b in before]
        p = self._work_out(before, after, readings)
        known = {f.slice_id for f in in_use}  # a slice whose first process attached since: its rows now
        p.attached.update(pid for f in self.files_in_use() if f.slice_id not in known for pid in f.slot_pids().values())
        self._charge_unsliced(readings, p.extras, p.read_from, p.attached)
        unsure = {f.slice_id for f, seq, *_ in before if seq % 2 or f.release_seq() != seq}
        for sid in unsure:
            log.debug("slice %s: a process's row was released while the driver was read; read again", sid)
        unsure |= p.grown
        for sid in unsure:
            p.extras.pop(sid, None)
            p.worked.pop(sid, None)
        if unsure:
            self._soon.set()
        self._worked = p.worked
        for sid, files in list(self.charged.items()):
            if sid not in p.extras and sid not in unsure:  # its last process went: what the driver held went too
                for g in range(files.gpu_count()):
                    was = files.set_driver_side(g, 0)
                    if was and log.isEnabledFor(logging.DEBUG):
                        log.debug("slice %s GPU %d: driver-side 0 bytes (was %d); no process attached", sid, g, was)
                    self._say_if_over(files, g)
                del self.charged[sid]
        self._set_figures(p)

    def _work_out(self, before: list[_Before], after: list[Rows], readings: dict[str, dict[int, int]]) -> _Period:
        """Each slice's figure from its rows read on both sides of the driver's counts: the one
        last worked out where none of them moved."""
        p, debug = _Period(), log.isEnabledFor(logging.DEBUG)
        for (files, seq, k, us, b), a in zip(before, after, strict=True):
            sid = files.slice_id
            if k is not None and b == a == k.rows and [readings[u].get(pid, 0) for u, pid in k.counted] == k.seen:
                p.worked[sid], p.extras[sid] = k, (files, list(k.row))
                p.same.add(sid)
                p.attached.update(k.pids)
                if debug:  # an unsliced process's part may still move it
                    p.read_from.update(((sid, g), list(said)) for g, said in enumerate(k.said))
                continue
            if not (b.whole() and a.whole()):  # a process attached past the rows read: read them all, at once
                p.grown.add(sid)
                p.attached.update(files.slot_pids().values())
                continue
            pids, pids_before = a.pids(), b.pids()
            p.attached.update(pids.values())
            row, said = [0] * len(us), []
            for g, uuid in enumerate(us):
                counts = readings[uuid]
                most = {pid: _most_held(b, pids_before, a, slot, g, pid) for slot, pid in pids.items()}
                row[g] = sum(max(0, counts.get(pid, 0) - m) for pid, m in most.items())
                said.append(tuple((pid, counts.get(pid, 0), m) for pid, m in most.items()))
                p.read_from[sid, g] = list(said[g])
            p.extras[sid] = (files, row)
            if b == a:  # read alike on both sides: the same rows and counts next period give the same
                counted = tuple((u, pid) for u in us for pid in pids.values())
                seen = [readings[u].get(pid, 0) for u, pid in counted]
                rows = a.first(min(constant("GPUSLICE_SLICE_MAX_PROCS"), max(pids, default=-1) + 2))  # one free past
                p.worked[sid] = _Worked(files, seq, files.generation(), rows, us, tuple(pids.values()), counted,
                                        seen, tuple(row), tuple(said))  # fmt: skip
        return p

    def _set_figures(self, p: _Period) -> None:
        last, debug = self._set, log.isEnabledFor(logging.DEBUG)
        for sid, (files, row) in p.extras.items():
            if sid in p.same and last.get(sid) == row:
                continue  # what it holds, its limit and its figure as they were: nothing to set or say
            for g, extra in enumerate(row):
                was = files.set_driver_side(g, extra)
                if was != extra and debug:  # why a slice's total moved on its own
                    log.debug("slice %s GPU %d: driver-side %d bytes (was %d); pid, driver's count of most held: %s",
                              sid, g, extra, was, _said(p.read_from.get((sid, g), [])))  # fmt: skip
                if extra:
                    self.charged[sid] = files
                self._say_if_over(files, g)
        self._set = {sid: row for sid, (_, row) in p.extras.items()}

    def _before(self, in_use: list[SliceFiles]) -> list[_Before]:
        """Each slice's rows before the driver is read: as many as its figure was last worked
        out from, if its files, its limits and the rows' releases are as they were then (so
        they hold every row in use); else all. (Plain tuples: thousands a period.)"""
        out: list[_Before] = []
        last = self._worked
        for f in in_use:
            seq, k = f.release_seq(), last.get(f.slice_id)
            if k is not None and k.files is f and k.seq == seq and k.generation == f.generation():
                out.append((f, seq, k, k.uuids, f.rows(ever_first=True, count=k.rows.n_rows)))
            else:
                out.append((f, seq, None, _uuids(f), f.rows(ever_first=True)))
        return out

    def _charge_unsliced(self, readings: dict[str, dict[int, int]], extras: dict[str, tuple[SliceFiles, list[int]]],
                         read_from: dict[tuple[str, int], list[Reading]], attached: set[int]) -> None:  # fmt: skip
        """What the driver holds for processes of slices' containers that never attached.
        `attached`: the pids in the rows read after the driver: a process attaches at cuInit,
        before it holds any memory, so one that holds memory and was in no row then never attached."""
        seen: set[tuple[int, str]] = set()
        suspects: dict[tuple[int, str], float] = {}
        now = self.clock()
        for uuid, counts in readings.items():
            for pid, used in counts.items():
                if used <= 0 or pid in attached:
                    continue
                files = self.owner_of(pid)
                gpus = [files.gpu_uuid(g) for g in range(files.gpu_count())] if files else []
                if files is None or uuid not in gpus:
                    continue
                key = (pid, uuid)
                # a process leaving its slot as the driver still counts it is not one: seen again a
                # period on (a read an exit woke comes sooner than the driver may let go of it)
                first = self.suspects.get(key)
                if key not in self.unsliced and (first is None or now - first < self.period):
                    suspects[key] = now if first is None else first
                    continue
                g = gpus.index(uuid)
                extras.setdefault(files.slice_id, (files, [0] * files.gpu_count()))[1][g] += used
                read_from.setdefault((files.slice_id, g), []).append((pid, used, None))
                seen.add(key)
                if key not in self.unsliced:
                    self.unsliced[key] = files.slice_id
                    metrics.UNSLICED.labels(uuid).inc()
                    log.warning("slice %s GPU %d: process %d of its container holds %d bytes on the GPU without "
                                "the interposer (it loaded a libcuda.so.1 of its own); charged to the slice, "
                                "its launches not gated", files.slice_id, g, pid, used)  # fmt: skip
                    if self.on_unsliced is not None:
                        self.on_unsliced(pid, files)
        self.suspects = suspects
        for key in set(self.unsliced) - seen:
            log.info("slice %s: process %d, unsliced, no longer holds memory on %s", self.unsliced.pop(key), *key)

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

    def wake(self) -> None:
        """Read the driver now, not at the next period: a process of a slice exited (its part of
        the driver-side figure goes with it at once, as its charges did), or the daemon stops."""
        self._soon.set()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._soon.wait(self.period)
            self._soon.clear()
            if stop.is_set():
                return
            try:
                self.once()
            except Exception:  # the next period tries again; a reconciliation never stops the daemon
                log.exception("reconciling with the driver's counts failed")
            stop.wait(WAKE_SPACING_S)  # a burst of exits is read once in this, not once each


class _Worked(NamedTuple):
    """A slice's figure as worked out from rows read alike before and after the driver: while
    they, its limits and the driver's counts for their processes stay so, the figure stands."""

    files: SliceFiles
    seq: int  # its release_seq then
    generation: int  # of its limits
    rows: Rows
    uuids: tuple[str, ...]  # its GPUs, in order
    pids: tuple[int, ...]  # its attached processes
    counted: tuple[tuple[str, int], ...]  # each (GPU, attached process)
    seen: list[int]  # the driver's count of each of those
    row: tuple[int, ...]  # the figure per GPU, its attached processes' part
    said: tuple[tuple[Reading, ...], ...]  # per GPU, each process's count and the most it held (for the log)


@dataclass
class _Period:
    """What a reading of the driver's counts worked out, slice by slice."""

    extras: dict[str, tuple[SliceFiles, list[int]]] = field(default_factory=dict)  # slice -> its figure per GPU
    read_from: dict[tuple[str, int], list[Reading]] = field(default_factory=dict)  # (slice, GPU) -> the counts
    worked: dict[str, _Worked] = field(default_factory=dict)  # slices read alike on both sides
    same: set[str] = field(default_factory=set)  # slices whose rows, limits and driver's counts did not move
    grown: set[str] = field(default_factory=set)  # slices with a process in a row past those read
    attached: set[int] = field(default_factory=set)  # the pids in the rows read after the driver


# a slice's files, its release_seq, what its figure was last worked out from (if it still
# holds), its GPUs, its rows as read before the driver
_Before = tuple[SliceFiles, int, "_Worked | None", tuple[str, ...], Rows]


def _uuids(files: SliceFiles) -> tuple[str, ...]:
    return tuple(files.gpu_uuid(g) for g in range(files.gpu_count()))


def _most_held(before: Rows, was: dict[int, int], after: Rows, slot: int, g: int, pid: int) -> int:
    """The most the process of `slot` can have held on `g` while the driver was read: what it
    held before, plus all it charged since (frees only lower it). `was`: the rows' pids before."""
    used, ever = after.used(slot, g), after.ever(slot, g)
    if was.get(slot) != pid or ever < before.ever(slot, g):  # a new process in the row
        return max(used, ever)
    return max(used, before.used(slot, g) + ever - before.ever(slot, g))


def kill_unsliced(owner_of: Callable[[int], SliceFiles | None]) -> Callable[[int, SliceFiles], None]:
    """The `kill` policy: SIGKILL a process of a slice's container found holding
    GPU memory without the interposer. The pidfd holds the process, so the
    check that it is still that container's is about the process killed, not
    a pid reused in between."""

    def kill(pid: int, files: SliceFiles) -> None:
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return  # gone already
        try:
            now = owner_of(pid)
            if now is None or now.slice_id != files.slice_id:
                return
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            log.warning("slice %s: killed process %d, which used the GPU without the interposer "
                        "(unsliced_processes: kill)", files.slice_id, pid)  # fmt: skip
        except OSError as e:
            log.warning("slice %s: could not kill process %d: %s", files.slice_id, pid, e.strerror or e)
        finally:
            os.close(fd)

    return kill
