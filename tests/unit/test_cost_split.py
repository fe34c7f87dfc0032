"""CostSplit: a GPU's time split among slices by threads x cost, where the
driver gives each sample period to one process (allocator/cost_split.py)."""

from __future__ import annotations

import pytest

from gpuslice.allocator.cost_split import JOIN_READINGS, JOIN_SKIP, CostSplit
from gpuslice.allocator.utilization import Sample, Spans

pytestmark = pytest.mark.unit

A, B, C = ("a", 0), ("b", 0), ("c", 0)


def test_a_reading_is_split_by_threads_times_cost_and_adds_up_to_the_gpu():
    split = CostSplit()
    got = split.split(200.0, {A: 100, B: 100}, {A: 1.0, B: 3.0})
    assert got[A] == pytest.approx(50.0) and got[B] == pytest.approx(150.0)
    # a cost off by the same factor for every slice changes nothing
    assert CostSplit().split(200.0, {A: 100, B: 100}, {A: 2.0, B: 6.0}) == pytest.approx(got)


def test_a_slice_that_launched_nothing_gets_nothing():
    got = CostSplit().split(100.0, {A: 0, B: 50}, {A: 1.0, B: 1.0})
    assert got == {A: 0.0, B: pytest.approx(100.0)}


def test_a_joining_slice_is_measured_as_the_gpu_less_the_known_ones():
    """A known at 1 ns a thread; B joins with a true cost of 4: its first readings
    (its launches run ahead of the GPU) are not measured, then its cost is what
    the GPU did beyond A's."""
    split = CostSplit()
    true = {A: 1.0, B: 4.0}
    for i in range(JOIN_SKIP + JOIN_READINGS):
        threads = {A: 60, B: 10 + i}
        total = sum(true[k] * t for k, t in threads.items())
        got = split.split(total if i >= JOIN_SKIP else total * 0.5, threads, {A: 1.0})
        assert sum(got.values()) == pytest.approx(total if i >= JOIN_SKIP else total * 0.5)
    assert split.costs[B] == pytest.approx(4.0)
    got = split.split(100.0, {A: 60, B: 10}, {})
    assert got[A] == pytest.approx(60.0) and got[B] == pytest.approx(40.0)


def test_before_its_cost_is_known_a_new_slice_gets_what_the_known_ones_did_not_use():
    split = CostSplit()
    got = split.split(100.0, {A: 30, B: 5}, {A: 1.0})
    assert got[A] == pytest.approx(30.0) and got[B] == pytest.approx(70.0)


def test_slices_gone_are_forgotten():
    split = CostSplit()
    split.split(100.0, {A: 10, B: 10, C: 10}, {A: 1.0, B: 1.0, C: 1.0})
    split.forget({A})
    assert set(split.costs) == {A}


def test_spans_tell_a_driver_that_samples_processes_together_from_one_that_gives_a_period_to_one():
    one = Spans()
    one.covered([Sample(1, 200_000, 90)], 0)
    one.covered([Sample(2, 400_000, 95)], 200_000)
    assert not one.shared and not one.interleaved
    both = Spans()
    both.covered([Sample(1, 200_000, 40), Sample(2, 200_000, 55)], 0)
    assert both.shared
