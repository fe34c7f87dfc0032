"""The trace step: what the driver really reports per process under loads of
known shape, kept raw (one JSON file) so that the compute controller can be
fitted to a real driver away from the GPU. A sampler polls
nvmlDeviceGetProcessUtilization as a daemon would (the timestamp it passes,
what comes back or NVML_ERROR_NOT_FOUND), the device's utilization and each
process's used memory; at the end of a phase one read from the phase's start
returns the driver's whole record of it. The loads (probes/duty_load.py):
one tenant alone, one at 25/50/75 % duty with 50 us and 5 ms kernels, two and
four time-slicing without gpuslice's gate, two under hard 30/70 shares."""

from __future__ import annotations

import contextlib
import itertools
import statistics
import threading
import time
from dataclasses import dataclass

import kit_accounting
import kit_clocks
import pynvml
from kit_report import Row, check
from kit_slices import Probe, without_interposer

from gpuslice import request
from gpuslice.cli.selftest_slices import slice_box

POLL_S = 0.1  # what a daemon's controller might poll at (gpuslice's period is of this order)
MEMORY_EVERY = 5  # polls between per-process memory reads


@dataclass(frozen=True)
class Phase:
    name: str
    kernel_us: float
    duties: tuple[float, ...]  # one tenant each
    cores: tuple[int, ...] = ()  # hard shares under gpuslice's gate; () runs on the driver ungated
    # on the simulator the kit checks its own machinery, not a driver: one phase of each kind runs there
    on_sim: bool = False


PHASES = (
    Phase("alone, back to back, 5 ms kernels", 5000, (1.0,), on_sim=True),
    # 50 us kernels at 25 / 50 / 75 % duty read a fifth below their own clock on the H100 and the
    # H200, but that clock held the host's launch gap (test_replay_real_gpu_traces.py); back to
    # back, whether the GPU's own few microseconds a launch show (what a tenant of them is charged)
    Phase("alone, back to back, 50 us kernels", 50, (1.0,)),
    Phase("alone, back to back, 10 us kernels", 10, (1.0,)),
    *(Phase(f"alone, {int(d * 100)} % duty, {label} kernels", us, (d,), on_sim=(us, d) == (50, 0.5))
      for us, label in ((50, "50 us"), (5000, "5 ms")) for d in (0.25, 0.5, 0.75)),
    Phase("two tenants back to back, ungated", 5000, (1.0, 1.0), on_sim=True),
    Phase("four tenants back to back, ungated", 5000, (1.0,) * 4, on_sim=True),
    Phase("two tenants under hard 30 / 70 %", 5000, (1.0, 1.0), (30, 70), on_sim=True),
)  # fmt: skip


def _now_us() -> int:
    return time.time_ns() // 1000  # NVML's sample timestamps are CPU time in microseconds


class Sampler:
    """Polls the driver from a thread until stopped; every answer kept as it came."""

    def __init__(self, gpu_uuid: str) -> None:
        self.handle = pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid.encode())
        self.polls: list[dict] = []
        self.seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Sampler:
        self.seen = _now_us()
        self._thread.start()
        return self

    def stop(self) -> list[dict]:
        self._stop.set()
        self._thread.join(10)
        return self.polls

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(POLL_S):
            self.polls.append(self.poll(self.seen, memory=n % MEMORY_EVERY == 0))
            n += 1

    def poll(self, last_seen: int, memory: bool = False) -> dict:
        at = _now_us()
        entry: dict = {"t_us": at, "last_seen_us": last_seen}
        try:
            got = pynvml.nvmlDeviceGetProcessUtilization(self.handle, last_seen)
            entry["samples"] = [[s.pid, s.timeStamp, s.smUtil, s.memUtil] for s in got]
            newest = max((s.timeStamp for s in got), default=0)
            if newest > self.seen:
                self.seen = newest  # the next poll asks for what is newer, as a daemon does
        except pynvml.NVMLError as e:
            entry["error"] = type(e).__name__  # NVMLError_NotFound: no process had use since last_seen
        with contextlib.suppress(pynvml.NVMLError):
            rates = pynvml.nvmlDeviceGetUtilizationRates(self.handle)
            entry["device"] = [rates.gpu, rates.memory]
        entry.update(kit_clocks.read(self.handle))  # whether the clock moves with the load (kit_clocks)
        if memory:
            with contextlib.suppress(pynvml.NVMLError):
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
                entry["used"] = {str(p.pid): p.usedGpuMemory for p in procs}
        return entry


