"""The steps that measure compute shares with matmul tenants (probes/matmul_loop.py) in
slices, each by its own throughput against one alone, NVML's windows and accounting, and
the GPU's clocks: `shares` (alone, ungated, hard and elastic 30 / 70), `share-bias` (order,
equal shares, four tenants), `lend` (a light slice's share back once it saturates) and
`mps` (MPS clients at a share of the threads). They need PyTorch, so they run on a real GPU
only; tests/unit/test_real_gpu_kit.py runs their whole path on stand-ins."""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from dataclasses import dataclass, field

import kit_accounting
import kit_clocks
import kit_mps
from kit_context import FAILURES, SHARE_POINTS, GiB, Kit, failed_case
from kit_node import LogLines
from kit_report import Row, StepResult, check, skipped
from kit_slices import Probe, without_interposer

from gpuslice import request
from gpuslice.cli.selftest_slices import slice_box, sm_use

FOUR_POINTS = 2.0  # four tenants' (10/20/30/40), as issue 46 holds them on a real GPU


FIT_WAIT = 18.0  # s: how long the shares step waits for the daemon's fit before it measures all the same
IDLE_AT = 22.0  # s: when the elastic 30 % tenant stops launching (its share given back to the 70 %)


def given_back_rows(step: str, nvml: list[float], rates: list[float], alone: float) -> list[Row]:
    """The elastic 70 % tenant once the 30 % idles: judged by its throughput against its rate
    alone (NVML's figure also counts the gaps its own loop leaves: a fact)."""
    thr = [100 * r / alone for r in rates] if alone else [0.0]
    label = "elastic 70 % once the 30 % tenant idles"
    return [
        check(step, f"{label}: NVML", "a fact, from 2 s after",
              f"{statistics.fmean(nvml):.1f} % (1 s windows {min(nvml):.1f}-{max(nvml):.1f})", None),
        check(step, f"{label}: throughput", "≥ 90 % of its rate alone, from 2 s after",
              f"{statistics.fmean(thr):.1f} % (per second {min(thr):.1f}-{max(thr):.1f})",
              statistics.fmean(thr) >= 90),
    ]  # fmt: skip


def accounted_row(step: str, label: str, share: float | None, why: str | None) -> Row:
    """A tenant's GPU time over the judged seconds by NVML's accounting (kit_accounting): a fact."""
    observed = f"{share:.1f} %" if share is not None else (why or "no accounting stats for its process")
    return check(step, f"{label}: NVML accounting", "a fact: its GPU time by the driver's count", observed, None)


def share_rows(step: str, label: str, target: float, windows: list[float], rates: list[float], alone: float,
               points: float | None = None) -> list[Row]:  # fmt: skip
    """A tenant's share from NVML (per 1 s window and over them all), and from
    its own throughput against its rate alone, within `points` (SHARE_POINTS)."""
    points = SHARE_POINTS if points is None else points
    over = statistics.fmean(windows) if windows else 0.0
    spread = f"1 s windows {min(windows):.1f}-{max(windows):.1f}" if windows else "no windows"
    thr = [100 * r / alone for r in rates] if alone else []
    thr_all = statistics.fmean(thr) if thr else 0.0
    return [
        # a fact, not a check: a driver that gives each sample period to one process (the H100's,
        # driver 580) cannot tell time-sliced tenants apart by their samples (docs/compute.md)
        check(step, f"{label}: NVML", f"a fact: {target:g} % where each process is sampled on its own",
              f"{over:.1f} % over {len(windows)} s ({spread})", None),
        check(step, f"{label}: throughput", f"{target:g} ± {points:g} % of its rate alone",
              f"{thr_all:.1f} % ({len(thr)} s; per second {min(thr, default=0):.1f}-{max(thr, default=0):.1f})",
              abs(thr_all - target) <= points),
    ]  # fmt: skip


def hard(cores: int) -> dict[str, str]:
    return {request.MEMORY: str(4 * GiB), request.CORES: str(cores), request.POLICY: "hard"}


