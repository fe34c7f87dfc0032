"""The compute controller: gives each slice the share of GPU time it asked
for (docs/compute.md).

Every period it measures what each slice ran on each GPU (readings of
per-process GPU time, allocator/utilization.py, summed over the slice's
processes; where the driver gives each sample period to one process, the GPU's
time split among the slices by what each launched, allocator/cost_split.py),
decides each slice's target
share (policy and priority), and turns the difference into the next period's
launch budget in the slice's gate: budget = target time / learned cost of a
thread, corrected by the integral of the past error.  The interposers spend
the budget; the daemon never sits on a launch path."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gpuslice.allocator.config import FIT_BASES
from gpuslice.allocator.cost_split import CostSplit
from gpuslice.allocator.metrics import COMPUTE_TICK_SECONDS
from gpuslice.allocator.slice_files import GpuLimit, SliceFiles
from gpuslice.allocator.utilization import Reading, Sampler

log = logging.getLogger(__name__)
split_log = logging.getLogger("gpuslice.allocator.cost_split")
tick_log = logging.getLogger("gpuslice.allocator.compute.ticks")

KI = 0.15  # integral gain per period: the loop's delay is about two periods
CREDIT_S = 0.2  # at most this many seconds of target are owed or banked, whatever the period
ACTIVE_HOLD_S = 0.5  # a slice that launched this recently still holds its share
HUNGRY_HOLD_S = 0.5  # ... and one that waited for budget this recently still wants more
RATIO_WINDOW_S = 1.0  # cost-per-thread estimate over about a second ...
RATIO_MIN_PERIODS = 4  # ... of at least this many periods; until then, the median of the GPU's other slices'
EXACT_EVERY = 1024  # readings between exact sums of a history's GPU time (GateState.remember)
LEARN_DOUBLING_S = 0.05  # before the cost is measured, the budget doubles this often
LEARN_MAX_GROWTH = 64  # ... at most this much per period
LEND_WINDOW_S = 0.5  # an active slice that has not waited for budget this long lends what it has not used
LEND_HEADROOM = 1.5  # ... keeping this multiple of its peak use over that window
LEND_MARGIN = 0.05  # ... and at least this much of the GPU above it
BEST_EFFORT_WEIGHT = 0.01  # a slice without a share, against ones with (1-100 %)
BEST_EFFORT_FLOOR = 0.01  # ... which still progresses when every share is taken
MIN_FIT_SHARE = 0.05  # a share smaller than this (best effort) has its cost fitted as if it were this
AFTER_FIT_READINGS = 2  # the readings after a fit ran (partly) on its budgets: no error is integrated
TARGET_MOVED = 0.05  # a slice's target moving this much restarts the watch for drift on its GPU (CostSplit.settle)
OPEN_AT = 0.999  # a target this close to the whole GPU opens the gate
TIERS = ("high", "normal", "low")
TICK_LOG_S = 10.0  # how long the ticks took is summed up in the log this often (debug, tick_log)
# with no slice's process attached there is nothing to measure or refill: the controller waits this
# long between ticks, and ticks at once when a process attaches (wake); 20 ticks a second of nothing
# were most of an idle daemon's CPU
IDLE_WAIT_S = 1.0


@dataclass(frozen=True)
class Share:
    """What a slice is entitled to on one GPU."""

    slice_id: str
    gpu: int  # index within the slice
    uuid: str
    guarantee: float  # 0..1; 0: no guaranteed share (best effort)
    hard: bool
    priority: str


@dataclass
class GateState:
    # tokens right after our last refill, plus what was launched between that tick's count and the
    # refill (the next period's launches)
    after: int | None = None
    counted: int | None = None  # the gate's tokens when this tick counted the launches
    switched: bool = True  # a refill since the last reading opened or closed the gate, or was the first
    unpaired: int = 0  # threads launched since the last reading
    reading_ns: float = 0.0  # the time the last reading covered (the driver's sampling sets it)
    waits: int = 0
    last_hungry: float = -1e9  # when launches last waited for budget (the tick that saw it)
    target: float = 1.0
    opened: bool = True
    credit_ns: float = 0.0
    last_active: float = -1e9
    consumed: int = 0  # threads launched in the last period
    busy: float = 0.0  # fraction of the GPU used in the last reading
    busy_ns: float = 0.0  # GPU time used in the last reading
    window_ns: int = 0  # the time that reading covered
    age_ns: int = 0  # ... and how long before it was read it ended
    used_avg: float = 0.0  # busy, averaged over about a second (for status and metrics)
    history: deque = field(default_factory=deque)  # (GPU ns, threads launched, window ns) per reading
    measured_ns: int = 0  # the time all readings paired so far covered
    recent: deque = field(default_factory=deque)  # busy per reading over LEND_WINDOW_S, while active
    learning: tuple[float, float] | None = None  # while its GPU's costs are fitted (CostSplit.learning)
    quiet: int = 0  # readings left after a fit whose error is not integrated: they ran on its budgets

    # the history's sums, kept as it changes (a tick asks for them several times a slice)
    _busy_ns_sum: float = field(default=0.0, repr=False)
    _threads_sum: int = field(default=0, repr=False)
    _window_ns_sum: int = field(default=0, repr=False)
    _measured: int = field(default=0, repr=False)  # readings with GPU time and threads both
    _since_exact: int = field(default=0, repr=False)  # readings since the GPU time's sum was added up anew

    def ns_per_thread(self, settled: bool = True) -> float | None:
        """GPU time per launched thread: once a few periods have been measured
        (settled), or from whatever has been (not settled)."""
        if self._measured == 0 or (settled and self._measured < RATIO_MIN_PERIODS):
            return None
        return self._busy_ns_sum / max(1, self._threads_sum)

    def remember(self, busy_ns: float, threads: int, window_ns: int) -> None:
        """One reading and the threads launched in the time it covers; about
        RATIO_WINDOW_S of them are kept, and at least RATIO_MIN_PERIODS."""
        self.history.append((busy_ns, threads, window_ns))
        self._add(busy_ns, threads, window_ns, 1)
        self.measured_ns += window_ns
        while len(self.history) > RATIO_MIN_PERIODS and self._window_ns_sum > RATIO_WINDOW_S * 1e9:
            b, t, w = self.history.popleft()
            self._add(b, t, w, -1)
        self._since_exact += 1
        if self._since_exact >= EXACT_EVERY:  # what adding and taking away floats drifted, put right
            self._busy_ns_sum, self._since_exact = math.fsum(b for b, _, _ in self.history), 0

    def _add(self, busy_ns: float, threads: int, window_ns: int, sign: int) -> None:
        self._busy_ns_sum += sign * busy_ns
        self._threads_sum += sign * threads
        self._window_ns_sum += sign * window_ns
        self._measured += sign * (busy_ns > 0 and threads > 0)


def targets(shares: list[Share], active: set[str], needs: dict[str, float] | None = None,
            lend: bool = True) -> dict[str, float]:  # fmt: skip
    """Target fraction of the GPU per slice id, for the slices on one GPU.

    Guarantees first, by priority; the capacity no active slice is guaranteed
    or needs goes to the active elastic slices of the highest priority that has
    any and wants more, split by their shares.  `needs` holds the active
    slices that use well under their guarantee (and have not waited for budget
    lately): what they need; they keep their guarantee as their own target,
    and lend the rest until they need it. `lend` False: no elastic slice gets
    more than its guarantee (a slice's cost is being measured again, and the GPU
    must not be full, CostSplit.refining)."""
    needs = needs or {}
    out: dict[str, float] = {}
    left = 1.0
    for tier in TIERS:
        for s in (s for s in shares if s.priority == tier):
            out[s.slice_id] = min(s.guarantee, max(left, 0.0))
            if s.slice_id in active:
                left -= min(out[s.slice_id], needs.get(s.slice_id, out[s.slice_id]))
    for tier in TIERS if lend else ():
        takers = [
            s for s in shares if s.priority == tier and not s.hard and s.slice_id in active and s.slice_id not in needs
        ]
        if takers and left > 0:
            weight = {s.slice_id: s.guarantee or BEST_EFFORT_WEIGHT for s in takers}
            total = sum(weight.values())
            for s in takers:
                out[s.slice_id] += left * weight[s.slice_id] / total
            left = 0.0
            break
    for s in shares:
        if s.guarantee == 0:
            out[s.slice_id] = max(out[s.slice_id], BEST_EFFORT_FLOOR)
    return out


@dataclass
class TickTimes:
    """How long the controller's ticks took, summed up every TICK_LOG_S: a long
    tick stretches the time between a slice's count and its refill (docs/compute.md)."""

    since: float
    count: int = 0
    total: float = 0.0
    longest: float = 0.0
    late: int = 0  # ticks that ended after the next one was due

    def add(self, took: float, late: bool) -> None:
        self.count += 1
        self.total += took
        self.longest = max(self.longest, took)
        self.late += late

    def summary(self, now: float, now_or_never: bool = False) -> str | None:
        """The line for the time since the last one, once TICK_LOG_S has passed (and starts anew);
        `now_or_never`: whatever has passed (the controller goes idle, and its ticks stop)."""
        if (now - self.since < TICK_LOG_S and not now_or_never) or not self.count:
            return None
        line = (f"{self.count} ticks in {now - self.since:.1f} s: mean {self.total / self.count * 1e3:.2f} ms, "
                f"longest {self.longest * 1e3:.2f} ms, {self.late} late")  # fmt: skip
        self.since, self.count, self.total, self.longest, self.late = now, 0, 0.0, 0.0, 0
        return line


