"""Splitting a GPU's measured time among the slices that shared it, by what
each launched (docs/compute.md, "What the driver reports").

An H100 with driver 580 gives each per-process sample period to one process:
one sample, the whole GPU's use over the period, to the process that ran most
in it (tests/data/real-gpu/h100-2026-11-26/trace.json). While two slices
time-slice, NVML's per-process figures then say what the GPU as a whole did,
never who did it: read per process, the busier tenant was charged with
everything and the other with nothing, and hard 30 / 70 got 6.6 / 27.1 %.

What the daemon does know per slice is what it launched: the threads its gate
let through in the time each reading covers. A slice's GPU time is its
threads times its cost per thread, and a reading's time is the sum over the
slices: one equation per reading, the costs its unknowns. They are fitted
together, by least squares over readings in which the slices launched in
different proportions: while a fit runs, each slice gets part of its share
(LEARN_SCALE), so the GPU is not full and what it did is what was launched,
and in turn one slice at a time gets LEARN_BOOST of the GPU more. The costs
are measured while the slices share the GPU, as they will run, and none waits
for another's to be known. A reading is then split in proportion to
threads x cost, so the slices' figures always add up to what the GPU did: a
cost off by the same factor for every slice changes nothing. A slice's cost is
fitted only as exactly as the share it used then needs; when it claims more
(a lender that saturates), that cost alone is measured again (Refine)."""

from __future__ import annotations

import logging
import math
import statistics
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import NamedTuple

log = logging.getLogger(__name__)

Key = tuple[str, int]  # (slice id, GPU index within the slice)
Row = tuple[float, dict[Key, int]]  # a reading's GPU ns, and the threads each slice launched in it