def run_phase(kit, phase: Phase, seconds: float) -> dict:  # type: ignore[no-untyped-def]
    """One phase: its tenants in boxes (slices when gated), started together, sampled throughout."""
    with contextlib.ExitStack() as stack:
        unaccounted = stack.enter_context(kit_accounting.accounting(kit.gpu.uuid))  # before its tenants start
        probes, ready = [], []
        for i, duty in enumerate(phase.duties):
            ask = {request.MEMORY: str(2 << 30)}
            if phase.cores:
                ask.update({request.CORES: str(phase.cores[i]), request.POLICY: "hard"})
            box = stack.enter_context(slice_box(kit.client, kit.gpu, kit.layout, ask))
            env = box.env if phase.cores else without_interposer(box.env)
            probe = Probe(box, "duty_load.py", [str(seconds), str(phase.kernel_us), str(duty)], env,
                          kit.timeout(120), kit.gate(box))  # fmt: skip
            stack.callback(probe.kill)
            probes.append(probe)
            # each calibrates its kernel alone: calibrating together, each one's timed kernel
            # waited for the other's turns (84.0 % by its clock against 30.7 % accounted)
            ready.append(probe.message(time.monotonic() + probe.timeout))
        sampler = Sampler(kit.gpu.uuid)
        pids = [p.pid for p in probes]
        before, at = kit_accounting.gpu_ms(kit.gpu.uuid, pids), time.monotonic()
        started_us = _now_us()
        sampler.start()
        for p in probes:
            p.answer()
        for p in probes:
            p.message(time.monotonic() + seconds + 60)  # each holds once done, alive
        polls = sampler.stop()
        # the driver's own count of each one's GPU time: whether it tells time-sliced tenants apart
        accounted = kit_accounting.shares(before, kit_accounting.gpu_ms(kit.gpu.uuid, pids), time.monotonic() - at)
        time.sleep(2 * POLL_S)  # the driver's last sample period closes
        whole = sampler.poll(started_us)  # the driver's whole record since the phase began
        for p in probes:
            p.answer()
        results = [p.message(time.monotonic() + 60)["result"] for p in probes]
    return {"phase": phase.name, "kernel_us": phase.kernel_us, "duties": list(phase.duties),
            "cores": list(phase.cores), "started_us": started_us, "seconds": seconds,
            "pids": [p.pid for p in probes], "ready": ready, "results": results, "polls": polls,
            "whole": whole, "accounted": accounted, "accounting": unaccounted}  # fmt: skip


def summary(record: dict) -> list[dict]:
    """Per tenant: what its own clock says it ran, and what the driver's samples say."""
    out = []
    seen = {(p, ts): sm for poll in record["polls"] for p, ts, sm, _ in poll.get("samples", [])}
    seen.update({(p, ts): sm for p, ts, sm, _ in record["whole"].get("samples", [])})  # polled or in the record
    accounted = record.get("accounted") or [None] * len(record["pids"])  # traces from before run 4 have none
    for pid, result, acct in zip(record["pids"], record["results"], accounted, strict=True):
        mine = sorted((ts, sm) for (p, ts), sm in seen.items() if p == pid)
        stamps = [ts for ts, _ in mine]
        gaps = [(b - a) / 1000 for a, b in itertools.pairwise(stamps)]
        out.append(
            {
                "pid": pid,
                "busy_percent": round(100 * result["busy_fraction"], 1),
                "samples": len(mine),
                "sample_gap_ms": round(statistics.median(gaps), 1) if gaps else None,
                "sm_mean": round(statistics.fmean(sm for _, sm in mine), 1) if mine else None,
                "sm_zero": sum(sm == 0 for _, sm in mine),
                "accounted_percent": round(acct, 1) if acct is not None else None,
            }
        )
    not_found = sum(p.get("error") == "NVMLError_NotFound" for p in record["polls"])
    stamps = {pid: {ts for (p, ts) in seen if p == pid} for pid in record["pids"]}
    for t in out:  # the share of its stamps another tenant's samples carry too (1: stamped together)
        others = set().union(*(v for k, v in stamps.items() if k != t["pid"]))
        mine = stamps[t["pid"]]
        t["stamps_shared"] = round(len(mine & others) / len(mine), 2) if mine and others else None
    # the phase's clocks, over all its polls (traces from before stop 69 have none)
    clocks = kit_clocks.describe(record["polls"])
    return [{**t, "polls": len(record["polls"]), "not_found": not_found, "clocks": clocks} for t in out]


def rows(record: dict) -> list[Row]:
    """INFO rows: the figures, kept in the report even if the trace file is not."""
    got = []
    for t in summary(record):
        got.append(check("trace", f"{record['phase']}: pid {t['pid']}", "a fact: its busy time and the driver's "
                         "per-process samples (none judged)",
                         f"busy {t['busy_percent']} % by its own clock; {t['samples']} samples, median gap "
                         f"{t['sample_gap_ms']} ms, smUtil mean {t['sm_mean']} ({t['sm_zero']} at 0); "
                         f"{t['not_found']} of {t['polls']} polls NOT_FOUND"
                         + (f"; {t['stamps_shared']} of its stamps shared with another tenant's"
                            if t["stamps_shared"] is not None else "")
                         + (f"; NVML accounting {t['accounted_percent']} %"
                            if t["accounted_percent"] is not None else "")
                         + f"; the GPU: {t['clocks']}", None))  # fmt: skip
    return got
