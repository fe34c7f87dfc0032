"""The H100's and H200's recorded NVML answers (tests/data/real-gpu/h100-2026-11-26
and h200-2026-11-27, trace.json: the kit's `trace` step, driver 580.159.04) fed to
the daemon's measurement code (utilization.Spans) as the daemon would have read them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuslice.allocator.utilization import Sample, Spans

pytestmark = pytest.mark.unit

RUNS = Path(__file__).parents[1] / "data" / "real-gpu"
H100, H200 = "h100-2026-11-26", "h200-2026-11-27"


def phase(name: str, run: str = H100) -> dict:
    trace = RUNS / run / "trace.json"
    return next(p for p in json.loads(trace.read_text())["phases"] if p["phase"] == name)


def replay(p: dict) -> tuple[Spans, dict[int, float], float]:
    """Each poll's samples through Spans, passing back the newest stamp as the daemon does:
    the spans, each pid's GPU time (ms) read per process, and the time read (ms)."""
    spans, seen, busy = Spans(), p["started_us"], dict.fromkeys(p["pids"], 0.0)
    start = seen
    for poll in p["polls"]:
        samples = [Sample(pid, stamp, pct) for pid, stamp, pct, _ in poll.get("samples", [])]
        for x, span_us in spans.covered(samples, seen):
            if x.pid in busy:
                busy[x.pid] += x.percent / 100 * span_us / 1000
            seen = max(seen, x.stamp_us)
    return spans, busy, (seen - start) / 1000


@pytest.mark.parametrize("run", [H100, H200])
def test_the_h100_and_h200_give_each_period_to_one_process_and_the_reading_sees_it(run: str) -> None:
    spans, busy, window = replay(phase("two tenants back to back, ungated", run))
    assert not spans.shared and not spans.interleaved  # Reading.per_process is false: the split applies
    assert 198_000 <= spans.period_us <= 202_000  # one sample per 200 ms period
    assert sum(busy.values()) / window == pytest.approx(0.99, abs=0.03)  # the GPU's use, all of it


def test_read_per_process_the_hard_30_tenant_vanishes_while_the_gpu_total_is_right():
    """Why the H200's and H100's hard 30 / 70 read 16.2 / 42.0 and 6.6 / 27.1 %: the 30 %
    tenant ran 26.5 % by its own clock, yet nearly every period went to the 70 % one."""
    p = phase("two tenants under hard 30 / 70 %")
    spans, busy, window = replay(p)
    low, high = (busy[pid] / window for pid in p["pids"])
    assert not spans.shared and not spans.interleaved
    assert low < 0.10 and p["results"][0]["busy_fraction"] > 0.25
    assert 0.60 <= low + high <= 0.75  # what the GPU did: the two tenants' own clocks add to 70.4 %


@pytest.mark.parametrize("run", [H100, H200])
def test_alone_each_sample_is_the_process_s_own(run: str) -> None:
    for name, duty in (("alone, 25 % duty, 5 ms kernels", 0.25), ("alone, 75 % duty, 5 ms kernels", 0.75)):
        _, busy, window = replay(phase(name, run))
        (use,) = (b / window for b in busy.values())
        assert use == pytest.approx(duty, abs=0.04), name


def sm_clock_mhz(run: str) -> float:
    """The SM clock the spin kernels ran at, from the trace's own 5 ms calibrations
    (cycles over the timed length; a launch's few microseconds are 0.2 % of 5 ms)."""
    phases = json.loads((RUNS / run / "trace.json").read_text())["phases"]
    cals = [p["ready"][0] for p in phases if p["kernel_us"] == 5000 and p["ready"][0]["by"] == "cycles"]
    return sorted(c["cycles"] / c["kernel_us"] for c in cals)[len(cals) // 2]


@pytest.mark.parametrize("run", [H100, H200])
def test_short_kernels_read_their_gpu_time_the_probe_s_clock_counted_its_launch_gap(run: str) -> None:
    """50 us kernels at 25 / 50 / 75 % duty read a fifth below the probe's busy fraction,
    but the probe timed a kernel from an event recorded on an idle stream, so its length
    held the host's launch gap. Their spin cycles at the SM clock, plus about 2 us a
    launch, are what the driver reads: it reports a short kernel's GPU time as it is
    (within 3 points, where the probe's clock was 6 to 15 points above it)."""
    mhz = sm_clock_mhz(run)
    for duty in (25, 50, 75):
        p = phase(f"alone, {duty} % duty, 50 us kernels", run)
        (result,), (cal,) = p["results"], p["ready"]
        spin_us = cal["cycles"] / mhz
        spin = result["launches"] * spin_us / 1e6 / result["wall_s"]
        _, busy, window = replay(p)
        (read,) = (b / window for b in busy.values())
        assert -0.01 <= read - spin <= 0.03, (duty, read, spin)  # spinning, plus the GPU's cost of a launch
        assert cal["kernel_us"] - spin_us >= 5, duty  # the probe's length held a gap of the host's
        assert result["busy_fraction"] - read >= 0.05, duty  # so its clock read high, not the driver low
