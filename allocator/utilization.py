"""The GPU time each process used, as the driver reports it: the readings the
compute controller (allocator/compute.py) turns into budgets. The controller
takes a Sampler, any callable from a GPU's UUID to a Reading; NvmlUtilization
is the driver's (NVML per-process utilization samples), a test's fake is a
function."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import pynvml

log = logging.getLogger(__name__)


@dataclass
class Reading:
    """GPU time per pid over a window; consecutive readings tile time. Where
    the driver stamps each process on its own clock, each process's samples
    tile its own time: `windows_ns` then says what time each pid's figure
    covers (absent: nothing new of it), for the pids the reader knows."""

    busy_ns: dict[int, float]
    window_ns: int
    age_ns: int = 0  # how long before the call the newest sample ended
    windows_ns: dict[int, int] = field(default_factory=dict)
    known: frozenset[int] = frozenset()  # pids with samples so far (windows_ns speaks for these)
    ages_ns: dict[int, int] = field(default_factory=dict)  # per pid, where windows_ns is: when its figure ends
    # each process's figure is its own use; False where the driver gives each period to one
    # process (the GPU's use, to the one that ran most: H100, driver 580), until two
    # processes are seen sampled for one period
    per_process: bool = True

    def window_of(self, pids: Iterable[int]) -> int:
        """The time this reading covers for a slice with these processes."""
        mine = [p for p in pids if p in self.known]
        if not self.windows_ns or not mine:
            return self.window_ns
        return max(self.windows_ns.get(p, 0) for p in mine)

    def age_of(self, pids: Iterable[int]) -> int:
        """How long before the call the slice's figure ends (launches since go with the next reading)."""
        ages = [self.ages_ns[p] for p in pids if p in self.ages_ns]
        return min(ages) if ages else self.age_ns


Sampler = Callable[[str], Reading]


MAX_PIDS = 1024  # processes remembered per GPU before those silent for FORGET_US are dropped
FORGET_US = 60_000_000
GRID_JITTER = 0.05  # stamps on the GPU's clock: the H100's were within 2 ms of its 200 ms grid


@dataclass
class Sample:
    pid: int
    stamp_us: int  # when its sample period ended (CPU time, microseconds)
    percent: int  # of its sample period