FIT_BLOCK = 3  # readings a boost lasts: the first is no row (its budgets changed in it), the other two one
FIT_SKIP = 1  # a slice's first reading in a fit is no row: its launches run ahead of the GPU
FIT_EXTRA = 2  # a fit is tried once it has this many rows more than the slices it fits, each boosted in one
FIT_ROWS = 16  # ... over at most this many of the latest, or as many as FIT_BOOSTS turns of all take
# ... and, in a fit of at most FIT_FEW slices, each boosted in FIT_BOOSTS rows: a slice's cost set by
# one boosted row leaves that row no residual, so its error goes unseen (a fresh clone's CI fitted
# the fourth of four slices of one kernel 4 % high from its one boosted row, claimed within 0.4 %:
# 38.5 % of hard 40). Eight slices' small shares are moved less by a cost's error, but not little
# enough: with one boosted row each, 48-82 of 300 fits of eight slices on noisy readings ended over
# a point off (`./dev.sh bench fit-noise`), with two 9-32, for 11.6 s of fitting against 7.7 s.
FIT_BOOSTS = 2
FIT_FEW = 8
# ... and ends once every slice's share's standard error is at most this many points (share_points:
# from the costs' covariance; each cost's error alone, as until stop 69, said 0.19-0.25 where the
# H200's rows gave 0.40, their errors correlated at -0.6)
FIT_POINTS = 0.25
OUTLIER = 4  # a row off the fit by this many times the median row's error (and more than
OUTLIER_FLOOR = 0.01  # this part of the period) is left out (a row's rounding is within half of it)
UNSEEN = 0.005  # of the period: a driver's integer percent rounds less than this down to nothing
SATURATED = 0.97  # a reading at least this busy shows only that the GPU was full: not a row
LEARN_SCALE = 0.4  # while a fit runs, each slice gets this part of its share ...
LEARN_BOOST = 0.4  # ... and, one at a time in turn, this much more of the GPU
LEARN_BACKOFF = 0.7  # a full GPU (costs off) scales the shares down by this, to at most
LEARN_MIN_SCALE = 0.1
# ... and each block's budgets (the scale and the boost) by 1 - LEARN_DITHER x a number in [0, 1) that
# differs from block to block. A driver's integer percent rounds a steady reading the same way every
# time: with the same budgets in every block, that is one error repeated in every row, which no number
# of rows averages out, and a light slice's cost (its threads the same in every row) takes all of it,
# divided by its small use: fitted 2.8-9.3 % high on the simulator, a hard 50 % slice that lent what
# its 10 % load left got 47.5 % once it saturated (tests/unit/test_cost_split.py: up to 8.7 % off).
LEARN_DITHER = 0.5
GOLDEN = 0.6180339887498949  # block x this, mod 1: evenly spread, never repeating
# after a fit: what the GPU did, against the launches times the fitted costs, over DRIFT_WINDOW_NS
# stretches; off from the first ones by more than DRIFT of the time in DRIFT_STRIKES stretches in a row,
# the same way, the costs are fitted again (a tenant whose kernels grew or shrank: the split would
# go on charging it at the old cost). One stretch off is a transient: a queue filling as a load rises.
# A steady load on an H200 read up to 4 % of the time off its baseline beyond its slack, drifting by
# 0.75 % a second and stepping back (tests/data/real-gpu/h200-2026-11-27: the selftest's workers; at
# 3 % both its runs fitted again and found the costs they had). 6 % is half as much again: a change of
# a tenant's kernels moves it by its share times the change (at 30 %, kernels 20 % longer: +6 %).
DRIFT = 0.06
DRIFT_WINDOW_NS = 1_000_000_000
DRIFT_STRIKES = 2
DRIFT_BASELINE = 2  # stretches that make the baseline (a load may read unlike its fit, steadily), ...
DRIFT_SETTLE_NS = 1_000_000_000  # ... after this much time: the first readings after a fit still settle
DRIFT_HOLD_NS = 10_000_000_000  # a fit for drift after one for drift: at least this much watched time on, ...
DRIFT_HOLD_MAX_NS = 320_000_000_000  # ... doubled, up to this, by each one that found the costs
DRIFT_SAME = 0.1  # ... it had (each within this, all scaled alike: only the costs' ratios split the
# GPU; a GPU whose clocks moved scales them all): a load that reads unlike its fit, not a change
DRIFT_SIGMAS = 2  # a stretch is off only by more than its launches' costs' standard errors allow, this many times
# A light slice's cost is fitted only as exactly as its light use needs, and its threads are the same
# in every row: what the rows leave over lands on it (3.0 % off in root mean square over 13 runs of the
# lending test's hard 50 % slice at a 10 % load, 5.6 % in one; once it saturated it got 47.3 % and its
# 1 s windows were not back within 3 points of its share for 4 s). When a slice claims REFINE_RISE
# times the share its cost was fitted for, its cost alone is measured again at that share: the
# elastic slices are held to their guarantees (no lending, CostSplit.refining) so the GPU is not full,
# and the reading's time less what the others' fitted costs say they ran is its own, over REFINE_ROWS
# readings after REFINE_SKIP (the lent capacity's queue still running); none of it throttles the slice.
REFINE_RISE = 2.0
REFINE_SKIP = 1
REFINE_ROWS = 3
REFINE_MAX = 10  # readings: a GPU its guarantees fill gives no row; the cost stays as fitted