def _tenants(kit: Kit, boxes: list, seconds: float, idle_after: list[float],
             envs: list[dict[str, str]] | None = None,
             more: list[list[str]] | None = None) -> tuple[list[Probe], list[int]]:  # fmt: skip
    """Matmul tenants, one a box (its environment, or `envs`; `more` arguments
    each, matmul_loop.py's), all ready, then all let go."""
    probes: list[Probe] = []
    try:
        for b, i, env, extra in zip(boxes, idle_after, envs or [b.env for b in boxes], more or [[] for _ in boxes],
                                    strict=True):  # fmt: skip
            probes.append(Probe(b, "matmul_loop.py", [str(seconds), str(i), *extra], env, kit.timeout(180),
                                kit.gate(b)))  # fmt: skip
        for p in probes:
            p.message(time.monotonic() + p.timeout)
        for p in probes:
            p.answer()
    except BaseException:  # one that fails to start or to get ready leaves none of them running
        for p in probes:
            p.kill()
        raise
    return probes, [p.pid for p in probes]


def _windows(gpu_uuid: str, pids: list[int], first: int, last: int, started: float) -> list[list[float]]:
    """Each process's SM use per 1 s window, from second `first` to `last` after `started`."""
    time.sleep(max(0.0, started + first - time.monotonic()))
    return [sm_use(gpu_uuid, pids, 1.0) for _ in range(last - first)]


@dataclass
class Pair:
    """Matmul tenants in slices of `targets` % (made in that order), as measured."""

    fit_s: float | None
    span: slice  # the seconds judged, after the fit
    busy: list[list[float]]  # each tenant's NVML use per 1 s window of the span
    per_second: list[list[int]]  # each tenant's products per second, from its start
    given: slice | None = None  # the seconds judged once the first tenant idles
    after: list[list[float]] = field(default_factory=list)
    accounted: list[float | None] = field(default_factory=list)  # each one's % over the span, NVML accounting
    accounting: str | None = None  # why it has none
    clocks: list[dict] = field(default_factory=list)  # kit_clocks' readings from the tenants' start

    def facts(self) -> dict:
        return {"busy": self.busy, "after_idle": self.after, "per_second": self.per_second, "fitted_s": self.fit_s,
                "accounted": self.accounted, "accounting": self.accounting, "clocks": self.clocks}  # fmt: skip

    def clocks_seen(self) -> str:
        """The clocks while the costs were fitted (the GPU part-busy) and over the judged seconds."""
        fit_end = self.fit_s if self.fit_s is not None else float(self.span.start)
        return (f"fit: {kit_clocks.describe(self.clocks, 0.0, fit_end)}; judged: "
                f"{kit_clocks.describe(self.clocks, self.span.start, self.span.stop)}")  # fmt: skip


def _after_fit(kit: Kit, boxes: list, started: float) -> tuple[float | None, int]:
    """The daemon first fits the slices' costs where the driver gives each period to one
    process (docs/compute.md): (seconds from `started` to its end, None if not within
    FIT_WAIT; the first second judged, one after it)."""
    settled = kit.client.compute_settled([b.name for b in boxes], FIT_WAIT)
    fit_s = (settled / 1e9 - started) if settled is not None else None
    return fit_s, max(3, math.ceil((fit_s if fit_s is not None else FIT_WAIT) + 1))


