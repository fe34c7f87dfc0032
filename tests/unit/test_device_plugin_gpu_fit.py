"""Per-GPU fit of a pod's containers (device_plugin/gpu_fit.py): node states
where the node's totals fit and no single GPU does, and the reverse."""

from __future__ import annotations

from gpuslice.device_plugin import gpu_fit
from gpuslice.device_plugin import units as u

A, B = "GPU-a", "GPU-b"


def test_totals_that_fit_but_no_single_gpu_is_refused_naming_each_gpu():
    free = {A: {"memory": 10, "cores": 5, "whole": 0}, B: {"memory": 6, "cores": 90, "whole": 0}}
    why = gpu_fit.place([{u.MEMORY: 8, u.CORES: 50}], free)
    assert why == ("container 0 asks 8 memory and 50 cores on one GPU; free: GPU-a has 10 memory and 5 cores; "
                   "GPU-b has 6 memory and 90 cores")  # fmt: skip


def test_containers_are_placed_one_after_another_fullest_first():
    free = {A: {"memory": 16, "cores": 100, "whole": 1}, B: {"memory": 8, "cores": 100, "whole": 0}}
    assert gpu_fit.place([{u.MEMORY: 8, u.CORES: 10}, {u.MEMORY: 8}], free) == {"0": B, "1": A}
    assert isinstance(gpu_fit.place([{u.MEMORY: 8}, {u.MEMORY: 8}, {u.MEMORY: 8}, {u.MEMORY: 1}], free), str)
    assert gpu_fit.place([{u.GPU: 1}], free) == {"0": A}
    assert isinstance(gpu_fit.place([{u.GPU: 2}], free), str)  # B holds a slice


def test_binpack_scores_the_fuller_node_higher_and_spread_the_reverse():
    totals = {"memory": 32}
    busy = {A: {"memory": 4, "cores": 50, "whole": 0}, B: {"memory": 16, "cores": 100, "whole": 1}}
    idle = {A: {"memory": 16, "cores": 100, "whole": 1}, B: {"memory": 16, "cores": 100, "whole": 1}}
    pod = [{u.MEMORY: 4}]
    assert gpu_fit.score(pod, busy, totals) > gpu_fit.score(pod, idle, totals)
    assert gpu_fit.score(pod, busy, totals, spread=True) < gpu_fit.score(pod, idle, totals, spread=True)
    assert gpu_fit.score([{u.MEMORY: 20}], busy, totals) == 0
