"""Per-GPU fit of a pod's containers (device_plugin/gpu_fit.py): node states
where the node's totals fit and no single GPU does, and the reverse."""

from __future__ import annotations

import pytest

from gpuslice.device_plugin import gpu_fit
from gpuslice.device_plugin import units as u
from gpuslice.device_plugin.gpu_fit import Take
from gpuslice.device_plugin.node_gpus import GpuFree

pytestmark = pytest.mark.unit

A, B = "GPU-a", "GPU-b"


def test_totals_that_fit_but_no_single_gpu_is_refused_naming_each_gpu():
    free = {A: GpuFree(10, 5, False, 16), B: GpuFree(6, 90, False, 16)}
    why = gpu_fit.place([{u.MEMORY: 8, u.CORES: 50}], free)
    assert why == (
        "container 0 asks 8 memory and 50 cores on one GPU; free: GPU-a has 10 memory and 5 cores; "
        "GPU-b has 6 memory and 90 cores"
    )


def test_containers_are_placed_one_after_another_fullest_first():
    free = {A: GpuFree(16, 100, True, 16), B: GpuFree(8, 100, False, 16)}
    assert gpu_fit.place([{u.MEMORY: 8, u.CORES: 10}, {u.MEMORY: 8}], free) == [Take(B, 8, 10), Take(A, 8, 0)]
    assert isinstance(gpu_fit.place([{u.MEMORY: 8}, {u.MEMORY: 8}, {u.MEMORY: 8}, {u.MEMORY: 1}], free), str)
    assert gpu_fit.place([{u.GPU: 1}], free) == [Take(A, whole=True)]
    assert isinstance(gpu_fit.place([{u.GPU: 2}], free), str)  # B holds a slice
    # a whole GPU placed first leaves no room on it for the next container's slice
    assert isinstance(gpu_fit.place([{u.GPU: 1}, {u.MEMORY: 9}], free), str)


def test_a_container_whose_gpu_policy_is_spread_takes_the_emptiest_gpu_it_fits():
    """gpuslice.io/gpu-policy: spread (HAMi's gpu-scheduler-policy), read from the container's
    environment in the pod's spec as the plugin and the daemon read it: the emptiest GPU that
    fits, where the others of the pod still go fullest first."""
    from gpuslice import request
    from gpuslice.device_plugin.admission import Asks

    spread = request.read_compute(request.gather({}, ["GPUSLICE_GPU_POLICY=spread"])).choice
    assert spread.spread and not spread  # an order, not a constraint: it rules no GPU out
    free = {A: GpuFree(16, 100, True, 16), B: GpuFree(8, 100, False, 16)}
    mine = [Asks("ns/p", "c0", {u.MEMORY: 4}, spread), Asks("ns/p", "c1", {u.MEMORY: 4})]
    assert gpu_fit.place([{u.MEMORY: 4}, {u.MEMORY: 4}], free, mine) == [Take(A, 4, 0), Take(B, 4, 0)]
    assert gpu_fit.place([{u.MEMORY: 4}, {u.MEMORY: 4}], free) == [Take(B, 4, 0), Take(B, 4, 0)]


def test_what_is_taken_comes_off_the_gpu_it_lies_on_and_nowhere_else():
    free = {A: GpuFree(16, 100, True, 16), B: GpuFree(8, 100, False, 16)}
    left = gpu_fit.taken(free, [Take(A, 4, 30), Take("GPU-gone", 8, 8)])
    assert left == {A: GpuFree(12, 70, False, 16), B: free[B]}
    assert gpu_fit.taken(free, [Take(B, whole=True)])[B] == GpuFree(0, 0, False, 16)


def test_binpack_scores_the_fuller_node_higher_and_spread_the_reverse():
    busy = {A: GpuFree(4, 50, False, 16), B: GpuFree(16, 100, True, 16)}
    idle = {A: GpuFree(16, 100, True, 16), B: GpuFree(16, 100, True, 16)}
    pod = [{u.MEMORY: 4}]
    assert gpu_fit.score(pod, busy) > gpu_fit.score(pod, idle)
    assert gpu_fit.score(pod, busy, spread=True) < gpu_fit.score(pod, idle, spread=True)
    assert gpu_fit.score([{u.MEMORY: 20}], busy) == 0
    assert gpu_fit.score(pod, {}) == 0
