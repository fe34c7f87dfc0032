"""The GPU time each process used, as the driver reports it: the readings the
compute controller (allocator/compute.py) turns into budgets. The controller
takes a Sampler, any callable from a GPU's UUID to a Reading; NvmlUtilization
is the driver's (NVML per-process utilization samples), a test's fake is a
function."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import pynvml

log = logging.getLogger(__name__)


@dataclass
class Reading:
    """GPU time per pid over a window; consecutive readings tile time."""

    busy_ns: dict[int, float]
    window_ns: int
    age_ns: int = 0  # how long before the call the newest sample ended


Sampler = Callable[[str], Reading]


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
        stamps = sorted({int(x.timeStamp) for x in samples if int(x.timeStamp) > seen})
        if not stamps:
            return Reading({}, 0)
        span = {t: t - (stamps[i - 1] if i else seen) for i, t in enumerate(stamps)}  # what each sample covers
        busy: dict[int, float] = {}
        for x in samples:
            if int(x.timeStamp) in span:
                busy[int(x.pid)] = busy.get(int(x.pid), 0.0) + int(x.smUtil) / 100 * span[int(x.timeStamp)] * 1000
        self.last_seen[uuid] = stamps[-1]
        return Reading(busy, (stamps[-1] - seen) * 1000, max(0, time.time_ns() // 1000 - stamps[-1]) * 1000)