def _pair(kit: Kit, targets: tuple[int, ...], policy: str, idle_first: bool = False) -> Pair:
    # an H200 fitted two matmul tenants' costs in 4 to 15 s: the windows start a second after the
    # fit, and an elastic first tenant idles once the windows are done
    seconds = 36.0 if idle_first else FIT_WAIT + 23.0
    idle = [IDLE_AT if idle_first and i == 0 else 0.0 for i in range(len(targets))]
    with contextlib.ExitStack() as stack:
        unaccounted = stack.enter_context(kit_accounting.accounting(kit.gpu.uuid))  # before the tenants start
        boxes = [stack.enter_context(slice_box(kit.client, kit.gpu, kit.layout, {**hard(t), request.POLICY: policy}))
                 for t in targets]  # fmt: skip
        probes, pids = _tenants(kit, boxes, seconds, idle)
        started = time.monotonic()
        clocks = stack.enter_context(kit_clocks.sampling(kit.gpu.uuid, started))
        try:
            fit_s, first = _after_fit(kit, boxes, started)
            span = slice(first, int(IDLE_AT) - 1 if idle_first else first + 20)
            time.sleep(max(0.0, started + span.start - time.monotonic()))
            before, at = kit_accounting.gpu_ms(kit.gpu.uuid, pids), time.monotonic()
            busy = _windows(kit.gpu.uuid, pids, span.start, span.stop, started)
            accounted = kit_accounting.shares(before, kit_accounting.gpu_ms(kit.gpu.uuid, pids), time.monotonic() - at)
            given = slice(int(IDLE_AT) + 2, int(IDLE_AT) + 12) if idle_first else None
            after = _windows(kit.gpu.uuid, pids, given.start, given.stop, started) if given else []
            results = [p.message(time.monotonic() + 60)["result"]["per_second"] for p in probes]
        finally:
            for p in probes:
                p.kill()
    return Pair(fit_s, span, busy, results, given, after, accounted, unaccounted, clocks.samples)


@dataclass
class Alone:
    """A matmul tenant alone on the GPU: its products per second, how busy NVML saw the GPU
    meanwhile, and kit_clocks' readings from its start."""

    rate: float
    busy: float
    clocks: list[dict]

    def facts(self) -> dict:
        return {"alone_per_s": self.rate, "alone_busy": self.busy, "alone_clocks": self.clocks}


def _alone(kit: Kit) -> Alone:
    """A matmul tenant alone, in a memory-only slice (its loop's synchronizations leave gaps:
    with how busy the GPU was, what a pair did per busy second tells a tenant slowed while
    time-sliced from a split that is off)."""
    with slice_box(kit.client, kit.gpu, kit.layout, {request.MEMORY: str(4 * GiB)}) as box:
        probes, pids = _tenants(kit, [box], 6.0, [0.0])
        started = time.monotonic()
        try:
            with kit_clocks.sampling(kit.gpu.uuid, started) as clocks:
                busy = _windows(kit.gpu.uuid, pids, 1, 5, started)
            per_second = probes[0].message(time.monotonic() + 60)["result"]["per_second"]
        finally:
            probes[0].kill()
    return Alone(statistics.fmean(per_second[1:-1]), statistics.fmean(w[0] for w in busy), clocks.samples)


UNGATED_S = 8.0  # each ungated tenant's run: seconds 2 to 6 of it are judged


@dataclass
class Ungated:
    """Two matmul tenants time-slicing on the driver alone (no interposer, so no gate): what
    time slicing itself costs two equal tenants, without gpuslice's controller in the way."""

    per_second: list[list[int]]  # each one's products per second over the judged seconds
    accounted: list[float | None]  # each one's % of the GPU over them, NVML accounting
    accounting: str | None  # why it has none
    clocks: list[dict]

    def facts(self) -> dict:
        return {"ungated_per_s": self.per_second, "ungated_accounted": self.accounted,
                "ungated_accounting": self.accounting, "ungated_clocks": self.clocks}  # fmt: skip

    def observed(self, alone: float) -> str:
        rates = [100 * statistics.fmean(r) / alone if r and alone else 0.0 for r in self.per_second]
        acct = " / ".join(f"{a:.1f}" if a is not None else "-" for a in self.accounted)
        why = f" ({self.accounting})" if self.accounting else ""
        return (f"{' + '.join(f'{r:.1f}' for r in rates)} = {sum(rates):.1f} % of one alone; NVML accounting "
                f"{acct} %{why}; {kit_clocks.describe(self.clocks, 2.0, UNGATED_S - 2)}")  # fmt: skip


