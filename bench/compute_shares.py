"""Compute shares on the simulator: saturating tenants, each in its own slice
and pid namespace behind the interposer's launch gate, on one GPU with the
daemon's controller; prints each tenant's share of GPU time over 10 s windows
against its target (docs/compute.md).  Needs root (pid namespaces)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import click

from gpuslice.allocator.cost_split import DRIFT_STRIKES, DRIFT_WINDOW_NS
from gpuslice.cli import sim_daemon
from gpuslice.cli.pid_namespace import PidNamespace
from gpuslice.cli.sim_daemon import interposer_env
from gpuslice.paths import native_dir

LOAD = native_dir() / "tools" / "gpuslice-cuda-load"
WINDOW = 10.0  # seconds
SETTLE = 2.0  # seconds from the last start before a window opens ...
SETTLE_PER_SLICE = 6.0  # ... or, where the driver gives each period to one process, once the controller has
# fitted the tenants' costs together (docs/compute.md), for which each may take this much: a fit whose
# rows are noisy (a busy node's late ticks, 10 ms kernels across a reading's edge) ends only at FIT_ROWS
# rows, FIT_BLOCK readings each: 9.6 s and its ramp on a driver that samples each 200 ms
NS = 1_000_000_000


class Box(Protocol):
    init_pid: int

    def command(self, argv: list[str]) -> list[str]: ...


class Tenant:
    """A slice held by a box, running gpuslice-cuda-load in it."""

    def __init__(self, client, env: dict[str, str], box: Box, name: str, annotations: dict[str, str],  # type: ignore[no-untyped-def]
                 seconds: float, mix: str, graph: int | str = 0, duty: str = "",
                 stoppable: bool = False) -> None:  # fmt: skip
        self.client, self.name = client, name
        client.reserve(name, annotations)
        client.bind(name, box.init_pid)
        self.started = time.monotonic_ns()
        argv = [str(LOAD), str(seconds), mix, str(graph), *([duty] if duty else [])]
        stdin = subprocess.PIPE if stoppable else subprocess.DEVNULL  # stoppable: see stop_at
        self.proc = subprocess.Popen(box.command(argv), env=env, stdin=stdin, stdout=subprocess.PIPE, text=True)
        self._points: dict[int, int] | None = None
        self.switched: int | None = None

    def stop_at(self, t_ns: int) -> None:
        """End the load once its point at t_ns (time.monotonic_ns) is out: it stops at
        the end of stdin, checked as it reports, every 100 ms."""
        time.sleep(max(0.0, (t_ns - time.monotonic_ns()) / NS + 0.25))
        if self.proc.stdin:
            self.proc.stdin.close()
            self.proc.stdin = None  # communicate() then reads stdout alone

    def points(self) -> dict[int, int]:
        """time ns -> GPU ns used so far, every 100 ms; the slice is released after."""
        if self._points is None:
            out, _ = self.proc.communicate(timeout=120)
            lines = [json.loads(x) for x in out.splitlines()]
            if self.proc.returncode != 0 or not lines or not lines[-1].get("done"):
                raise RuntimeError(f"{self.name}: gpuslice-cuda-load failed: {lines[-3:]}")
            self._points = {x["t"]: x["busy"] for x in lines if "t" in x}
            self.switched = next((x["switched"] for x in lines if "switched" in x), None)  # MIX@SECONDS:MIX2
            self.client.release(self.name)
        return self._points

    def share(self, start_ns: int, end_ns: int) -> float:
        """Percent of the GPU this tenant used in [start, end) (on its 100 ms grid)."""
        at = self.points()
        a = min((t for t in at if t >= start_ns), default=None)
        b = max((t for t in at if t <= end_ns), default=None)
        if a is None or b is None or b <= a:
            raise ValueError(f"{self.name}: no measurement in [{start_ns}, {end_ns})")
        return 100.0 * (at[b] - at[a]) / (b - a)


def slice_of(cores: int, policy: str = "elastic", priority: str = "normal") -> dict[str, str]:
    return {
        "gpuslice.io/memory": "1Gi",
        "gpuslice.io/cores": str(cores),
        "gpuslice.io/compute-policy": policy,
        "gpuslice.io/priority": priority,
    }


@dataclass
class Mix:
    name: str
    cores: list[int]
    kernels: list[str]  # gpuslice-cuda-load MIX per tenant
    policy: str = "hard"
    graphs: list[int | str] | None = None  # GRAPH_NODES per tenant: 4, or "c4" (stream capture)
    priorities: list[str] | None = None
    expect: list[int] | None = None  # default: the cores


@dataclass
class MixResult:
    shares: list[float]  # per tenant, % of the GPU over the 10 s window
    seconds: list[list[float]]  # per tenant, over each whole second of it
    settled_s: float  # from the last start, every 1 s window (sliding by 100 ms) within 1 point from then on
    fitted_s: float | None = None  # from the last start, when the controller was done fitting costs (None: not in time)

    def error(self, want: list[int]) -> float:
        return max(abs(g - w) for g, w in zip(self.shares, want, strict=True))

    def second_error(self, want: list[int]) -> float:
        return max(abs(g - w) for per, w in zip(self.seconds, want, strict=True) for g in per)


def measure_mix(client, env: dict[str, str], boxes, m: Mix) -> MixResult:  # type: ignore[no-untyped-def]
    """Each tenant's share over a 10 s window that opens SETTLE after the last start,
    or half a second after the controller is done fitting their costs if that is
    later (within SETTLE_PER_SLICE a tenant), and over each second of it (on the
    load tool's 100 ms grid)."""
    n = len(m.cores)
    seconds = SETTLE + SETTLE_PER_SLICE * n + WINDOW + 1.5
    graphs, prios = m.graphs or [0] * n, m.priorities or ["normal"] * n
    tenants = [
        Tenant(client, env, boxes(), f"{m.name}-{i}", slice_of(m.cores[i], m.policy, prios[i]), seconds,
               m.kernels[i], graphs[i], stoppable=True)
        for i in range(n)
    ]  # fmt: skip
    grid = NS // 10
    last_start = max(t.started for t in tenants)
    budget = last_start + int((SETTLE + SETTLE_PER_SLICE * n) * NS) - time.monotonic_ns()
    fitted = client.compute_settled([t.name for t in tenants], budget / NS)
    opens = max(last_start + int(SETTLE * NS), (fitted or last_start + int((SETTLE + SETTLE_PER_SLICE * n) * NS))
                + NS // 2)  # fmt: skip
    start = -(-opens // grid) * grid
    for t in tenants:  # the window is what is measured: no tenant runs longer
        t.stop_at(start + int(WINDOW * NS))
    want = m.expect or m.cores
    last = -(-last_start // grid) * grid
    steps = (start - last) // grid + int(WINDOW - 1) * 10  # 1 s windows from the last start to the window's end
    bad = [
        i for i in range(steps + 1)
        if any(round(abs(t.share(last + i * grid, last + i * grid + NS) - w), 1) > 1
               for t, w in zip(tenants, want, strict=True))
    ]  # fmt: skip
    return MixResult(
        shares=[t.share(start, start + int(WINDOW * NS)) for t in tenants],
        seconds=[[t.share(start + i * NS, start + (i + 1) * NS) for i in range(int(WINDOW))] for t in tenants],
        settled_s=(bad[-1] + 1) / 10 if bad else 0.0,
        fitted_s=(fitted - last_start) / NS if fitted else None,
    )


@dataclass
class Handover:
    alone: float  # elastic 30 % alone, % of the GPU
    back: float  # the 10 s from 2 s after a 70 % tenant started (or from the costs fitted, if later)
    back_2s: float  # the first 2 s of them
    other: float
    per_second: list[float]
    settled_ms: int  # from the second start to the end of the first 1 s window from which all are within 3 points
    fitted_ms: int | None  # from the second start to the controller done fitting both costs


def run_handover(client, env: dict[str, str], boxes) -> Handover:  # type: ignore[no-untyped-def]
    budget = 2 * SETTLE_PER_SLICE  # for the controller to fit both costs, where it must
    first = Tenant(client, env, boxes(), "elastic-30", slice_of(30), SETTLE + 4 + budget + WINDOW + 1, "100")
    time.sleep(SETTLE + 2)
    second = Tenant(client, env, boxes(), "elastic-70", slice_of(70), 2 + budget + WINDOW + 1, "1000")
    fitted = client.compute_settled([first.name, second.name], 2 + budget)
    t0 = first.started + int(SETTLE * NS)
    t2 = max(second.started + 2 * NS, (fitted or second.started + int((2 + budget) * NS)) + NS // 2)
    # 1 s windows sliding by 100 ms: settled once every later one is within 3 points
    grid = -(-second.started // (NS // 10)) * (NS // 10)
    windows = [first.share(grid + i * NS // 10, grid + i * NS // 10 + NS) for i in range(int(WINDOW + budget) * 10)]
    settled = next((i for i in range(len(windows)) if all(abs(w - 30) <= 3 for w in windows[i:])), len(windows))
    return Handover(
        alone=first.share(t0, t0 + 2 * NS),
        back=first.share(t2, t2 + int(WINDOW * NS)),
        back_2s=first.share(t2, t2 + 2 * NS),
        other=second.share(t2, t2 + int(WINDOW * NS)),
        per_second=[round(first.share(t2 + i * NS, t2 + (i + 1) * NS), 1) for i in range(int(WINDOW))],
        settled_ms=(grid - second.started) // 1_000_000 + settled * 100 + 1000,
        fitted_ms=(fitted - second.started) // 1_000_000 if fitted else None,
    )


@dataclass
class Lending:
    light: float  # a hard 50 % slice running a 10 % load, % of the GPU
    borrower: float  # an elastic 30 % slice meanwhile, saturating
    light_after: float  # both saturating, from 1.5 s after the light slice's load rose
    borrower_after: float
    given_back_ms: int  # from the rise to the end of the first 1 s window from which the light slice is within 3 points


LIGHT_FOR = 12.0  # seconds of the light load before it saturates


def run_lending(client, env: dict[str, str], boxes) -> Lending:  # type: ignore[no-untyped-def]
    seconds = LIGHT_FOR + 7
    light = Tenant(client, env, boxes(), "light-50", slice_of(50, "hard"), seconds, "100", 0, f"0.1@{LIGHT_FOR}")
    busy = Tenant(client, env, boxes(), "borrower-30", slice_of(30), seconds, "100")
    fitted = client.compute_settled([light.name, busy.name], SETTLE + 2 * SETTLE_PER_SLICE)
    t0 = max(busy.started + int(SETTLE * NS), (fitted or 0) + NS // 2)  # from the costs fitted, where they must be
    rise = min(light.points()) + int(LIGHT_FOR * NS)  # the load tool's clock, on its 100 ms grid
    after = (rise + 3 * NS // 2, rise + 11 * NS // 2)
    windows = [light.share(rise + i * NS // 10, rise + i * NS // 10 + NS) for i in range(46)]
    settled = next((i for i in range(len(windows)) if all(abs(w - 50) <= 3 for w in windows[i:])), len(windows))
    return Lending(
        light=light.share(t0, rise - NS // 2),
        borrower=busy.share(t0, rise - NS // 2),
        light_after=light.share(*after),
        borrower_after=busy.share(*after),
        given_back_ms=settled * 100 + 1000,
    )


@dataclass
class Drift:
    before: list[float]  # hard 30 / 70, % of the GPU over the 10 s before the 30 % tenant's kernels change
    stale: list[float]  # ... over the 2 s after (the old cost charged)
    after: list[float]  # ... over 10 s from half a second after the costs were fitted again
    refit_ms: tuple[int, int] | None  # from the change to the fit beginning and ending


# s into the 30 % tenant's load: its kernels, as long, launch half the threads; before that, its
# costs fitted and a 10 s window
CHANGE_AT = SETTLE + 2 * SETTLE_PER_SLICE + WINDOW + 0.5


def run_drift(client, env: dict[str, str], boxes) -> Drift:  # type: ignore[no-untyped-def]
    """Hard 30 / 70; once their costs are fitted, the 30 % tenant's kernels change to
    half occupancy (as long, half the threads: twice the cost per thread). The
    controller is to notice what the GPU does drift off what the fitted costs say
    (within DRIFT_STRIKES + 1 stretches of DRIFT_WINDOW_NS), fit the costs again,
    and hold the shares again."""
    allowance = SETTLE + 2 * SETTLE_PER_SLICE
    notice = (DRIFT_STRIKES + 1) * DRIFT_WINDOW_NS / NS + 1
    seconds = CHANGE_AT + notice + allowance + WINDOW + 1
    a = Tenant(client, env, boxes(), "drift-30", slice_of(30, "hard"), seconds, f"1000@{CHANGE_AT:g}:1000h",
               stoppable=True)  # fmt: skip
    b = Tenant(client, env, boxes(), "drift-70", slice_of(70, "hard"), seconds, "1000", stoppable=True)
    names = [a.name, b.name]
    fitted = client.compute_settled(names, allowance)
    if fitted is None:
        raise RuntimeError("drift: the costs were not fitted in time")
    change = a.started + int(CHANGE_AT * NS)  # within the load's setup of its own clock's start
    began = ended = None
    while (now := time.monotonic_ns()) < change + int((notice + allowance) * NS) and ended is None:
        fitting = any(g.compute_fitting for s in client.list() if s.container_id in names for g in s.gpus)
        if now > change and fitting and began is None:
            began = now
        elif began is not None and not fitting:
            ended = now
        time.sleep(0.05)
    t = (ended or change + int(notice * NS)) + NS // 2
    for x in (a, b):  # the "after" window is what is measured: no tenant runs longer
        x.stop_at(t + int(WINDOW * NS))
    a.points()
    if a.switched is None:
        raise RuntimeError("drift: the 30 % tenant's kernels did not change")
    change = -(-a.switched // (NS // 10)) * (NS // 10)  # on the load's 100 ms grid
    opens = max(change - int(WINDOW * NS), fitted + NS // 2)  # the former, as fitted is within the allowance
    return Drift(
        before=[x.share(opens, change) for x in (a, b)],
        stale=[x.share(change, change + 2 * NS) for x in (a, b)],
        after=[x.share(t, t + int(WINDOW * NS)) for x in (a, b)],
        refit_ms=((began - change) // 1_000_000, (ended - change) // 1_000_000) if began and ended else None,
    )


MIXES = [
    Mix("30/70 hard", [30, 70], ["100", "100"]),
    Mix("30/70 elastic", [30, 70], ["100", "100"], policy="elastic"),
    Mix("10/20/30/40", [10, 20, 30, 40], ["100"] * 4),
    Mix("eight slices", [5, 5, 10, 10, 15, 15, 20, 20], ["100"] * 8),
    Mix("10us vs 10ms", [30, 70], ["10", "10000"]),
    Mix("mixed 10us+10ms", [70, 30], ["10000x1,10x1000", "10x500,10000x2"]),
    Mix("graphs vs kernels", [30, 70], ["100", "100"], graphs=[4, 0]),
    Mix("captured graphs", [30, 70], ["100", "100"], graphs=["c4", 0]),
    Mix("hard 30 alone", [30], ["100"]),
    Mix("priority high/normal", [30, 30], ["100", "100"], "elastic", priorities=["high", "normal"], expect=[70, 30]),
]


@dataclass
class Setting:
    """How the daemon measures: its compute_period, and the simulated driver's
    per-process utilization: its sample period (None: the ideal driver, one exact
    sample per process for the whole window asked) and util_stamps (busiest: each
    period to the process that ran most, as the H100 with driver 580 answered; the
    H100's model)."""

    period: float
    driver_sample_ms: int | None = None
    stamps: str = "together"

    @property
    def label(self) -> str:
        if not self.driver_sample_ms:
            return f"{self.period:g} s, ideal"
        return f"{self.period:g} s, {self.stamps} {self.driver_sample_ms} ms"


SETTINGS = [
    Setting(0.05, 200, "busiest"),  # what the H100 answered: the simulator's default driver
    Setting(0.05),  # the ideal driver
    Setting(0.2),
    Setting(0.5),
    Setting(0.05, 170, "together"),
    Setting(0.05, 170, "per_process"),
]


@dataclass
class Column:
    mixes: dict[str, MixResult]
    handover: Handover
    lending: Lending
    drift: Drift


def run_setting_gpu(setting: Setting) -> dict[str, str]:
    """The simulated GPU's keys for a setting, beside its memory."""
    if not setting.driver_sample_ms:
        return {"util_stamps": "ideal"}
    zero = {"util_zero_samples": "true"} if setting.stamps != "busiest" else {}  # as the simulator had them
    return {"util_sample_time": f"{setting.driver_sample_ms}ms", "util_stamps": setting.stamps, **zero}


def run_setting(setting: Setting, box) -> Column:  # type: ignore[no-untyped-def]
    gpu = {"memory": "16Gi", **run_setting_gpu(setting)}
    with tempfile.TemporaryDirectory(prefix="gpuslice-bench-") as t:
        d_dir = Path(t) / "daemon"
        d_dir.mkdir()
        d = sim_daemon.start(d_dir, sim_daemon.write_config(d_dir, [gpu], compute_period=setting.period))
        env = interposer_env(d)
        try:
            with d.client() as client:
                mixes = {m.name: measure_mix(client, env, box, m) for m in MIXES}
                return Column(
                    mixes, run_handover(client, env, box), run_lending(client, env, box), run_drift(client, env, box)
                )
        finally:
            d.kill()


def main() -> None:
    if os.geteuid() != 0:
        raise click.ClickException("compute-shares needs root (each tenant gets its own pid namespace)")
    boxes: list[PidNamespace] = []

    def box() -> PidNamespace:
        boxes.append(PidNamespace())
        return boxes[-1]

    # GPUSLICE_BENCH_SETTINGS=0,1: only these columns (indices into SETTINGS), side by side
    picked = os.environ.get("GPUSLICE_BENCH_SETTINGS")
    settings = [SETTINGS[int(i)] for i in picked.split(",")] if picked else SETTINGS
    try:
        columns = []
        for setting in settings:
            columns.append(run_setting(setting, box))
            for b in boxes:
                b.stop()
            boxes.clear()
    finally:
        for b in boxes:
            b.stop()
    report(columns, settings)


def report(columns: list[Column], settings: list[Setting]) -> None:
    w = 2 + max(len("/".join(f"{g:.1f}" for g in r.shares)) for c in columns for r in c.mixes.values())
    w = max(w, 2 + max(len(s.label) for s in settings), 2 + len("0.00 | 00.00 | 10.0 s"))
    click.echo(f"one simulated GPU; % per tenant over {WINDOW:.0f} s from {SETTLE:.0f} s"
               f" + {SETTLE_PER_SLICE:g} s per tenant after the last start;")  # fmt: skip
    click.echo("worst error in points: over the 10 s | over any whole second of it | every sliding 1 s window")
    click.echo("within 1 point from this many s after the last start (the controller done fitting the costs at)")
    click.echo(f"  {'mix':<22}{'target %':<24}" + "".join(f"{s.label:<{w}}" for s in settings))
    for m in MIXES:
        want = m.expect or m.cores
        got = [c.mixes[m.name] for c in columns]
        click.echo(
            f"  {m.name:<22}{'/'.join(map(str, want)):<24}"
            + "".join(f"{'/'.join(f'{g:.1f}' for g in r.shares):<{w}}" for r in got)
        )
        errs = [f"{r.error(want):.2f} | {r.second_error(want):.2f} | {r.settled_s:.1f} s"
                + (f" (fit {r.fitted_s:.1f})" if r.fitted_s and r.fitted_s > 0.5 else "") for r in got]  # fmt: skip
        click.echo(f"  {'':<46}" + "".join(f"{e:<{w}}" for e in errs))
    rows = [
        ("elastic 30 alone %", lambda c: f"{c.handover.alone:.1f}"),
        ("... 10 s after a 70 starts %", lambda c: f"{c.handover.back:.1f} (other {c.handover.other:.1f})"),
        ("... first 2 s of it %", lambda c: f"{c.handover.back_2s:.1f}"),
        (
            "... every 1 s within 3 from ms",
            lambda c: (
                f"{c.handover.settled_ms}"
                + (f" (fit {c.handover.fitted_ms})" if c.handover.fitted_ms and c.handover.fitted_ms > 500 else "")
            ),
        ),
        ("hard 50 at 10 % / elastic 30 %", lambda c: f"{c.lending.light:.1f} / {c.lending.borrower:.1f}"),
        ("both saturating %", lambda c: f"{c.lending.light_after:.1f} / {c.lending.borrower_after:.1f}"),
        ("share back within 3 from ms", lambda c: f"{c.lending.given_back_ms}"),
        ("hard 30/70, 30's cost x2: before %", lambda c: "/".join(f"{g:.1f}" for g in c.drift.before)),
        ("... the 2 s after %", lambda c: "/".join(f"{g:.1f}" for g in c.drift.stale)),
        ("... fitted again from / to ms", lambda c: "/".join(map(str, c.drift.refit_ms or ("-", "-")))),
        ("... 10 s from then %", lambda c: "/".join(f"{g:.1f}" for g in c.drift.after)),
    ]
    for name, cell in rows:
        click.echo(f"  {name:<46}" + "".join(f"{cell(c):<{w}}" for c in columns))