@dataclass
class Fit:
    """Costs being fitted: the slices in the order their boost comes, and the readings."""

    order: list[Key] = field(default_factory=list)
    skip: dict[Key, int] = field(default_factory=dict)
    rows: deque[Row] = field(default_factory=deque)
    readings: int = 0  # since it began
    phases: list[int] = field(default_factory=list)  # the phase of the budgets set after each reading
    scale: float = LEARN_SCALE
    estimate: dict[Key, float] = field(default_factory=dict)  # the latest fit
    pending: tuple[int, Row] | None = None  # the first reading of a boost's two, and its phase
    boosted: dict[Key, int] = field(default_factory=dict)  # rows each slice had its boost in, since the fit began
    whose: deque[Key | None] = field(default_factory=deque)  # each kept row's boosted slice (None: no one's)
    backlog: int = 0  # readings left that ran what a full one queued
    elapsed_ns: int = 0  # the readings' time since it began
    full: int = 0  # readings that filled the GPU

    def phase(self) -> int:
        """Whose boost it is (len(order): no one's), for FIT_BLOCK readings each."""
        return (self.readings // FIT_BLOCK) % (len(self.order) + 1)


@dataclass
class Drift:
    """What the GPU did since a fit, against what its costs say it did."""

    settled_ns: int = 0  # watched so far, while the readings after the fit settle
    offs: list[float] = field(default_factory=list)  # (GPU time - predicted) / time: the baseline's stretches
    strikes: int = 0  # stretches in a row off the baseline, the same way (its sign)
    total_ns: float = 0.0
    predicted_ns: float = 0.0
    slack_ns: float = 0.0  # what the costs' standard errors allow the prediction to be off
    window_ns: int = 0
    watched_ns: int = 0  # since the fit

    @property
    def baseline(self) -> float | None:
        return sum(self.offs) / len(self.offs) if len(self.offs) >= DRIFT_BASELINE else None


@dataclass
class Refine:
    """One slice's cost measured again at the share it now claims (REFINE_RISE)."""

    key: Key
    share: float
    readings: int = 0
    backlog: bool = False  # the last reading was full
    own_ns: list[float] = field(default_factory=list)  # per row: the reading's time less the others' costed
    threads: list[int] = field(default_factory=list)  # ... and the slice's threads in it
    others_err_ns: float = 0.0  # over its rows: the others' costs' standard errors, in ns


@dataclass
class CostSplit:
    """One GPU's slices: their cost per launched thread, and the split of each reading."""

    costs: dict[Key, float] = field(default_factory=dict)  # ns of GPU time per thread
    fallback: float | None = None  # the GPU's time per thread launched, over the latest reading
    fit: Fit | None = None
    seen: set[Key] = field(default_factory=set)  # slices that launched in a reading before
    drift: Drift = field(default_factory=Drift)
    hold_ns: int = DRIFT_HOLD_NS
    after_drift: bool = False  # the last fit was one for drift
    errors: dict[Key, float] = field(default_factory=dict)  # each fitted cost's relative standard error
    before: dict[Key, float] | None = None  # the costs a fit for drift began with
    fitted_for: dict[Key, float] = field(default_factory=dict)  # the share each cost was fitted as exactly as
    refine: Refine | None = None

    @property
    def refining(self) -> bool:
        """A slice's cost is being measured again: the GPU is to be kept from full (no lending)."""
        return self.refine is not None

    def split(self, total_ns: float, threads: dict[Key, int], window_ns: int,
              shares: dict[Key, float] | None = None, counted: bool = True) -> dict[Key, float]:  # fmt: skip
        """Each slice's share of `total_ns`, the GPU time of a reading covering
        `window_ns` in which the slices launched `threads`; `shares`: the part of
        the GPU each is to get, which sets how exactly its cost is fitted;
        `counted`: every launch in the reading went through a gate that counts
        (none open, none just opened or closed), so drift is watched."""
        out: dict[Key, float] = dict.fromkeys(threads, 0.0)
        launched = {k: t for k, t in threads.items() if t > 0}
        if launched and all(
            k in self.seen for k in launched
        ):  # a slice's first reading ran what it launched before it was counted
            # launches too few for the driver to see (under 1 %, rounded down): each cost at most this
            self.fallback = max(total_ns, UNSEEN * window_ns) / sum(launched.values())
        self.seen |= set(launched)
        if self.fit is None and len(launched) > 1 and any(k not in self.costs for k in launched):
            self.fit = Fit()
        if self.fit is not None:
            self.refine = None  # a fit of all measures it too
            self._learn(self.fit, total_ns, launched, window_ns, shares or {})
        elif self.refine is not None or self._rose(shares or {}, launched):
            self._refine(total_ns, launched, window_ns, counted)
        elif counted and launched and window_ns and all(k in self.costs for k in launched):
            self._watch(total_ns, launched, window_ns)
        weight = {k: t * (self.cost(k) or 1.0) for k, t in launched.items()}  # nothing known: by threads
        whole = sum(weight.values())
        if whole > 0:
            out.update({k: total_ns * w / whole for k, w in weight.items()})
        if log.isEnabledFor(logging.DEBUG):  # the line is built only for a daemon that logs it
            self._log(total_ns, threads, out)
        return out

    def cost(self, k: Key) -> float | None:
        """The best cost there is of a slice: measured, fitted so far, or the GPU's."""
        if self.fit is not None and k in self.fit.estimate:
            return self.fit.estimate[k]
        return self.costs.get(k) or self.fallback

    def learning(self, k: Key) -> tuple[float, float] | None:
        """While a fit runs on this GPU: (part of its share, GPU fraction more) for
        slice k's budget this reading; None: its share as it is."""
        f = self.fit
        if f is None:
            return None
        p = f.phase()
        # a GPU that filled up scales the boost down with the shares: a boosted slice whose cost
        # is not known yet may launch more than the GPU holds, and no reading of its boost would count
        boost = LEARN_BOOST if f.scale == LEARN_SCALE else LEARN_BOOST * f.scale / LEARN_SCALE
        dither = 1 - LEARN_DITHER * (f.readings // FIT_BLOCK * GOLDEN % 1)
        return f.scale * dither, boost if p < len(f.order) and f.order[p] == k else 0.0

    def forget(self, keep: set[Key]) -> None:
        """Slices gone from the GPU."""
        if set(self.costs) - keep:
            self.drift = Drift()  # the stretch it is watched against had them
        for k in set(self.costs) - keep:
            del self.costs[k]
            self.errors.pop(k, None)
        self.seen &= keep
        for k in set(self.fitted_for) - keep:
            del self.fitted_for[k]
        if self.refine is not None and self.refine.key not in keep:
            self.refine = None
        f = self.fit
        if f is not None and not set(f.order) <= keep:
            f.order = [k for k in f.order if k in keep]
            f.skip = {k: n for k, n in f.skip.items() if k in keep}
            f.estimate = {k: c for k, c in f.estimate.items() if k in keep}
            rows = [(r, w) for r, w in zip(f.rows, f.whose, strict=True) if set(r[1]) <= keep]
            f.rows = deque(r for r, _ in rows)
            f.whose = deque(w for _, w in rows)
            f.boosted = {k: n for k, n in f.boosted.items() if k in keep}
            f.pending = None
            if not f.order:
                self.fit = None

    def _learn(self, f: Fit, total_ns: float, launched: dict[Key, int], window_ns: int,
               shares: dict[Key, float]) -> None:  # fmt: skip
        if self._row(f, total_ns, launched, window_ns):
            self._try_fit(f, window_ns, shares)

    def _row(self, f: Fit, total_ns: float, launched: dict[Key, int], window_ns: int) -> bool:
        """One reading into the fit: a row once two readings of one boost agree in phase (True)."""
        for k in launched:
            if k not in f.order:
                f.order.append(k)
                f.skip[k] = FIT_SKIP
        ramp = any(f.skip.get(k, 0) > 0 for k in launched)
        for k in launched:
            f.skip[k] = max(0, f.skip.get(k, 0) - 1)
        # a reading ran on the budgets set after the one before it, and on those set before that
        # for the first part: a row only where both were the same phase, so that what its
        # launches left to the next reading is what the one before left to it
        mixed = len(f.phases) < 2 or f.phases[-1] != f.phases[-2]
        ran = f.phases[-1] if f.phases else -1  # the phase of the budgets it ran on
        f.readings += 1
        f.elapsed_ns += window_ns
        f.phases = [*f.phases[-1:], f.phase()]
        full = bool(window_ns) and total_ns >= SATURATED * window_ns
        if ramp or mixed or not launched or not window_ns or full or f.backlog:
            f.pending = None
            f.backlog = max(0, f.backlog - 1)
            f.full += full
            if full and not (ramp or mixed):
                self._full(f, ran)
            return False
        if f.pending is None or f.pending[0] != ran:
            f.pending = (ran, (total_ns, dict(launched)))
            return False
        # the two readings of a boost as one row: a launch paired with the wrong one of them (a kernel
        # that ran across the edge, a tick late) is then in the row all the same
        first = f.pending[1]
        f.rows.append(
            (first[0] + total_ns, {k: first[1].get(k, 0) + launched.get(k, 0) for k in {*first[1], *launched}})
        )
        f.pending = None
        f.whose.append(f.order[ran] if ran < len(f.order) else None)
        while len(f.rows) > rows_kept(len(f.order)):
            f.rows.popleft()
            f.whose.popleft()
        if ran < len(f.order):
            f.boosted[f.order[ran]] = f.boosted.get(f.order[ran], 0) + 1
        return True

    def _try_fit(self, f: Fit, window_ns: int, shares: dict[Key, float]) -> None:
        """Fit the costs once there are rows enough and each slice had its boosts; keep them once
        they are exact enough for the shares they set, or the rows are all there will be."""
        keys = [k for k in f.order if any(k in r[1] for r in f.rows)]
        boosts = boosts_needed(len(keys))
        if len(f.rows) < len(keys) + FIT_EXTRA or any(f.boosted.get(k, 0) < boosts for k in keys):
            return
        fitted = robust_fit(list(f.rows), keys, 2 * window_ns, list(f.whose), boosts)
        if fitted is None:
            return
        found, used = fitted
        f.estimate, errors = found.costs, found.errors
        # a standard error from few rows is itself uncertain: with 2 degrees of freedom one fit in
        # ten claims a third of its real error or less (a fresh clone's CI fitted two slices of one
        # kernel 21 % apart over 4 rows, each claimed within 1.1 %: 26.2 / 73.6 % of hard 30 / 70)
        wide = student_t(used - len(keys))
        moves = share_points(found.cov, {k: shares.get(k, 0.5) for k in keys})
        if wide * max(moves.values()) <= FIT_POINTS or len(f.rows) >= rows_kept(len(f.order)):  # all _row keeps
            self._fitted(f.estimate, errors)
            self.fitted_for.update({k: max(shares.get(k, 0.5), 1e-3) for k in f.estimate})
            if log.isEnabledFor(logging.DEBUG):  # the rows are joined only for a daemon that logs them
                log.debug("fit rows (ms: threads): %s", " ".join(
                    f"{r[0] / 1e6:.2f}:" + ",".join(str(r[1].get(k, 0)) for k in keys) for r in f.rows))  # fmt: skip
            # what an operator (and a failed test) reads to see how long fitting took and why
            log.info("costs fitted over %d of %d rows, %d readings (%d full) in %.1f s: %s; shares ±%.2f points",
                     used, len(f.rows), f.readings, f.full, f.elapsed_ns / 1e9, " ".join(
                         f"{k[0][:8]}/{k[1]} {c:.4g} ±{errors[k]:.1%}" for k, c in f.estimate.items()),
                     wide * max(moves.values()))  # fmt: skip

    def settle(self) -> None:
        """The slices' targets on this GPU moved (a load rose, one went idle, a share came
        back): the readings while queues and credits follow are not held against the costs."""
        self.drift = Drift(offs=self.drift.offs, watched_ns=self.drift.watched_ns)  # the baseline kept

    def _fitted(self, estimate: dict[Key, float], errors: dict[Key, float]) -> None:
        if self.before is not None:  # a fit for drift: did it find other costs?
            same = _same(self.before, estimate)
            self.hold_ns = min(DRIFT_HOLD_MAX_NS, 2 * self.hold_ns) if same else DRIFT_HOLD_NS
            self.before = None
            self.after_drift = True
        else:
            self.after_drift = False
        self.costs.update(estimate)
        self.errors.update(errors)
        self.fit = None
        self.drift = Drift()

    def _watch(self, total_ns: float, launched: dict[Key, int], window_ns: int) -> None:
        """After a fit: fit again once what the GPU does drifts off what its costs say."""
        d = self.drift
        if d.settled_ns < DRIFT_SETTLE_NS:
            d.settled_ns += window_ns
            return
        d.total_ns += total_ns
        d.predicted_ns += sum(t * self.costs[k] for k, t in launched.items())
        d.slack_ns += DRIFT_SIGMAS * sum(t * self.costs[k] * self.errors.get(k, 0.0) for k, t in launched.items())
        d.window_ns += window_ns
        d.watched_ns += window_ns
        if d.window_ns < DRIFT_WINDOW_NS:
            return
        off = (d.total_ns - d.predicted_ns) / d.window_ns
        more = d.total_ns / d.predicted_ns if d.predicted_ns > 0 else 1.0
        slack = d.slack_ns / d.window_ns
        d.total_ns = d.predicted_ns = d.slack_ns = 0.0
        d.window_ns = 0
        baseline = d.baseline
        if baseline is None:
            d.offs.append(off)
            return
        # a light slice's cost is fitted only as exactly as its light use needed: once it runs
        # more, its error shows, and is no drift
        allowed = DRIFT + slack
        way = (off > baseline + allowed) - (off < baseline - allowed)
        d.strikes = d.strikes + way if way and (d.strikes > 0) == (way > 0) else way
        held = self.after_drift and d.watched_ns < self.hold_ns
        if abs(d.strikes) >= DRIFT_STRIKES and not held:
            log.info("costs drifted: the GPU did %+.1f%% of the time against the costs (%+.1f%% after the fit)",
                      100 * off, 100 * baseline)  # fmt: skip
            self.before = dict(self.costs)
            # where the GPU did more than the costs say, every cost starts that much higher (at
            # least): whichever rose, the fit's first budgets then do not fill the GPU
            self.fit = Fit(estimate={k: c * max(1.0, more) for k, c in self.costs.items()})

    def _rose(self, shares: dict[Key, float], launched: dict[Key, int]) -> bool:
        """Whether a slice now claims REFINE_RISE times the share its cost was fitted for
        (beside others: alone, its cost splits nothing); if so, its refine begins."""
        if len(launched) < 2 or not all(k in self.costs for k in launched):
            return False
        for k in launched:
            if (was := self.fitted_for.get(k)) is not None and shares.get(k, 0.0) >= REFINE_RISE * was:
                self.refine = Refine(k, shares[k])
                log.info("%s/%d claims %.0f %% of the GPU, its cost fitted for %.0f %%: measuring it again",
                         k[0][:8], k[1], 100 * shares[k], 100 * was)  # fmt: skip
                return True
        return False

    def _refine(self, total_ns: float, launched: dict[Key, int], window_ns: int, counted: bool) -> None:
        """A reading of the refine: the slice's own time is what the others' costs leave over."""
        r = self.refine
        assert r is not None
        r.readings += 1
        mine = launched.get(r.key, 0)
        full = not window_ns or total_ns >= SATURATED * window_ns
        backlog, r.backlog = r.backlog, full  # after a full reading, the next ran what that one queued
        # every slice launching has a cost: a new one began a fit, which ended the refine (split)
        if r.readings > REFINE_SKIP and counted and mine > 0 and not full and not backlog:
            others = {k: t for k, t in launched.items() if k != r.key}
            r.own_ns.append(total_ns - sum(t * self.costs[k] for k, t in others.items()))
            r.others_err_ns += sum(t * self.costs[k] * self.errors.get(k, 0.0) for k, t in others.items())
            r.threads.append(mine)
        if len(r.own_ns) >= REFINE_ROWS:
            self._refined(r)
        elif r.readings >= REFINE_MAX:
            log.info("%s/%d: no reading left the GPU room to measure its cost again; kept", r.key[0][:8], r.key[1])
            self.fitted_for[r.key] = r.share  # not tried again until it claims more still
            self.refine = None

    def _refined(self, r: Refine) -> None:
        old = self.costs[r.key]
        own = sum(r.own_ns)
        self.refine = None
        self.fitted_for[r.key] = r.share
        if own <= 0:
            return
        cost = own / sum(r.threads)
        ratios = [o / t / cost for o, t in zip(r.own_ns, r.threads, strict=True)]
        spread = statistics.stdev(ratios) / len(ratios) ** 0.5
        # the others' costs' errors, in proportion to their time against its own, land on it whole
        carried = r.others_err_ns / own
        self.costs[r.key] = cost
        self.errors[r.key] = (spread**2 + carried**2) ** 0.5
        self.drift = Drift()  # what the GPU does is watched against the new cost
        log.info("%s/%d cost measured again at %.0f %%: %.4g ±%.1f%% (was %.4g, %+.1f%%)", r.key[0][:8], r.key[1],
                 100 * r.share, cost, 100 * self.errors[r.key], old, 100 * (cost / old - 1))  # fmt: skip

    @staticmethod
    def _full(f: Fit, ran: int) -> None:
        """A reading that filled the GPU: the shares and boosts scale down, what did not
        fit queued and runs in the next reading (no row), and the same boost comes again."""
        if f.scale <= LEARN_MIN_SCALE:
            return
        f.scale = max(LEARN_MIN_SCALE, f.scale * LEARN_BACKOFF)
        f.backlog = 1
        if ran >= 0:
            block, turns = f.readings // FIT_BLOCK, len(f.order) + 1
            f.readings = (block - (block - ran) % turns) * FIT_BLOCK
            f.phases[-1] = f.phase()

    def _log(self, total_ns: float, threads: dict[Key, int], out: dict[Key, float]) -> None:
        log.debug("split %.1f ms: %s", total_ns / 1e6, " ".join(
            f"{k[0][:8]}/{k[1]} threads {t} cost {self.cost(k) or 0.0:.4g}{' fitting' if self.fit else ''}"
            f" {out[k] / 1e6:.1f} ms" for k, t in threads.items()))  # fmt: skip


def boosts_needed(slices: int) -> int:
    """The boosted rows a fit needs of each of this many slices."""
    return FIT_BOOSTS if slices <= FIT_FEW else 1


def rows_kept(slices: int) -> int:
    """The latest rows a fit of this many slices is over: FIT_ROWS, or the turns of all its
    boosts need (each turn a row a slice and one of none), and FIT_EXTRA more."""
    return max(FIT_ROWS, boosts_needed(slices) * (slices + 1) + FIT_EXTRA)


def _same(before: dict[Key, float], after: dict[Key, float]) -> bool:
    """Whether a fit found the costs it had, all scaled alike (the split is the same)."""
    ratios = [c / before[k] for k, c in after.items() if before.get(k, 0) > 0]
    if not ratios:
        return False
    scale = statistics.median(ratios)
    return all(abs(r / scale - 1) <= DRIFT_SAME for r in ratios)


# Student's t at one standard error's coverage (84.1 %), by degrees of freedom: how much wider a
# standard error estimated from that few residuals must be taken to hold as often as a known one
STUDENT_T = {1: 1.837, 2: 1.321, 3: 1.197, 4: 1.142, 5: 1.111, 6: 1.091, 7: 1.077, 8: 1.067, 9: 1.059, 10: 1.053}


def student_t(dof: int) -> float:
    return STUDENT_T.get(dof, 1.0 if dof > 10 else float("inf"))


class Costs(NamedTuple):
    costs: dict[Key, float]
    cov: dict[Key, dict[Key, float]]  # their covariance, relative to them

    @property
    def errors(self) -> dict[Key, float]:
        """Each cost's standard error relative to it."""
        return {k: self.cov[k][k] ** 0.5 for k in self.costs}


def robust_fit(rows: list[Row], keys: list[Key], window_ns: int,
               whose: list[Key | None] | None = None, boosts: int = 0) -> tuple[Costs, int] | None:  # fmt: skip
    """least_squares over the rows, less those far off the fit: a reading whose
    threads were paired with the wrong one (a tick late on a busy node) is off by
    a part of a period, and the one after by as much the other way; a boost's
    first row may read high (a queue filling). They are left out one at a time,
    the furthest first, each after a fit without the one before: one row far off
    pulls its slice's cost with it, and the rows that are right then look off too
    (a fresh clone's CI at f1c2829: the 20 % slice's first boost read 11 % high,
    all four of its boosted rows were left out at once, and its cost came out
    8.8 % over the others' for the same kernels). `whose[i]`: the slice boosted
    in row i; none is left with fewer than `boosts` of its boosted rows (its cost
    set by one row leaves that row no residual: whichever of its two rows is off,
    the fit splits the difference, and the right one may look the further off),
    and where that row is the furthest off, its slice's cost is taken to be as
    unsure as the row is off, so the fit waits for its next boost."""
    # a driver's integer percent rounds each reading by up to half a percent of it: the rows'
    # error is at least that, however well a few rows happen to agree (two of a row's readings)
    floor = 2 * (0.01 * window_ns / 2) ** 2 / 12
    kept = list(range(len(rows)))
    fitted = least_squares(rows, keys, floor)
    if fitted is None:
        return None
    boosted = Counter(whose or ())
    while len(kept) > 2 * len(keys) + FIT_EXTRA:
        off = {i: abs(rows[i][0] - sum(fitted.costs[k] * rows[i][1].get(k, 0) for k in keys)) for i in kept}
        limit = max(OUTLIER * sorted(off.values())[len(off) // 2], OUTLIER_FLOOR * window_ns)
        worst = max(kept, key=off.__getitem__)
        slice_ = whose[worst] if whose and whose[worst] in fitted.costs else None
        if off[worst] <= limit:
            break
        if slice_ is not None and boosted[slice_] <= boosts:
            # its cost is as unsure as that row is off: the fit goes on to its next boost
            part = fitted.costs[slice_] * rows[worst][1].get(slice_, 0)
            fitted = _unsure(fitted, slice_, off[worst] / part if part > 0 else float("inf"))
            break
        fewer = least_squares([rows[i] for i in kept if i != worst], keys, floor)
        if fewer is None:  # the row was all that told two slices apart
            break
        fitted = fewer
        kept.remove(worst)
        if slice_ is not None:
            boosted[slice_] -= 1
    if min(fitted.costs.values()) <= 0:
        return None
    return fitted, len(kept)


def _unsure(fitted: Costs, k: Key, error: float) -> Costs:
    """The fit with k's cost taken to be at least `error` unsure (relative), its
    correlations with the others kept."""
    was = fitted.cov[k][k] ** 0.5
    if error <= was:
        return fitted
    if not math.isfinite(error):  # unknown: its variance infinite, its covariances none (no inf - inf)
        cov = {i: {j: (float("inf") if i == j else 0.0) if k in (i, j) else v for j, v in row.items()}
               for i, row in fitted.cov.items()}  # fmt: skip
    else:
        r = error / was
        cov = {i: {j: v * (r if i == k else 1.0) * (r if j == k else 1.0) for j, v in row.items()}
               for i, row in fitted.cov.items()}  # fmt: skip
    return Costs(fitted.costs, cov)


def share_points(cov: dict[Key, dict[Key, float]], shares: dict[Key, float]) -> dict[Key, float]:
    """Each slice's share's standard error, in points, from the costs' relative covariance.
    A reading is split in proportion to threads x cost, so slice k is charged its part of
    the time off by d_k - sum_j w_j d_j, each d a cost's relative error and w_j slice j's
    part of the slices' time (their shares'): only the costs' ratios move a share. Fitted
    together, the costs' errors are correlated: on the H200's rows of two matmul tenants
    at -0.6 (a row tells their weighted sum better than their difference), so their
    ratio was 1.6 times as unsure as either cost alone said."""
    total = sum(shares.values())
    if total <= 0:
        return dict.fromkeys(shares, 0.0)
    w = {k: s / total for k, s in shares.items()}
    out = {}
    for k, s in shares.items():
        a = {j: float(j == k) - w[j] for j in shares}
        var = sum(a[i] * a[j] * cov[i][j] for i in shares for j in shares if a[i] and a[j])
        out[k] = float("inf") if math.isnan(var) else 100 * s * math.sqrt(max(var, 0.0))  # nan: inf - inf
    return out


def least_squares(rows: list[Row], keys: list[Key], floor: float = 0.0) -> Costs | None:
    """The costs c that best fit total = sum(threads[k] * c[k]) over the rows, and
    each one's standard error relative to it (from the residuals, or where they
    say less, the rows' known variance `floor`); None where the rows cannot tell
    the slices apart."""
    n = len(keys)
    # columns scaled to their mean, so that the normal equations are well conditioned
    scale = [sum(r[1].get(k, 0) for r in rows) / len(rows) or 1.0 for k in keys]
    xs = [[threads.get(k, 0) / s for k, s in zip(keys, scale, strict=True)] for _, threads in rows]
    # [X'X | I | X'y], reduced to [I | (X'X)^-1 | c]
    a = [[sum(x[i] * x[j] for x in xs) for j in range(n)] + [float(i == j) for j in range(n)]
         + [sum(x[i] * r[0] for x, r in zip(xs, rows, strict=True))] for i in range(n)]  # fmt: skip
    biggest = max(a[i][i] for i in range(n))
    for col in range(n):  # Gauss-Jordan with partial pivoting
        p = max(range(col, n), key=lambda i: abs(a[i][col]))
        if abs(a[p][col]) <= 1e-3 * biggest:  # rows that vary too little to tell these slices apart
            return None
        a[col], a[p] = a[p], a[col]
        a[col] = [v / a[col][col] for v in a[col]]
        for i in range(n):
            if i != col:
                m = a[i][col]
                a[i] = [v - m * w for v, w in zip(a[i], a[col], strict=True)]
    c = [a[i][2 * n] for i in range(n)]
    free = len(rows) - n
    ssr = sum((r[0] - sum(ci * xi for ci, xi in zip(c, x, strict=True))) ** 2 for x, r in zip(xs, rows, strict=True))
    var = max(ssr / free, floor) if free > 0 else float("inf")
    costs = {k: c[i] / scale[i] for i, k in enumerate(keys)}
    # the costs' covariance relative to them: (X'X)^-1 var / (c_i c_j), the columns' scales cancelling
    cov = {k: {j: var * a[i][n + m] / (c[i] * c[m]) if c[i] and c[m] else float("inf") if i == m else 0.0
               for m, j in enumerate(keys)} for i, k in enumerate(keys)}  # fmt: skip
    return Costs(costs, cov)