def _ungated(kit: Kit) -> Ungated:
    """Two matmul tenants in memory-only slices, run without the interposer: the driver's time
    slicing alone. On the H200 the 30 % tenant of hard 30 / 70 did 26.3-28.0 % of its rate alone
    and the 70 % one 69.4-69.7 %: whether time slicing two equal tenants loses that much of the
    GPU too (their rates adding up to under 100 %) or none (then the loss is the gate's)."""
    judged = slice(2, int(UNGATED_S) - 2)
    with contextlib.ExitStack() as stack:
        why = stack.enter_context(kit_accounting.accounting(kit.gpu.uuid))  # before the tenants start
        boxes = [stack.enter_context(slice_box(kit.client, kit.gpu, kit.layout, {request.MEMORY: str(4 * GiB)}))
                 for _ in range(2)]  # fmt: skip
        probes, pids = _tenants(kit, boxes, UNGATED_S, [0.0, 0.0], [without_interposer(b.env) for b in boxes])
        started = time.monotonic()
        clocks = stack.enter_context(kit_clocks.sampling(kit.gpu.uuid, started))
        try:
            time.sleep(max(0.0, started + judged.start - time.monotonic()))
            before, at = kit_accounting.gpu_ms(kit.gpu.uuid, pids), time.monotonic()
            time.sleep(max(0.0, started + judged.stop - time.monotonic()))
            accounted = kit_accounting.shares(before, kit_accounting.gpu_ms(kit.gpu.uuid, pids), time.monotonic() - at)
            per_second = [p.message(time.monotonic() + 60)["result"]["per_second"][judged] for p in probes]
        finally:
            for p in probes:
                p.kill()
    return Ungated(per_second, accounted, why, clocks.samples)


def _ungated_row(step: str, ungated: Ungated, alone: float) -> Row:
    return check(step, "two matmul tenants, ungated", "a fact: each one's rate against one alone, and together; "
                 "each one's GPU time by NVML accounting", ungated.observed(alone), None)  # fmt: skip


def _alone_row(step: str, alone: Alone) -> Row:
    return check(step, "a matmul tenant alone", "a fact: its rate, the GPU's use by NVML, its clocks",
                 f"{alone.rate:.1f} products/s; NVML {alone.busy:.1f} %; "
                 f"{kit_clocks.describe(alone.clocks, 1.0, 5.0)}", None)  # fmt: skip


def _clocks_row(step: str, label: str, pair: Pair) -> Row:
    # a full GPU's matmuls read 8.8-11.4 % above their costs fitted at 40-80 % busy on the H200 (kit_clocks)
    return check(step, f"{label}: the GPU's clocks", "a fact: SM clock, power and what held them, "
                 "while fitting and judged", pair.clocks_seen(), None)  # fmt: skip


def _fit_row(step: str, label: str, fit_s: float | None) -> Row:
    fitted = f"{fit_s:.1f} s" if fit_s is not None else f"not within {FIT_WAIT:g} s"
    return check(step, f"{label}: the daemon's fit of their costs", "a fact: from the start", fitted, None)


def _measured_alone(kit: Kit, step: str, facts: dict, rows: list[Row]) -> float:
    """A matmul tenant alone, into the step's facts and rows: its rate, what the others are held to."""
    measured = _alone(kit)
    facts.update(measured.facts())
    rows.append(_alone_row(step, measured))
    return measured.rate


def _pair_rows(step: str, label: str, names: list[tuple[str, str]], targets: tuple[int, ...], pair: Pair,
               alone: float, points: float | None = None) -> list[Row]:  # fmt: skip
    """A set of tenants' rows: the fit, the clocks, and each one's share and accounted time
    (`names`: each tenant's labels for the two)."""
    rows = [_fit_row(step, label, pair.fit_s), _clocks_row(step, label, pair)]
    for i, ((shared, accounted), target) in enumerate(zip(names, targets, strict=True)):
        rows += share_rows(step, shared, target, [w[i] for w in pair.busy], pair.per_second[i][pair.span], alone,
                           points)  # fmt: skip
        rows.append(accounted_row(step, accounted, pair.accounted[i], pair.accounting))
    return rows


