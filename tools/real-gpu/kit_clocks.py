"""The GPU's SM clock, power draw and the driver's reasons for holding its clocks
down, sampled while tenants run: whether a GPU runs slower per kernel when it
is full than when it is part-busy.

Why: on the H200 (run 4) two matmul tenants' readings at a full GPU were
11.2-11.5 % above what their costs, fitted at 40-80 % busy, said they ran (the
median over 130 and 14 readings; the selftest's light kernels read 2-3 % under),
and the fit's rows at 39 % busy read 3-5 % under the rows at 80 %: a matmul's
time per thread rose with the GPU's load. A clock held down at the power cap
under a full GPU would do that, and scales every slice's cost alike (the split
unchanged); context switches between tenants would not. These readings say
which. The calls are optional (a driver or pynvml without one leaves its field
out); the reasons' call is tried by its newer name first (nvml.h deprecates
"ClocksThrottleReasons" for "ClocksEventReasons" in 13.0 and keeps the old)."""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pynvml

EVERY_S = 0.5
# the reasons' bits as nvml.h defines them (nvmlClocksEventReason*), by the names an operator reads
REASONS = (
    (0x1, "idle"),
    (0x2, "application clocks"),
    (0x4, "power cap"),
    (0x8, "hardware slowdown"),
    (0x10, "sync boost"),
    (0x20, "thermal (software)"),
    (0x40, "thermal (hardware)"),
    (0x80, "power brake"),
    (0x100, "display clocks"),
    (0x200, "board limit"),
    (0x400, "reliability"),
)


def read(handle: object) -> dict:
    """One reading: sm_mhz, power_w and reasons (a bitmask) where the driver gives them."""
    out: dict = {}
    with contextlib.suppress(pynvml.NVMLError):
        out["sm_mhz"] = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
    with contextlib.suppress(pynvml.NVMLError):
        out["power_w"] = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000
    for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        call = getattr(pynvml, name, None)
        if call is None:
            continue
        with contextlib.suppress(pynvml.NVMLError):
            out["reasons"] = int(call(handle))
            break
    return out


@dataclass
class Clocks:
    """Readings every EVERY_S from a thread, each with its seconds since `started` (monotonic)."""

    handle: object
    started: float
    samples: list[dict] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.wait(EVERY_S):
            self.samples.append({"t": round(time.monotonic() - self.started, 2), **read(self.handle)})

    def stop(self) -> None:
        self._stop.set()


@contextlib.contextmanager
def sampling(gpu_uuid: str, started: float) -> Iterator[Clocks]:
    """Clocks read from a thread while the block runs (none where the GPU's handle is refused)."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid.encode())
    except pynvml.NVMLError:
        yield Clocks(None, started)
        return
    clocks = Clocks(handle, started)
    thread = threading.Thread(target=clocks.run, daemon=True)
    thread.start()
    try:
        yield clocks
    finally:
        clocks.stop()
        thread.join(5)


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in REASONS if mask & bit]


def describe(samples: list[dict], start: float = 0.0, stop: float = math.inf) -> str:
    """The readings from `start` to `stop` s (all, by default) in one phrase: the SM clock's
    median (range), the power's median, and each reason with the readings it was in."""
    inside = [s for s in samples if start <= s.get("t", 0.0) < stop]
    if not inside:
        return "no readings"
    parts = []
    mhz = [s["sm_mhz"] for s in inside if "sm_mhz" in s]
    if mhz:
        parts.append(f"SM {statistics.median(mhz):.0f} MHz ({min(mhz)}-{max(mhz)})")
    watts = [s["power_w"] for s in inside if "power_w" in s]
    if watts:
        parts.append(f"{statistics.median(watts):.0f} W")
    masks = [s["reasons"] for s in inside if "reasons" in s]
    if masks:
        held = {name: sum(1 for m in masks if m & bit) for bit, name in REASONS}
        said = [f"{name} in {n} of {len(masks)}" for name, n in held.items() if n]
        parts.append("; ".join(said) if said else "no reason held the clocks down")
    return ", ".join(parts) if parts else "no clock or power from this driver"
