"""The controller's choice of targets (allocator/compute.py: targets), alone:
guarantees, hard caps, lending of idle shares, priority, best effort."""

from __future__ import annotations

import pytest

from gpuslice.allocator.compute import BEST_EFFORT_FLOOR, Share, targets


def share(sid: str, cores: int, hard: bool = False, priority: str = "normal") -> Share:
    return Share(sid, 0, "GPU-0", cores / 100, hard, priority)


def test_active_slices_get_their_guarantees_and_elastic_ones_the_unassigned_rest():
    got = targets([share("a", 30), share("b", 20, hard=True)], {"a", "b"})
    assert got == pytest.approx({"a": 0.8, "b": 0.2})


def test_hard_slice_alone_never_exceeds_its_share():
    assert targets([share("a", 30, hard=True)], {"a"}) == pytest.approx({"a": 0.3})


def test_elastic_slice_alone_may_use_the_whole_gpu():
    assert targets([share("a", 30)], {"a"}) == pytest.approx({"a": 1.0})


def test_idle_slices_lend_their_share_and_keep_their_budget():
    got = targets([share("a", 30), share("b", 70)], {"a"})
    assert got == pytest.approx({"a": 1.0, "b": 0.7})  # b's budget stands: it may start any moment
    assert targets([share("a", 30), share("b", 70)], {"a", "b"}) == pytest.approx({"a": 0.3, "b": 0.7})


def test_spare_goes_to_the_highest_priority_then_by_share():
    shares = [share("h1", 10, priority="high"), share("h2", 30, priority="high"), share("n", 20)]
    got = targets(shares, {"h1", "h2", "n"})
    assert got == pytest.approx({"h1": 0.1 + 0.4 * 0.25, "h2": 0.3 + 0.4 * 0.75, "n": 0.2})


def test_guarantees_go_by_priority_when_they_cannot_all_be_met():
    shares = [share("low", 60, priority="low"), share("high", 60, priority="high")]
    got = targets(shares, {"low", "high"})
    assert got["high"] == pytest.approx(0.6) and got["low"] == pytest.approx(0.4)


def test_best_effort_slices_share_what_is_left_and_always_progress():
    got = targets([share("be", 0), share("a", 50, hard=True)], {"be", "a"})
    assert got == pytest.approx({"be": 0.5, "a": 0.5})
    full = targets([share("be", 0), share("a", 100 - 1, hard=True)], {"be", "a"})
    assert full["be"] >= BEST_EFFORT_FLOOR


def test_a_slice_using_well_under_its_share_lends_the_rest_and_keeps_its_target():
    shares = [share("light", 50, hard=True), share("busy", 30)]
    got = targets(shares, {"light", "busy"}, needs={"light": 0.15})
    assert got == pytest.approx({"light": 0.5, "busy": 0.85})  # 30 + 20 unassigned + 35 lent
    assert targets(shares, {"light", "busy"}) == pytest.approx({"light": 0.5, "busy": 0.5})  # it needs it all


def test_lent_capacity_goes_only_to_elastic_slices_that_want_more():
    shares = [share("light", 50), share("busy", 30), share("capped", 20, hard=True)]
    got = targets(shares, {"light", "busy", "capped"}, needs={"light": 0.1})
    assert got == pytest.approx({"light": 0.5, "busy": 0.7, "capped": 0.2})


def test_while_a_cost_is_measured_again_no_elastic_slice_gets_more_than_its_guarantee():
    """CostSplit.refining: the GPU must not be full, so nothing is lent or spare is shared."""
    shares = [share("light", 50, hard=True), share("busy", 30), share("be", 0)]
    got = targets(shares, {"light", "busy", "be"}, lend=False)
    assert got == pytest.approx({"light": 0.5, "busy": 0.3, "be": BEST_EFFORT_FLOOR})
    assert targets(shares, {"light", "busy", "be"})["busy"] > 0.45  # the spare, shared with best effort