def shares(kit: Kit) -> StepResult:
    step, facts, rows = "shares", {}, []
    try:
        alone = _measured_alone(kit, step, facts, rows)
        ungated = _ungated(kit)
        facts.update(ungated.facts())
        rows.append(_ungated_row(step, ungated, alone))
        for policy in ("hard", "elastic"):
            pair = _pair(kit, (30, 70), policy, idle_first=policy == "elastic")
            facts[policy] = pair.facts()
            names = [(f"{policy} {t} %", f"{policy} {t} %") for t in (30, 70)]
            rows += _pair_rows(step, f"{policy} 30/70", names, (30, 70), pair, alone)
            if pair.given:
                rows += given_back_rows(step, [w[1] for w in pair.after], pair.per_second[1][pair.given], alone)
    except FAILURES as e:
        failed, more = failed_case(step, "two tenants' shares", "run in slices", e)
        rows += failed
        facts.update(more)
    return StepResult(step, rows, 0, facts)


def share_bias(kit: Kit) -> StepResult:
    """Whose work falls short while two tenants time-slice. On an H200 the 30 % tenant of hard
    30 / 70 did 26.3-28.0 % of its rate alone and the 70 % one 69.4-69.7 %, its cost fitted
    10-17 % above the other's for the same kernels; the 30 % slice was the first made each
    time. The same pair made 70 first, and two equal 50 % tenants, tell share from order; four
    tenants at 10/20/30/40 are held to 2 points (issue 46)."""
    step, facts, rows = "share-bias", {}, []
    try:
        alone = _measured_alone(kit, step, facts, rows)
        for targets in ((70, 30), (50, 50), (10, 20, 30, 40)):
            label = f"hard {'/'.join(map(str, targets))}, in that order"
            pair = _pair(kit, targets, "hard")
            facts[label] = pair.facts()
            names = [(f"{label}: #{i + 1}, {t} %", f"{label}: #{i + 1}") for i, t in enumerate(targets)]
            rows += _pair_rows(step, label, names, targets, pair, alone, FOUR_POINTS if len(targets) > 2 else None)
    except FAILURES as e:
        failed, more = failed_case(step, "two tenants' shares, order and equal", "run in slices", e)
        rows += failed
        facts.update(more)
    return StepResult(step, rows, 0, facts)


LEND = (50, 30)  # a hard 50 % lender beside an elastic 30 % borrower, as the simulator's lending test
LEND_LIGHT = 10.0  # % of its rate alone: the lender's load until it rises
RISE_AT = FIT_WAIT + 8.0  # s: when the lender saturates; the light seconds are after the fit, before this
LEND_AFTER = 10.0  # s: how long both then saturate
GIVE_BACK_S = 2.0  # the lender has its share back within this, as on the simulator
BORROWS = 75.0  # % of its rate alone the borrower does at least while the lender is light (the simulator's test)
REFINE = ("measuring it again", "cost measured again", "to measure its cost again")  # cost_split's lines


@dataclass
class Lending:
    """The lender and the borrower, as measured: light, then both saturating."""

    fit_s: float | None
    light: slice  # the seconds judged while the lender is light (after the fit)
    after: slice  # the seconds judged once both saturate (from GIVE_BACK_S + 1 after the rise)
    busy_light: list[list[float]]  # each one's NVML use per 1 s window of `light`
    busy_after: list[list[float]]  # ... of `after`
    per_second: list[list[int]]  # each one's products per second, from its start
    refine: list[str]  # the daemon's lines about measuring the lender's cost again

    def facts(self) -> dict:
        return {"fitted_s": self.fit_s, "busy_light": self.busy_light, "busy_after": self.busy_after,
                "per_second": self.per_second, "refine": self.refine}  # fmt: skip


def given_back_s(rates: list[int], rise: int, target: float, alone: float, points: float = SHARE_POINTS) -> int | None:
    """Seconds from the rise to the end of the first second from which every full
    second's throughput is within `points` of `target` % of its rate alone (1: the
    second of the rise already is); None: never."""
    thr = [100 * r / alone for r in rates[rise:-1]]  # the last second is cut short by the loop's end
    for i in range(len(thr)):
        if all(abs(t - target) <= points for t in thr[i:]):
            return i + 1
    return None