class Spans:
    """What time each sample covers. A real driver keeps one sample per process
    per sample period, in which the process ran, and stamps each process's
    samples on its own clock: the processes' stamps interleave (NVIDIA/go-nvml
    #51 and Syllo/nvtop #110 print processes' stamps 0.3 to 1.2 s apart), so
    the gap between a stamp and the one before, of any process, is not what a
    sample covers: with two tenants it read each at a fraction of its use.
    Each sample covers the driver's period: the smallest gap seen between one
    process's consecutive samples (a longer gap is periods in which it did not
    run). A driver that answers one sample per process per call, covering all
    the time since the caller's last (the simulator's ideal driver), never
    shows two stamps in one answer; for it, and until the period is known, a
    sample covers the time since the stamp before."""

    def __init__(self) -> None:
        self.last: dict[int, int] = {}  # pid -> its newest stamp seen
        self.period_us = 0  # the driver's sample period, once seen
        self.grid_us = 0  # the smallest gap between two stamps, of any processes
        self.newest_us = 0
        self.periodic = False  # an answer held samples of more than one stamp: a driver with a period
        self.interleaved = False  # processes' samples came on different stamps: each on its own clock
        self.shared = False  # two processes' samples came on one stamp: each sample is its process's own use

    def covered(self, samples: list[Sample], seen_us: int) -> list[tuple[Sample, int]]:
        """(sample, microseconds it covers) for each sample newer than seen_us, oldest first."""
        new = sorted((x for x in samples if x.stamp_us > seen_us), key=lambda x: x.stamp_us)
        stamps = sorted({x.stamp_us for x in new})
        for a, b in itertools.pairwise([self.newest_us, *stamps] if self.newest_us else stamps):
            if b > a:
                self.grid_us = min(self.grid_us, b - a) if self.grid_us else b - a
        self.newest_us = max(self.newest_us, *stamps) if stamps else self.newest_us
        self.periodic = self.periodic or len(stamps) > 1
        self.shared = self.shared or len(stamps) < len({(x.stamp_us, x.pid) for x in new})
        before = {t: stamps[i - 1] if i else seen_us for i, t in enumerate(stamps)}  # the stamp before, of any process
        out = []
        for x in new:
            prev = self.last.get(x.pid)
            if prev is not None and x.stamp_us > prev:
                own = x.stamp_us - prev
                self.period_us = min(self.period_us, own) if self.period_us else own
            self.last[x.pid] = max(x.stamp_us, prev or 0)
            periodic = (self.periodic or self.interleaved) and self.period_us
            out.append((x, self.period_us if periodic else x.stamp_us - before[x.stamp_us]))
        was = self.shared, self.interleaved
        self.interleaved = self.interleaved or self._stamps_interleave()
        if (self.shared, self.interleaved) != was:
            log.debug("samples per process: shared stamps %s, own clocks %s (period %d us; %s)", self.shared,
                      self.interleaved, self.period_us, [(x.pid, x.stamp_us) for x in new])  # fmt: skip
        if len(self.last) > MAX_PIDS and stamps:  # bounded: processes long gone are forgotten
            for pid in [p for p, t in self.last.items() if t < stamps[-1] - FORGET_US]:
                del self.last[pid]
        return out

    def _stamps_interleave(self) -> bool:
        """Two processes' newest stamps well under a period apart, yet not together: each on its own
        clock (stamped on the GPU's clock, they differ by whole periods, give or take the
        H100's 2 ms of jitter). Once per answer, over the sorted stamps."""
        if not self.period_us:
            return False
        # every stamp on one grid, each process's period a multiple of it: the driver gives each
        # period to one process, and one that ran every other period is stamped two apart
        multiple = round(self.period_us / self.grid_us) if self.grid_us else 0
        if multiple >= 1 and abs(self.period_us - multiple * self.grid_us) <= GRID_JITTER * self.grid_us:
            return False
        ends = sorted(set(self.last.values()))
        return any(b - a < self.period_us * 3 // 4 for a, b in itertools.pairwise(ends))

    def windows(self, covered: list[tuple[Sample, int]], seen_us: int, newest_us: int) -> dict[int, int]:
        """Where each process is on its own clock: the time each pid's figure covers,
        its samples' periods; a known pid with no sample for half a period past its
        next is idle since (a driver sends no sample for a period it did not run in)."""
        if not (self.interleaved and self.period_us):
            return {}
        out: dict[int, int] = {}
        for x, span in covered:
            out[x.pid] = out.get(x.pid, 0) + span
        for pid, last in self.last.items():
            idle_from = max(seen_us, last + self.period_us * 3 // 2)
            if pid not in out and newest_us > idle_from:
                out[pid] = newest_us - idle_from
        return out


class NvmlUtilization:
    """Per-process GPU utilization through NVML: each call covers the time
    since the newest sample of the previous one (pids as this process sees
    them).  A driver returns a sample per process per sample period in which
    it ran, in integer percent of that period; the periods are the gaps
    between the samples' timestamps."""

    def __init__(self) -> None:
        pynvml.nvmlInit()
        self.handles: dict[str, object] = {}
        self.last_seen: dict[str, int] = {}
        self.spans: dict[str, Spans] = {}

    def __call__(self, uuid: str) -> Reading:
        h = self.handles.get(uuid)
        if h is None:
            h = self.handles[uuid] = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())
        seen = self.last_seen.get(uuid) or time.time_ns() // 1000 - 100_000
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(h, seen)
        except pynvml.NVMLError_NotFound:  # nothing ran: the next reading covers this time too
            return Reading({}, 0)
        except pynvml.NVMLError as e:  # e.g. a process came between the size and the data
            log.debug("process utilization of %s: %s", uuid, e)
            return Reading({}, 0)
        spans = self.spans.setdefault(uuid, Spans())
        covered = spans.covered([Sample(int(x.pid), int(x.timeStamp), int(x.smUtil)) for x in samples], seen)
        if not covered:
            return Reading({}, 0)
        busy: dict[int, float] = {}
        for x, span_us in covered:
            busy[x.pid] = busy.get(x.pid, 0.0) + x.percent / 100 * span_us * 1000
        newest = covered[-1][0].stamp_us
        self.last_seen[uuid] = newest
        now_us = time.time_ns() // 1000
        windows = {pid: us * 1000 for pid, us in spans.windows(covered, seen, newest).items()}
        ends = {pid: spans.last[pid] if pid in busy else newest for pid in windows}
        ages = {pid: max(0, now_us - end) * 1000 for pid, end in ends.items()}
        return Reading(busy, (newest - seen) * 1000, max(0, now_us - newest) * 1000, windows, frozenset(spans.last),
                       ages, spans.shared or spans.interleaved)  # fmt: skip