class ComputeController:
    def __init__(
        self,
        files: Callable[[], dict[str, SliceFiles]],
        limits_of: Callable[[str], Sequence[GpuLimit]],  # a slice's limits per GPU, as its files have them
        sampler: Sampler,
        period: float = 0.05,
        clock: Callable[[], float] = time.monotonic,  # seconds; a test drives it by hand
        fit_base: str = FIT_BASES[0],
    ) -> None:
        if fit_base not in FIT_BASES:
            raise ValueError(f"fit_base {fit_base!r}: one of {', '.join(FIT_BASES)}")
        self.fit_base = fit_base
        self.files = files
        self.limits_of = limits_of
        self.sample = sampler
        self.period = period
        self.clock = clock
        self.lend_readings = max(3, round(LEND_WINDOW_S / period))  # readings that span LEND_WINDOW_S
        self.learn_growth = int(min(LEARN_MAX_GROWTH, 2 ** max(1.0, period / LEARN_DOUBLING_S)))
        self.state: dict[tuple[str, int], GateState] = {}
        self.splits: dict[str, CostSplit] = {}  # per GPU UUID, where its driver gives each period to one process
        self.one_per_period: dict[str, bool] = {}  # per GPU UUID: what its driver's readings showed last
        self.fits: dict[tuple[str, str], int] = {}  # (GPU UUID, "join" or "drift"): the fits of costs begun
        self._shares: dict[str, tuple[SliceFiles, int, list[Share]]] = {}  # slice -> its files, generation, shares
        self._stop = threading.Event()
        self._woken = threading.Event()  # a process attached, or stop: the idle wait ends
        self._thread: threading.Thread | None = None
        self._last = clock()

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="compute", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._woken.set()
        if self._thread:
            self._thread.join(timeout=5)

    def wake(self) -> None:
        """A process attached to a slice: tick now if idle (ProcessWatcher.on_watch). Its gate
        is refilled before its first launch can find the budget stale (docs/compute.md)."""
        self._woken.set()

    def _run(self) -> None:
        next_tick = time.monotonic()
        times = TickTimes(next_tick)
        while not self._stop.is_set():
            next_tick += self.period
            began = time.monotonic()
            self._woken.clear()  # an attach from here on ends the idle wait below at once
            busy = True
            try:
                busy = self.tick()
            except Exception:
                log.exception("compute controller tick failed")
            ended = time.monotonic()
            COMPUTE_TICK_SECONDS.observe(ended - began)
            delay = next_tick - ended
            if busy or times.count:  # the ticks that found nothing to do after the last that did are not summed
                times.add(ended - began, delay < 0)
            if line := times.summary(ended, now_or_never=not busy):
                tick_log.debug("%s", line)
            if not busy:
                self._idle()
                next_tick = times.since = time.monotonic()
                continue
            if delay < 0:  # fell behind: start again from now
                next_tick = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def _idle(self) -> None:
        """No slice has a process: wait for one to attach (or IDLE_WAIT_S), then go on as if the
        last tick were a period ago, so that the first budget is one period's, not the wait's."""
        self._woken.wait(IDLE_WAIT_S)
        self._last = self.clock() - self.period

    # -- one period ------------------------------------------------------------------
    def shares(self, files: dict[str, SliceFiles]) -> list[Share]:
        """What each slice with processes is entitled to, per GPU in its files'
        order, from the daemon's records (never decoded back from the files).
        A slice's are read again only once its files' limits have changed (their
        generation: the daemon updates the record first, under the lock
        `limits_of` takes), not every tick."""
        out: list[Share] = []
        known, fresh = self._shares, {}
        for sid, f in files.items():
            generation, k = f.generation(), known.get(sid)
            if k is None or k[0] is not f or k[1] != generation:
                mine = [
                    Share(sid, g, lim.uuid, lim.cores / 100, lim.hard, lim.priority)
                    for g, lim in enumerate(self.limits_of(sid))
                    if lim.cores < 100
                ]  # fmt: skip (a whole GPU is never throttled)
                k = (f, generation, mine)
            fresh[sid] = k
            out.extend(k[2])
        self._shares = fresh
        return out

    def tick(self) -> bool:
        """One period on every GPU; False if no slice has a process (nothing was done)."""
        now = self.clock()
        dt = max(now - self._last, 1e-3)
        self._last = now
        files = self.files()
        by_gpu: dict[str, list[Share]] = {}
        for s in self.shares(files):
            by_gpu.setdefault(s.uuid, []).append(s)
        next_refill = int((now + self.period) * 1e9)  # CLOCK_MONOTONIC, as the interposer reads it
        for uuid, on_gpu in by_gpu.items():
            self._tick_gpu(uuid, on_gpu, files, now, dt, next_refill)
        self._forget(by_gpu)
        return bool(files)

    def _tick_gpu(self, uuid: str, on_gpu: list[Share], files: dict[str, SliceFiles], now: float, dt: float,
                  next_refill: int) -> None:  # fmt: skip
        """One GPU's period: read, split, decide each slice's target and refill its gate."""
        reading = self.sample(uuid)
        for s in on_gpu:
            st = self.state.get((s.slice_id, s.gpu))
            if st is None:  # not setdefault: a GateState a slice a tick, made to be dropped
                st = self.state[(s.slice_id, s.gpu)] = GateState()
            self._read(st, files[s.slice_id], s.gpu, reading)
        self._split(uuid, on_gpu, files, reading, now, dt)
        active = {s.slice_id for s in on_gpu if self._observe(self.state[(s.slice_id, s.gpu)], files[s.slice_id],
                                                                  s.gpu, now)}  # fmt: skip
        goal = self._goals(uuid, on_gpu, active, now)
        known = sorted(r for s in on_gpu if (r := self.state[(s.slice_id, s.gpu)].ns_per_thread()) is not None)
        prior = known[len(known) // 2] if known else None
        base = self._fit_base(uuid, on_gpu, goal)
        for s in on_gpu:
            st = self.state[(s.slice_id, s.gpu)]
            self._budget(files[s.slice_id], s, st, goal[s.slice_id], dt, next_refill, prior, base)

    def _fit_base(self, uuid: str, on_gpu: list[Share], goal: dict[str, float]) -> float | None:
        """What every slice's part is of while its GPU's costs are fitted (FIT_BASES "even": the
        mean target of the slices the fit has); None: each its own target."""
        split = self.splits.get(uuid)
        fit = split.fit if split is not None and self.fit_base == "even" else None
        fitting = [goal[s.slice_id] for s in on_gpu if fit is not None and (s.slice_id, s.gpu) in fit.order]
        return sum(fitting) / len(fitting) if fitting else None

    def _read(self, st: GateState, f: SliceFiles, gpu: int, reading: Reading) -> None:
        """The threads a slice launched since the last refill, and its processes' own samples."""
        self._count(st, int(f.usage.gate[gpu].tokens))
        pids = f.slot_pids().values()
        window = reading.window_of(pids)  # its processes' own time, where each has its own clock
        st.busy_ns = sum(reading.busy_ns.get(pid, 0.0) for pid in pids) if window else 0.0
        st.window_ns, st.age_ns = window, reading.age_of(pids)

    def _observe(self, st: GateState, f: SliceFiles, gpu: int, now: float) -> bool:
        """What a slice used (its reading, as split) and whether it waited for budget: whether it is active."""
        window = st.window_ns
        if window:
            st.busy = st.busy_ns / window
            w = min(1.0, window / 1e9)
            st.used_avg += w * (st.busy - st.used_avg)
        waits = f.gate_waits(gpu)
        hungry = waits > st.waits
        st.waits = waits
        was_active = now - st.last_active < ACTIVE_HOLD_S
        if hungry or st.consumed > 0 or st.busy_ns > 0:
            st.last_active = now
        if hungry:
            st.last_hungry = now
        if now - st.last_active >= ACTIVE_HOLD_S:
            return False
        self._remember_use(st, was_active, window)
        return True

    def _goals(self, uuid: str, on_gpu: list[Share], active: set[str], now: float) -> dict[str, float]:
        """Each slice's target on one GPU (targets); a change large enough restarts the watch for drift."""
        needs = {s.slice_id: n for s in on_gpu if s.slice_id in active and (n := self._needs(s, now)) is not None}
        split = self.splits.get(uuid)
        lend = not (split and split.refining)
        goal = targets(on_gpu, active, needs, lend)
        idle = {s.slice_id for s in on_gpu} - active
        if idle:
            # an idle slice's budget is what it would get if it started now, together with the
            # other idle ones (one pass, not one per idle slice: exact when one is idle, a little
            # less when several are, for the one period until it counts as active)
            started = targets(on_gpu, active | idle, needs, lend)
            for sid in idle:
                goal[sid] = started[sid]
        if split and any(abs(goal[s.slice_id] - self.state[(s.slice_id, s.gpu)].target) > TARGET_MOVED
                         for s in on_gpu):  # fmt: skip
            split.settle()
        return goal

    def _forget(self, by_gpu: dict[str, list[Share]]) -> None:
        """Slices gone, or no longer controlled, and GPUs none of them is on."""
        seen = {(s.slice_id, s.gpu) for on_gpu in by_gpu.values() for s in on_gpu}
        for key in set(self.state) - seen:
            del self.state[key]
        for uuid in set(self.splits) - set(by_gpu):
            del self.splits[uuid]
        for uuid in set(self.one_per_period) - set(by_gpu):
            del self.one_per_period[uuid]

    def _split(self, uuid: str, on_gpu: list[Share], files: dict[str, SliceFiles], reading: Reading, now: float,
               dt: float) -> None:  # fmt: skip
        """Where the driver gives each sample period to one process (Reading.per_process
        False) and several slices launch on this GPU: each one's time is the GPU's,
        split by what each launched (CostSplit), not what NVML put on its processes."""
        keys = [(s.slice_id, s.gpu) for s in on_gpu]
        if reading.window_ns and self.one_per_period.get(uuid) != (not reading.per_process):
            self.one_per_period[uuid] = not reading.per_process
            split_log.debug("%s: each sample period to one process: %s", uuid, not reading.per_process)
        if not self.one_per_period.get(uuid):
            for k in keys:
                self.state[k].learning = None
            return
        split = self.splits.setdefault(uuid, CostSplit())
        split.forget(set(keys))
        launching = [k for k in keys if self.state[k].unpaired > 0 or now - self.state[k].last_active < ACTIVE_HOLD_S]
        # one slice alone: its processes' samples are its own (and a row of a fit, where one runs, or
        # watched for drift, where its cost was fitted)
        if reading.window_ns and (len(launching) > 1 or split.fit is not None or
                                  any(k in split.costs for k in launching)):  # fmt: skip
            pids = {p for s in on_gpu for p in files[s.slice_id].slot_pids().values()}
            total = sum(b for pid, b in reading.busy_ns.items() if pid in pids)
            threads = {k: self.state[k].unpaired - self._later(self.state[k], reading.age_ns, dt) for k in launching}
            shares = {}  # how exactly each cost is fitted: by the share the slice will get,
            for s in on_gpu:  # or, for one that has not waited for budget lately (a light load), what it uses
                st = self.state[(s.slice_id, s.gpu)]
                light = now - st.last_hungry >= HUNGRY_HOLD_S
                shares[(s.slice_id, s.gpu)] = max(
                    MIN_FIT_SHARE, min(s.guarantee, st.used_avg) if light else s.guarantee
                )
            counted = not any(self.state[k].opened or self.state[k].switched for k in launching)
            was_fitting = split.fit is not None
            for k, busy_ns in split.split(total, threads, reading.window_ns, shares, counted).items():
                st = self.state[k]
                st.busy_ns, st.window_ns, st.age_ns = busy_ns, reading.window_ns, reading.age_ns
            if split.fit is not None and not was_fitting:
                why = (uuid, "drift" if split.before is not None else "join")
                self.fits[why] = self.fits.get(why, 0) + 1
                log.info("%s: fitting the costs of %d slices (%s)", uuid, len(launching), why[1])
        for k in keys:
            st = self.state[k]
            learning = split.learning(k)
            if st.learning is not None and learning is None:
                st.quiet = AFTER_FIT_READINGS
            st.learning = learning

    def _remember_use(self, st: GateState, was_active: bool, window_ns: int) -> None:
        if not was_active:  # what it used before it went idle says nothing now
            st.recent.clear()
        st.recent.append(st.busy if window_ns else 0.0)
        while len(st.recent) > self.lend_readings:
            st.recent.popleft()

    def _needs(self, s: Share, now: float) -> float | None:
        """What an active slice needs, when that is well under its guarantee:
        its peak use over LEND_WINDOW_S with headroom, provided it has not
        waited for budget meanwhile.  None: it may want all of its share."""
        st = self.state[(s.slice_id, s.gpu)]
        if now - st.last_hungry < LEND_WINDOW_S or len(st.recent) < self.lend_readings:
            return None
        peak = max(st.recent)
        need = max(peak * LEND_HEADROOM, peak + LEND_MARGIN)
        return need if need < s.guarantee else None

    @staticmethod
    def _count(st: GateState, tokens: int) -> None:
        """Count the threads launched since our last refill (`tokens` is the gate now)."""
        st.counted = tokens
        if st.after is not None:
            st.consumed = max(0, st.after - tokens)
            st.unpaired += st.consumed

    @staticmethod
    def _later(st: GateState, age_ns: int, dt: float) -> int:
        """Of the threads launched this period, those after the newest sample ended
        (`age_ns` before now): they go with the next reading."""
        return int(st.consumed * min(1.0, age_ns / (dt * 1e9)))

    def _pair(self, st: GateState, dt: float) -> None:
        """Pair a new reading with the threads launched in the time it covers (a
        driver may sample less often than we refill)."""
        if st.window_ns:
            later = self._later(st, st.age_ns, dt)
            if not st.switched:
                # the launch queue's lag is a small part of a long reading, and the ratio
                # spans about a second of them
                st.remember(st.busy_ns, st.unpaired - later, st.window_ns)
            st.unpaired, st.switched, st.reading_ns = later, False, float(st.window_ns)

    def _budget(
        self,
        f: SliceFiles,
        s: Share,
        st: GateState,
        target: float,
        dt: float,
        next_refill: int,
        prior: float | None,
        base: float | None = None,
    ) -> None:
        """Refill a slice's gate for the next period, or open it (`base`: _fit_base)."""
        tokens = int(f.usage.gate[s.gpu].tokens)
        self._pair(st, dt)
        split = self.splits.get(s.uuid) if self.one_per_period.get(s.uuid) else None
        # where the GPU's time is split by cost, a slice's fitted cost is its cost
        ratio = (split.costs.get((s.slice_id, s.gpu)) if split else None) or st.ns_per_thread() or prior
        self._integrate(s, st, target, ratio)
        # an elastic slice entitled to the whole GPU, unless its GPU's costs are being fitted
        want_open = target >= OPEN_AT and not s.hard and st.learning is None
        if want_open:
            before, after = f.open_gate(s.gpu, next_refill)
        else:
            cost = split.cost((s.slice_id, s.gpu)) if split and st.learning else None
            threads = self._threads(st, target, dt, ratio or st.ns_per_thread(settled=False), cost, tokens, base)
            before, after = f.refill_gate(s.gpu, threads, 2 * threads, next_refill)
        if log.isEnabledFor(logging.DEBUG):  # its arguments alone were a tenth of a tick's CPU
            log.debug(
                "%s/%d target %.3f busy %.3f credit %.1f ms ratio %s open %s window %.1f used %.3f ms hungry %s "
                "tokens %d", s.slice_id[:8], s.gpu, target, st.busy, st.credit_ns / 1e6, st.ns_per_thread(),
                want_open, st.window_ns / 1e6, st.busy_ns / 1e6, st.last_hungry == self._last, after,
            )  # fmt: skip
        # the period after a first refill or a gate opened or closed ran what was queued before
        # (a whole launch queue, against a trickle of launches while learning): not paired
        st.switched = st.switched or st.after is None or st.opened != want_open
        # what was launched between the count and this refill is the next period's: counted
        # nowhere, a slice that launches steadily (not in a burst after each refill) read a few
        # per cent fewer threads than it ran, and its cost that much higher (a light hard 50 %
        # slice's cost fitted 5-13 % over a saturating one's for the same kernels)
        st.after = after + (st.counted - before if st.counted is not None else 0)
        st.opened = want_open
        st.target = target

    def _integrate(self, s: Share, st: GateState, target: float, ratio: float | None) -> None:
        """The integral of the slice's error (its credit), bounded to CREDIT_S of its target."""
        entitled = st.opened and st.target >= OPEN_AT and not s.hard  # had the whole GPU to itself
        if st.quiet and st.window_ns:
            st.quiet -= 1
            st.credit_ns = 0.0
        elif not entitled and st.after is not None and st.learning is None:
            err = st.target * st.window_ns - st.busy_ns
            if ratio is None or st.measured_ns < RATIO_WINDOW_S * 1e9:
                # still learning its cost: nothing is integrated either way. A hard slice is not
                # paid back a slow start in a burst beyond its share, and the overshoot of the
                # first doublings is not repaid by a dip a second later (each window counts,
                # not only their sum)
                st.credit_ns = 0.0
            elif self._last - st.last_hungry < HUNGRY_HOLD_S:
                # one that waits for budget now and then: its error integrates both ways
                st.credit_ns += err
            else:
                # one under its target by choice (it has not waited lately) banks nothing, but
                # time under its target pays back what it owes: a slice that takes what others
                # leave reads a little over and under by turns, and only the overs would add
                # up to a debt it then repays all at once
                st.credit_ns = min(st.credit_ns + err, max(st.credit_ns, 0.0))
            limit = CREDIT_S * 1e9 * max(target, 0.01)
            st.credit_ns = min(max(st.credit_ns, -limit), limit)
        else:
            st.credit_ns = 0.0

    def _threads(self, st: GateState, target: float, dt: float, ratio: float | None, cost: float | None,
                 tokens: int, base: float | None = None) -> int:  # fmt: skip
        """The threads a slice may launch next period: its target's time over its cost, plus
        KI of its credit per reading (spread over the refills between readings); while its GPU's
        costs are fitted, its part of that (or of `base`) and its boost (CostSplit.learning,
        `cost`); before any cost is known, a doubling of what it launched."""
        if cost and st.learning:
            part, boost = st.learning
            return max(1, int((part * (target if base is None else base) + boost) * dt * 1e9 / cost))
        if ratio is None:
            # nothing measured yet: one launch, then twice what it launched in the last
            # period every LEARN_DOUBLING_S, until NVML sees enough use to measure
            debt = -tokens if tokens < 0 else 0
            return max(1 + debt, self.learn_growth * (st.consumed if not st.opened else 0))
        allowance_ns = max(0.0, target * dt * 1e9 + KI * st.credit_ns * min(1.0, dt * 1e9 / (st.reading_ns or 1)))
        return max(1, int(allowance_ns / ratio))

    def report(self) -> Iterable[tuple[str, int, float, float]]:
        """(slice id, slice GPU, target, used over about a second) for metrics."""
        for (sid, g), st in list(self.state.items()):
            yield sid, g, st.target, st.used_avg

    def fitting(self, slice_id: str, gpu: int) -> bool:
        """Whether its GPU's costs are being fitted (CostSplit): its share is not held yet."""
        st = self.state.get((slice_id, gpu))
        return bool(st and st.learning is not None)

    def view(self, slice_id: str, gpu: int) -> tuple[float, float]:
        """(target, used over about a second) of one slice GPU; (0, 0) where not controlled."""
        st = self.state.get((slice_id, gpu))
        return (st.target, st.used_avg) if st else (0.0, 0.0)