def lend_rows(step: str, r: Lending, alone: float) -> list[Row]:
    (lender, lend_to), rise = LEND, int(RISE_AT)
    thr_light = [statistics.fmean(100 * x / alone for x in p[r.light]) if alone else 0.0 for p in r.per_second]
    back = given_back_s(r.per_second[0], rise, lender, alone)
    back_ok = back is not None and back <= GIVE_BACK_S
    label = f"hard {lender} % at a {LEND_LIGHT:g} % load beside elastic {lend_to} %"
    rows = [
        _fit_row(step, label, r.fit_s),
        check(step, f"{label}: the light one's throughput", f"{LEND_LIGHT:g} ± {SHARE_POINTS:g} % of its rate alone",
              f"{thr_light[0]:.1f} % ({r.light.stop - r.light.start} s)",
              abs(thr_light[0] - LEND_LIGHT) <= SHARE_POINTS),
        check(step, f"{label}: the borrower's throughput", f"≥ {BORROWS:g} % of its rate alone",
              f"{thr_light[1]:.1f} %; NVML {statistics.fmean(w[1] for w in r.busy_light):.1f} %"
              if r.busy_light else f"{thr_light[1]:.1f} %", thr_light[1] >= BORROWS),
        check(step, f"hard {lender} % once it saturates: its share back", f"within {GIVE_BACK_S:g} s, "
              f"{lender} ± {SHARE_POINTS:g} % by throughput from then on",
              f"within {back} s" if back is not None else "not within the run", back_ok),
        check(step, f"hard {lender} % once it saturates: its cost measured again", "a fact: the daemon's lines",
              " | ".join(r.refine) if r.refine else "no line: its cost was not measured again", None),
    ]  # fmt: skip
    for i, target in enumerate((lender, 100 - lender)):
        rows += share_rows(step, f"{'hard' if i == 0 else 'elastic'} {LEND[i]} % once both saturate", target,
                           [w[i] for w in r.busy_after], r.per_second[i][r.after], alone)  # fmt: skip
    return rows


def _lending(kit: Kit, alone: float) -> Lending:
    seconds = RISE_AT + LEND_AFTER
    said = LogLines(kit.daemon_log, at_end=True)
    with contextlib.ExitStack() as stack:
        boxes = [stack.enter_context(slice_box(kit.client, kit.gpu, kit.layout, {**hard(t), request.POLICY: policy}))
                 for t, policy in zip(LEND, ("hard", "elastic"), strict=True)]  # fmt: skip
        light = [str(alone * LEND_LIGHT / 100), str(RISE_AT)]
        probes, pids = _tenants(kit, boxes, seconds, [0.0, 0.0], more=[light, []])
        started = time.monotonic()
        try:
            fit_s, first = _after_fit(kit, boxes, started)
            judged = slice(first, int(RISE_AT)), slice(int(RISE_AT + GIVE_BACK_S) + 1, int(seconds) - 1)
            busy_light = _windows(kit.gpu.uuid, pids, judged[0].start, judged[0].stop, started)
            busy_after = _windows(kit.gpu.uuid, pids, judged[1].start, judged[1].stop, started)
            results = [p.message(time.monotonic() + 60)["result"]["per_second"] for p in probes]
        finally:
            for p in probes:
                p.kill()
    refine = said.new(*REFINE)
    return Lending(fit_s, judged[0], judged[1], busy_light, busy_after, results, refine)


def lend(kit: Kit) -> StepResult:
    """A light slice lends what it leaves and has its share back once it saturates: its cost,
    fitted at its light use, is measured again at its share (docs/compute.md; on the simulator
    light 49.3-50.1 %, given back in 1.0-1.6 s). Not yet measured on a real driver."""
    step, facts, rows = "lend", {}, []
    try:
        alone = _measured_alone(kit, step, facts, rows)
        lending = _lending(kit, alone)
        facts.update(lending.facts())
        rows += lend_rows(step, lending, alone)
    except FAILURES as e:
        failed, more = failed_case(step, "a light slice's lending", "runs in slices", e)
        rows += failed
        facts.update(more)
    return StepResult(step, rows, 0, facts)


MPS_SECONDS = 12.0  # each MPS tenant's run; seconds 2 to 10 of it are judged
MPS_PAIR = (30, 70)


