"""CostSplit: a GPU's time split among slices by threads x cost, where the
driver gives each sample period to one process (allocator/cost_split.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.fit_noise import Noise, fit_off
from gpuslice.allocator.cost_split import (
    DRIFT_HOLD_NS,
    FIT_BLOCK,
    FIT_EXTRA,
    FIT_SKIP,
    LEARN_BOOST,
    LEARN_DITHER,
    LEARN_SCALE,
    REFINE_MAX,
    REFINE_ROWS,
    REFINE_SKIP,
    CostSplit,
    _unsure,
    least_squares,
    robust_fit,
    share_points,
)
from gpuslice.allocator.utilization import Sample, Spans

pytestmark = pytest.mark.unit

A, B, C = ("a", 0), ("b", 0), ("c", 0)
WINDOW = 200_000_000  # ns: the H100's sample period
H200_CALL3 = Path(__file__).parents[1] / "data" / "real-gpu" / "h200-2026-11-27" / "daemon-call3.log"


def known(costs: dict) -> CostSplit:
    split = CostSplit()
    split.costs.update(costs)
    return split


def test_a_reading_is_split_by_threads_times_cost_and_adds_up_to_the_gpu():
    got = known({A: 1.0, B: 3.0}).split(200.0, {A: 100, B: 100}, WINDOW)
    assert got[A] == pytest.approx(50.0) and got[B] == pytest.approx(150.0)
    # a cost off by the same factor for every slice changes nothing
    assert known({A: 2.0, B: 6.0}).split(200.0, {A: 100, B: 100}, WINDOW) == pytest.approx(got)


def test_a_slice_that_launched_nothing_gets_nothing():
    got = known({A: 1.0, B: 1.0}).split(100.0, {A: 0, B: 50}, WINDOW)
    assert got == {A: 0.0, B: pytest.approx(100.0)}


def budgets(split: CostSplit, share: dict, cost: dict) -> dict:
    """Threads each slice launches in a reading while a fit runs, as the controller budgets them."""
    out = {}
    for k, s in share.items():
        part, boost = split.learning(k) or (1.0, 0.0)
        out[k] = round((part * s + boost) * WINDOW / cost[k])
    return out


def test_costs_are_fitted_together_from_readings_in_which_one_slice_at_a_time_launches_more():
    """Three slices start together with true costs 1, 4 and 2.5 ns a thread and the
    GPU's time in each reading the sum (in integer percent). While the fit runs each
    gets LEARN_SCALE of its share and one at a time LEARN_BOOST more, for FIT_BLOCK
    readings each; their first reading (launches running ahead of the GPU) and the
    first of each boost are no rows. The fit ends once no cost's error moves a share
    by more than a quarter of a point, and the GPU's time at their shares is then
    split within half a point of them."""
    true = {A: 1.0, B: 4.0, C: 2.5}
    share = {A: 0.2, B: 0.3, C: 0.5}
    split = CostSplit()
    threads = {k: round(s * WINDOW / 3.0) for k, s in share.items()}  # a first guess: the GPU's cost
    for i in range(40):
        total = round(100 * sum(true[k] * t for k, t in threads.items()) / WINDOW) / 100 * WINDOW
        got = split.split(total if i >= FIT_SKIP else total * 0.5, threads, WINDOW, share)
        assert sum(got.values()) == pytest.approx(total if i >= FIT_SKIP else total * 0.5)
        if split.fit is None:
            break
        assert split.learning(A) is not None
        threads = budgets(split, share, {k: split.cost(k) or 3.0 for k in share})
    assert split.fit is None and i >= FIT_SKIP + 2 * len(true) + FIT_EXTRA - 1
    assert split.costs == pytest.approx(true, rel=0.03)
    assert split.learning(A) is None
    at_shares = {k: round(s * WINDOW / true[k]) for k, s in share.items()}
    got = split.split(WINDOW, at_shares, WINDOW, share)
    assert {k: 100 * v / WINDOW for k, v in got.items()} == pytest.approx(
        {k: 100 * s for k, s in share.items()}, abs=0.5
    )


def test_a_slice_boosted_in_one_row_that_read_high_is_not_fitted_from_it_alone():
    """Four slices of one kernel at hard 10 / 20 / 30 / 40 (a fresh clone's CI): the
    fourth's first boost read 4 % more than was launched, a transient. A cost fixed by
    that one row leaves it no residual, so the fit saw no error and ended with it 4 %
    high (38.5 % of 40); a fit of few slices waits for a second boost of each."""
    D = ("d", 0)
    share = {A: 0.1, B: 0.2, C: 0.3, D: 0.4}
    split = CostSplit()
    threads = {k: round(s * WINDOW / 1.0) for k, s in share.items()}
    high = 0  # readings of D's first boost
    for _ in range(120):
        total = float(sum(threads.values()))  # the kernel costs 1 ns a thread in every slice
        boost = split.fit is not None and (split.learning(D) or (0, 0))[1] > 0
        if boost and high < FIT_BLOCK:
            high += 1
            total *= 1.04
        split.split(total, threads, WINDOW, share)
        if split.fit is None:
            break
        threads = budgets(split, share, {k: 1.0 for k in share})
    assert split.fit is None and high == FIT_BLOCK
    assert split.costs[D] / split.costs[A] == pytest.approx(1.0, abs=0.01)


CI_ROWS = Path(__file__).parents[1] / "data" / "sim-ci" / "f1c2829-fit-rows.txt"


def test_the_rows_that_put_a_slice_s_cost_9_percent_off_on_a_ci_run_now_fit_it_with_the_others():
    """The 16 rows of a fresh clone's CI at f1c2829 (10/20/30/40, one kernel in every
    slice): the 20 % slice's first boost read 11 % high. Its pull on the first fit made
    its three other boosted rows look off, all four were left out together, and its cost
    came out 8.8 % over the others' (18.65 % of 20). Left out one at a time, the high
    row goes and the other three stay."""
    keys = [A, B, C, ("d", 0)]
    line = next(t for t in CI_ROWS.read_text().splitlines() if not t.startswith("#"))
    rows = [
        (float(ms) * 1e6, dict(zip(keys, map(int, threads.split(",")), strict=True)))
        for ms, threads in (tok.split(":") for tok in line.split())
    ]
    fitted = robust_fit(rows, keys, 2 * WINDOW)
    assert fitted is not None
    (costs, _), used = fitted
    errors = fitted[0].errors
    assert used == len(rows) - 1
    mean = sum(costs.values()) / len(costs)
    assert all(c / mean == pytest.approx(1.0, abs=0.005) for c in costs.values()), costs
    assert max(errors.values()) < 0.005


@pytest.mark.parametrize("high", [1.11, 1.3])
def test_a_boost_that_reads_high_once_leaves_its_slice_s_cost_with_the_others(high: float):
    """Four slices of one kernel at hard 10 / 20 / 30 / 40, each reading in integer
    percent plus 2 ms the costs do not explain (the CI's rows had about that): the 20 %
    slice's first boost reads `high` times what was launched (a queue filling). The
    fit ends on its precision, not at FIT_ROWS rows with that slice's cost unsure (it
    did, ±4 %: the CI's fit claimed ±3.0 % and was 8.8 % off)."""
    share = {A: 0.1, B: 0.2, C: 0.3, ("d", 0): 0.4}
    split = CostSplit()
    threads = {k: round(s * WINDOW) for k, s in share.items()}
    first = 0  # readings of B's first boost
    for _ in range(200):
        total = float(sum(threads.values())) + 1e6  # the kernel costs 1 ns a thread in every slice
        if split.fit is not None and (split.learning(B) or (0, 0))[1] > 0 and first < FIT_BLOCK:
            first += 1
            total *= high
        split.split(round(100 * total / WINDOW) / 100 * WINDOW, threads, WINDOW, share)
        if split.fit is None:
            break
        threads = budgets(split, share, {k: 1.0 for k in share})
    assert split.fit is None and first == FIT_BLOCK
    mean = sum(split.costs.values()) / len(split.costs)
    assert split.costs[B] / mean == pytest.approx(1.0, abs=0.005), split.costs
    assert max(split.errors.values()) < 0.01, split.errors


def test_readings_that_read_high_at_random_leave_four_slices_within_half_a_point_nine_fits_in_ten():
    """300 fits of 10/20/30/40, 4 % of the readings 3-15 % high (`./dev.sh bench
    fit-noise` runs this and other noises). Left out all at once, the rows far off the
    first fit took rows that were right with them (a boost's two rows: the one off
    pulls the fit and the other looks off), or were all kept where too many looked
    off: 26 fits more than a point off, the 90th percentile 0.83 points, the worst
    4.41. Left out one at a time, never a slice's last two boosted rows: 13, 0.46, 2.81."""
    off = sorted(fit_off(seed, (0.1, 0.2, 0.3, 0.4), Noise(late=0.0, high=0.04))[0] for seed in range(300))
    assert off[270] <= 0.6 and sum(o > 1 for o in off) <= 20, off[260:]


def test_eight_slices_each_boosted_twice_hold_within_a_point_on_noisy_readings():
    """300 fits of eight 12.5 % slices, 4 % of the readings 3-15 % high. With one boosted
    row each (up to 2026-11-29 past four slices: their shares are small, so a cost's
    error moves them less), 59 fits ended over a point off, the 90th percentile 1.19
    points: a row's error is not seen where it alone sets a cost. Each slice boosted in
    two rows (20 rows kept, not 16): 8, and 0.71, the fit 58 readings long (11.6 s at
    200 ms) against 36."""
    runs = [fit_off(seed, (0.125,) * 8, Noise(late=0.0, high=0.04)) for seed in range(300)]
    off = sorted(o for o, _ in runs)
    assert off[270] <= 0.9 and sum(o > 1 for o in off) <= 20, off[260:]
    assert max(n for _, n in runs) <= 80


def test_while_a_fit_runs_the_gpu_is_not_full_and_each_slice_gets_its_boost_in_turn():
    split = CostSplit()
    split.split(100.0, {A: 10, B: 10}, WINDOW)
    turns = []
    for _ in range(6):
        turns.append((split.learning(A), split.learning(B)))
        split.split(100.0, {A: 10, B: 10}, WINDOW)
    # each block's scale is its own (LEARN_DITHER), the same for every slice in it
    assert all(a[0] == b[0] and LEARN_SCALE * (1 - LEARN_DITHER) <= a[0] <= LEARN_SCALE for a, b in turns)
    assert len({a[0] for a, _ in turns}) > 1
    assert {(a[1], b[1]) for a, b in turns} == {(LEARN_BOOST, 0.0), (0.0, LEARN_BOOST), (0.0, 0.0)}
    assert LEARN_SCALE + LEARN_BOOST < 0.9  # headroom: what the GPU does is then what was launched


def test_a_light_slices_cost_takes_no_repeated_rounding_error():
    """A light slice (a steady 6-14 % of the GPU, whatever its budget) beside a
    saturating one (50-90 %), both of one kernel, the GPU's time in integer percent.
    The light slice's threads are the same in every row, so its cost is what the rows
    leave over at none of the other's threads: every error common to the rows lands on
    it, divided by its small use. With the same budgets in every block, a steady
    reading rounded the same way every time was such an error: up to 8.7 % off here
    (on the simulator 2.8-9.3 % high, and a hard 50 % slice that had lent what its
    10 % load left got 47.5 % once it saturated). Each block's budgets now differ."""
    errors = []
    for i in range(100):
        light, share = 0.06 + 0.08 * (i * 0.618034 % 1), 0.5 + 0.4 * (i * 0.754878 % 1)
        split = CostSplit()
        for _ in range(300):
            part, boost = split.learning(B) or (1.0, 0.0)
            threads = {A: round(light * WINDOW), B: round((part * share + boost) * WINDOW / (split.cost(B) or 1.0))}
            total = round(100 * sum(threads.values()) / WINDOW) / 100 * WINDOW  # 1 ns a thread, in integer percent
            split.split(total, threads, WINDOW, {A: light, B: share})
            if split.fit is None and A in split.costs:
                break
        errors.append(abs(split.costs[A] - 1.0))
    errors.sort()
    assert errors[90] <= 0.035 and errors[-1] <= 0.05, errors[85:]


def test_a_full_gpu_is_no_row_and_scales_the_shares_down():
    split = CostSplit()
    for _ in range(FIT_SKIP + FIT_BLOCK + 1):
        split.split(0.99 * WINDOW, {A: 10, B: 10}, WINDOW)
    assert split.fit is not None and not split.fit.rows and split.learning(A)[0] < LEARN_SCALE


def test_rows_that_do_not_tell_the_slices_apart_give_no_fit():
    rows = [(300.0, {A: 100, B: 100})] * 5
    assert least_squares(rows, [A, B]) is None
    fitted = least_squares([(300.0, {A: 100, B: 100}), (500.0, {A: 100, B: 200}), (400.0, {A: 200, B: 100})],
                           [A, B])  # fmt: skip
    assert fitted is not None
    costs, errors = fitted.costs, fitted.errors
    assert costs == pytest.approx({A: 1.0, B: 2.0}) and max(errors.values()) < 1e-6


def test_a_share_s_error_is_what_the_costs_ratio_leaves_unsure():
    """The split moves a share only by the costs' ratios, and costs fitted together have
    correlated errors: rows as a two-slice fit's (one of none boosted, one each), each
    reading 2 ms off at random, fitted 400 times. share_points' figure for the 30 % share
    is the spread the fits really give it; each cost's own error times s (1 - s), the stop
    rule's until stop 69, says about half (the H200's rows: 0.19-0.25 against 0.40)."""
    import random
    import statistics

    design = [(12, 28), (52, 28), (12, 68)] * 3  # millions of threads a row, as the H200's fits had
    shares = {A: 0.3, B: 0.7}
    got, said, alone = [], [], []
    for seed in range(400):
        rnd = random.Random(seed)
        rows = [(4.0 * (a + b) * 1e6 + rnd.gauss(0, 2e6), {A: a * 1_000_000, B: b * 1_000_000}) for a, b in design]
        fitted = least_squares(rows, [A, B])
        assert fitted is not None
        got.append(100 * 0.3 * fitted.costs[A] / (0.3 * fitted.costs[A] + 0.7 * fitted.costs[B]))
        said.append(share_points(fitted.cov, shares)[A])
        alone.append(100 * 0.21 * max(fitted.errors.values()))
    spread, figure = statistics.stdev(got), statistics.median(said)
    assert figure == pytest.approx(spread, rel=0.15), (figure, spread)
    assert statistics.median(alone) < 0.75 * spread, (statistics.median(alone), spread)
    assert share_points(fitted.cov, shares)[B] == pytest.approx(said[-1])  # two slices: one ratio, one error
    # a fit of the H200's rows (call 3's last: 16 rows, two matmul tenants at 30 / 70)
    line = next(ln for ln in H200_CALL3.read_text().splitlines()[::-1] if "fit rows" in ln)
    rows = [(float(ms) * 1e6, dict(zip([A, B], map(int, t.split(",")), strict=True)))
            for ms, t in (tok.split(":") for tok in line.split("threads): ")[1].split())]  # fmt: skip
    h200 = least_squares(rows, [A, B])
    assert h200 is not None and len(rows) == 16
    assert h200.cov[A][B] / (h200.errors[A] * h200.errors[B]) == pytest.approx(-0.6, abs=0.05)
    assert share_points(h200.cov, {A: 0.3, B: 0.7})[A] == pytest.approx(0.40, abs=0.02)
    assert 100 * 0.21 * max(h200.errors.values()) < 0.27
    # a cost taken to be unknown (its slice's only boosted row the furthest off) leaves the shares unknown
    unknown = _unsure(h200, A, float("inf"))
    assert share_points(unknown.cov, {A: 0.3, B: 0.7}) == {A: float("inf"), B: float("inf")}
    wider = _unsure(h200, A, 2 * h200.errors[A])  # twice as unsure, correlated as before
    assert share_points(wider.cov, {A: 0.3, B: 0.7})[A] > share_points(h200.cov, {A: 0.3, B: 0.7})[A]


def test_a_new_slice_starts_a_fit_of_all_and_one_gone_is_forgotten():
    split = known({A: 1.0, B: 1.0})
    split.split(100.0, {A: 10, B: 10, C: 10}, WINDOW)
    assert split.fit is not None and split.fit.order == [A, B, C]
    split.forget({A, C})
    assert set(split.costs) == {A} and split.fit.order == [A, C]
    split.forget(set())
    assert split.fit is None and not split.costs


def test_a_slice_gone_mid_fit_takes_its_rows_and_their_boosts_with_it():
    """Rows that had a slice gone leave the fit, each with the record of whose boost it was."""
    split = CostSplit()
    share = {A: 0.3, B: 0.3, C: 0.4}
    threads = {k: round(s * WINDOW) for k, s in share.items()}
    while split.fit is None or len(split.fit.rows) < 4:
        split.split(float(sum(threads.values())), threads, WINDOW, share)
        threads = budgets(split, share, {k: 1.0 for k in share})
    f = split.fit
    assert set(list(f.whose)[:4]) == {A, B, C, None}  # each boost in turn, and none
    f.rows.append((1.0, {A: 1, C: 1}))  # a row of A and C alone, whose boost was C's
    f.whose.append(C)
    split.forget({A, C})
    assert list(f.rows) == [(1.0, {A: 1, C: 1})] and list(f.whose) == [C]


def test_a_process_that_runs_every_other_period_is_not_taken_for_a_clock_of_its_own():
    """Two tenants alike on a driver that gives each 200 ms period to one process:
    A, B, A, B... Each one's own samples are 400 ms apart, the other's 200 ms
    away: on one grid, not interleaved clocks (which turned the split off)."""
    spans = Spans()
    for k in range(1, 9):
        spans.covered([Sample(1 if k % 2 else 2, k * 200_000, 99)], (k - 1) * 200_000)
    assert spans.period_us == 400_000 and spans.grid_us == 200_000
    assert not spans.interleaved and not spans.shared


def test_spans_tell_a_driver_that_samples_processes_together_from_one_that_gives_a_period_to_one():
    one = Spans()
    one.covered([Sample(1, 200_000, 90)], 0)
    one.covered([Sample(2, 400_000, 95)], 200_000)
    assert not one.shared and not one.interleaved
    both = Spans()
    both.covered([Sample(1, 200_000, 40), Sample(2, 200_000, 55)], 0)
    assert both.shared


def run(split: CostSplit, true: dict, share: dict, seconds: float, scale=lambda i: 1.0) -> int:
    """Readings of slices launching at their shares (the fit's budgets while one runs),
    the GPU's time from the `true` costs times `scale(reading)`; the fits begun."""
    began = 0
    for i in range(round(seconds * 1e9 / WINDOW)):
        threads = budgets(split, share, {k: split.cost(k) or 3.0 for k in share})
        total = min(WINDOW, scale(i) * sum(true[k] * t for k, t in threads.items()))
        fitting = split.fit is not None
        split.split(total, threads, WINDOW, share)
        began += not fitting and split.fit is not None
    return began


def test_costs_that_change_are_fitted_again_and_a_steady_load_is_not():
    true, share = {A: 1.0, B: 4.0}, {A: 0.3, B: 0.6}
    split = CostSplit()
    assert run(split, true, share, 60.0) == 1 and split.costs == pytest.approx(true, rel=0.03)
    true[A] = 0.5  # A's kernels got shorter: the GPU does less than its launches at the fitted costs
    assert run(split, true, share, 10.0) == 1 and split.fit is None
    assert split.costs == pytest.approx(true, rel=0.03) and split.hold_ns == DRIFT_HOLD_NS


def test_a_load_that_reads_off_its_fit_by_turns_is_fitted_again_ever_less_often():
    """What the GPU did swings by 20 % every 3 s for every slice alike (its clocks, say), the
    costs' ratios stay: each fit for drift finds the costs it had, all scaled alike, and doubles
    the time before the next one may begin."""
    true, share = {A: 1.0, B: 4.0}, {A: 0.3, B: 0.6}
    split = CostSplit()
    run(split, true, share, 10.0)
    fits = run(split, true, share, 150.0, lambda i: 1.0 if (i // 15) % 2 else 0.8)
    assert split.hold_ns >= 4 * DRIFT_HOLD_NS and 2 <= fits <= 4


def light_then_saturating(i: int, guarantees: tuple[float, float]) -> tuple[float, float, CostSplit, list[bool]]:
    """Light slice A (a steady 6-14 % of the GPU, hard guarantees[0]) beside B (elastic
    guarantees[1], borrowing the rest), one kernel (1 ns a thread), integer percent. Once
    the costs are fitted, A saturates: it claims its guarantee, B gets the rest, or only
    its guarantee while A's cost is measured again. A's cost's error after the fit and
    after the rise, and whether each reading after the rise was one of the refine's."""
    light = 0.06 + 0.08 * (i * 0.618034 % 1)
    ga, gb = guarantees
    split = CostSplit()
    queued = [0]  # ns launched and not yet run: a full reading's excess runs in the next

    def reading(a: int, b: int, shares: dict) -> None:
        ran = min(queued[0] + a + b, WINDOW)
        queued[0] += a + b - ran
        split.split(round(100 * ran / WINDOW) / 100 * WINDOW, {A: a, B: b}, WINDOW, shares)

    for _ in range(300):
        part, boost = split.learning(B) or (1.0, 0.0)
        borrowed = (part * gb + boost) if split.fit else 1 - light
        reading(round(light * WINDOW), round(borrowed * WINDOW / (split.cost(B) or 1.0)), {A: light, B: gb})
        if split.fit is None and A in split.costs:
            break
    fitted = split.costs[A] - 1.0
    held = []
    b_share = 1 - light  # the first reading after the rise: B's budget set while A lent (the GPU over-full)
    for _ in range(20):  # A saturates: its budget is its guarantee at its fitted cost
        held.append(split.refining)
        reading(round(ga * WINDOW / split.costs[A]), round(b_share * WINDOW / split.costs[B]), {A: ga, B: gb})
        b_share = gb if split.refining else 1 - ga
    return fitted, split.costs[A] - 1.0, split, held


def test_a_light_slice_that_saturates_has_its_cost_measured_again_at_its_share():
    """A light slice's cost, fitted only as exactly as its light use needs, lands 2-5 %
    off (on the simulator the lending test's hard 50 % slice 3.0 % off in root mean
    square, 5.6 % in one run: it got 47.3 % once it saturated). When it claims its
    guarantee, the elastic slice beside it is held to its own for a few readings, the
    GPU is not full, and what the GPU did less the other's cost is the light slice's.
    The reading after a full one runs what that one queued: counted, it put the cost
    5.7 % high on the simulator (here, without the backlog left out: 4.2 % at the 90th
    percentile, 12.4 % at worst)."""
    before, after = [], []
    for i in range(100):
        fitted, refined, split, held = light_then_saturating(i, (0.5, 0.3))
        before.append(abs(fitted))
        after.append(abs(refined))
        assert held[0] is False and any(held) and not held[-1], held  # lending held only while measuring
        assert sum(held) <= REFINE_SKIP + 4 + REFINE_ROWS, held  # the over-full GPU drains in a few readings
        assert split.fitted_for[A] == 0.5
    before.sort()
    after.sort()
    assert before[90] > 0.02  # what the fit alone leaves
    assert after[90] <= 0.012 and after[-1] <= 0.02, after[85:]


def test_where_the_guarantees_fill_the_gpu_the_cost_is_kept_and_not_measured_again_and_again():
    fitted, refined, split, held = light_then_saturating(3, (0.6, 0.4))
    assert refined == fitted and sum(held) == REFINE_MAX - 1 and not held[-1]  # the first reading began it
    assert split.fitted_for[A] == 0.6
