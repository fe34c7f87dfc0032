"""NVML's accounting: each process's GPU time by the driver's own count, a third
view of who ran beside per-process samples (each 200 ms period to one process on
the H100 and the H200) and each tenant's throughput (docs/real-gpu.md, run 4).

With accounting mode on, `nvmlDeviceGetAccountingStats` gives a process's
gpuUtilization (integer percent of its lifetime with a kernel of its running),
its startTime (CPU µs) and its time (ms of that lifetime; nvml.h: 0 while the
process runs, set once it ended): utilization times its life so far (now -
startTime while it runs) is its GPU time so far. Two reads bracket a stretch;
integer percent of a 40 s lifetime is about ±0.2 s. Turning the mode on needs root and applies to
processes started after; the kit puts it back as it found it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pynvml


@contextlib.contextmanager
def accounting(gpu_uuid: str) -> Iterator[str | None]:
    """Accounting mode on for what runs inside: None, or why it could not be."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid.encode())
        was = pynvml.nvmlDeviceGetAccountingMode(handle)
        if was != pynvml.NVML_FEATURE_ENABLED:
            pynvml.nvmlDeviceSetAccountingMode(handle, pynvml.NVML_FEATURE_ENABLED)
    except pynvml.NVMLError as e:
        yield f"accounting unavailable: {e}"
        return
    try:
        yield None
    finally:
        if was != pynvml.NVML_FEATURE_ENABLED:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlDeviceSetAccountingMode(handle, was)


def gpu_ms(gpu_uuid: str, pids: list[int]) -> list[float | None]:
    """Each process's GPU time so far (ms) by the driver's accounting; None where it has none.
    (Until stop 65 this read `time` alone, which nvml.h says is 0 while the process runs.)"""
    handle = pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid.encode())
    out: list[float | None] = []
    for pid in pids:
        try:
            stats = pynvml.nvmlDeviceGetAccountingStats(handle, pid)
        except pynvml.NVMLError:
            out.append(None)
            continue
        out.append(stats.gpuUtilization / 100 * life_ms(stats.time, stats.startTime, time.time()))
    return out


def life_ms(time_ms: int, start_us: int, now_s: float) -> float:
    """A process's life so far: `time` once it ended (or where a driver fills it while it
    runs), else from its startTime to now."""
    return float(time_ms) if time_ms else max(0.0, now_s * 1000 - start_us / 1000)


def shares(before: list[float | None], after: list[float | None], seconds: float) -> list[float | None]:
    """Each process's percent of the GPU between two reads `seconds` apart."""
    return [
        100 * (b - a) / (1000 * seconds) if a is not None and b is not None and seconds > 0 else None
        for a, b in zip(before, after, strict=True)
    ]