def mps_client_row(step: str, label: str, clients: int, tenants: int) -> Row:
    return check(step, f"{label}: MPS clients", f"the control daemon serves all {tenants} (it lists them)",
                 f"{clients} listed", clients == tenants)  # fmt: skip


def mps_alone_row(step: str, rate: float, without: float) -> Row:
    ratio = f"{100 * rate / without:.1f} % of its rate without MPS" if without else "no rate without MPS"
    return check(step, "a matmul tenant alone under MPS", "a fact: its rate, against its rate without MPS",
                 f"{rate:.1f} products/s, {ratio}", None)  # fmt: skip


def mps_sum_row(step: str, label: str, rates: list[list[int]], alone: float) -> Row:
    total = sum(statistics.fmean(r) for r in rates) / alone * 100 if alone else 0.0
    return check(step, f"{label}: together", "a fact: both tenants' work against one alone under MPS",
                 f"{total:.1f} %", None)  # fmt: skip


MpsRun = tuple[list[list[int]], list[list[float]], int]  # products per second, NVML windows, clients listed


def _mps_run(kit: Kit, mps: kit_mps.Mps, threads: tuple[int | None, ...]) -> MpsRun:
    """Matmul tenants in memory-only slices, clients of the kit's MPS daemon at `threads`
    percent of the GPU's threads (None: no limit): each one's products per second, NVML's
    use per process per 1 s window of the judged seconds, and how many clients the daemon listed."""
    with contextlib.ExitStack() as stack:
        boxes = [stack.enter_context(slice_box(kit.client, kit.gpu, kit.layout, {request.MEMORY: str(4 * GiB)}))
                 for _ in threads]  # fmt: skip
        envs = [mps.client_env(b.env, t) for b, t in zip(boxes, threads, strict=True)]
        probes, pids = _tenants(kit, boxes, MPS_SECONDS, [0.0] * len(threads), envs)
        try:
            started = time.monotonic()
            clients = len(mps.clients())
            busy = _windows(kit.gpu.uuid, pids, 2, int(MPS_SECONDS) - 2, started)
            rates = [p.message(time.monotonic() + 60)["result"]["per_second"][2 : int(MPS_SECONDS) - 2]
                     for p in probes]  # fmt: skip
        finally:
            for p in probes:
                p.kill()
    return rates, busy, clients


def mps(kit: Kit) -> StepResult:
    """MPS-backed hard shares, measured before gpuslice offers them (issue 46, optional): a
    tenant alone under MPS against one without, then two at 30 and 70 % of the GPU's
    threads (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), by their own throughput (kit_mps.py)."""
    step, facts, rows = "mps", {}, []
    control = kit_mps.control_binary()
    if control is None:
        return StepResult(step, [skipped(step, "MPS", f"{kit_mps.CONTROL} is not on this machine's PATH")], 0)
    try:
        without = _alone(kit).rate
        facts["without_mps_per_s"] = without
        with kit_mps.running(control, kit.gpu.uuid) as daemon:
            try:
                (alone_rates,), _, clients = _mps_run(kit, daemon, (None,))
                alone = statistics.fmean(alone_rates)
                facts.update(alone_per_s=alone, alone_clients=clients)
                rows += [mps_client_row(step, "alone", clients, 1), mps_alone_row(step, alone, without)]
                label = f"threads {'/'.join(map(str, MPS_PAIR))} %"
                rates, busy, clients = _mps_run(kit, daemon, MPS_PAIR)
                facts[label] = {"per_second": rates, "busy": busy, "clients": clients}
                rows.append(mps_client_row(step, label, clients, len(MPS_PAIR)))
                for i, target in enumerate(MPS_PAIR):
                    rows += share_rows(step, f"{label}: {target} %", target, [w[i] for w in busy], rates[i], alone)
                rows.append(mps_sum_row(step, label, rates, alone))
            finally:
                facts["control_log"] = daemon.log_tail()
    except (*FAILURES, kit_mps.MpsError) as e:
        failed, more = failed_case(step, "MPS tenants", "run as clients of an MPS daemon", e)
        rows += failed
        facts.update(more)
    return StepResult(step, rows, 0, facts)
