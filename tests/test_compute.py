"""Compute shares: saturating workloads in separate slices (each its own pid
namespace, behind the interposer's launch gate) on one simulated GPU, with the
daemon's controller setting their budgets.  GPU time is the simulator's exact
per-process accounting, read by each workload (gpuslice-cuda-load)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from gpuslice.paths import native_dir
from tests.conftest import gpu, needs_root
from tests.test_interposer import wrapped_env

pytestmark = needs_root
LOAD = native_dir() / "tools" / "gpuslice-cuda-load"
TOLERANCE = 3.0  # percentage points
WINDOW = 10.0  # seconds
SETTLE = 2.0  # seconds from start before a window opens


class Tenant:
    """One container holding a slice and running gpuslice-cuda-load in it."""

    def __init__(self, node: Node, name: str, annotations: dict[str, str], seconds: float, mix: str, graph: int = 0):
        self.name = name
        self.node = node
        self.box = node.containers()
        node.client.reserve(name, annotations)
        node.client.bind(name, self.box.init_pid)
        argv = [str(LOAD), str(seconds), mix, str(graph)]
        self.started = time.monotonic_ns()
        self.proc = subprocess.Popen(self.box.command(argv), env=node.env, stdout=subprocess.PIPE, text=True)
        self._points: list[tuple[int, int]] | None = None

    def points(self) -> list[tuple[int, int]]:
        """(time ns, GPU ns used so far), every 100 ms."""
        if self._points is None:
            out, _ = self.proc.communicate(timeout=120)
            lines = [json.loads(x) for x in out.splitlines()]
            assert self.proc.returncode == 0 and lines[-1].get("done"), (self.name, lines[-3:])
            self._points = [(x["t"], x["busy"]) for x in lines if "t" in x]
            self.node.client.release(self.name)
        return self._points

    def share(self, start_ns: int, end_ns: int) -> float:
        """Percent of the GPU this tenant used in [start, end) (100 ms grid)."""
        at = dict(self.points())
        a = min((t for t in at if t >= start_ns), default=None)
        b = max((t for t in at if t <= end_ns), default=None)
        assert a is not None and b is not None and b > a, (self.name, start_ns, end_ns)
        return 100.0 * (at[b] - at[a]) / (b - a)


class Node:
    def __init__(self, daemon, containers) -> None:  # type: ignore[no-untyped-def]
        self.d = daemon([gpu("16Gi")])
        self.client = self.d.client()
        self.containers = containers
        self.env = wrapped_env(self.d)
        self.made = 0

    def tenant(self, annotations: dict[str, str], seconds: float, mix: str, graph: int = 0) -> Tenant:
        self.made += 1
        return Tenant(self, f"t{self.made}", annotations, seconds, mix, graph)


@pytest.fixture
def node(daemon, containers):
    n = Node(daemon, containers)
    yield n


def slice_of(cores: int, policy: str = "elastic", priority: str = "normal") -> dict[str, str]:
    return {
        "gpuslice.io/memory": "1Gi",
        "gpuslice.io/cores": str(cores),
        "gpuslice.io/compute-policy": policy,
        "gpuslice.io/priority": priority,
    }


def run_mix(node: Node, cores: list[int], mixes: list[str], policy: str = "hard", graphs: list[int] | None = None,
            priorities: list[str] | None = None) -> list[float]:  # fmt: skip
    seconds = SETTLE + WINDOW + 1.5
    graphs = graphs or [0] * len(cores)
    priorities = priorities or ["normal"] * len(cores)
    tenants = [
        node.tenant(slice_of(c, policy, p), seconds, mix, g)
        for c, mix, g, p in zip(cores, mixes, graphs, priorities, strict=True)
    ]
    start = max(t.started for t in tenants) + int(SETTLE * 1e9)
    shares = [t.share(start, start + int(WINDOW * 1e9)) for t in tenants]
    print("targets", cores, "measured", [round(s, 2) for s in shares])
    return shares


def assert_shares(measured: list[float], cores: list[int]) -> None:
    for got, want in zip(measured, cores, strict=True):
        assert abs(got - want) <= TOLERANCE, (measured, cores)


@pytest.mark.parametrize("policy", ["hard", "elastic"])
def test_two_saturating_slices_get_30_and_70(node, policy):
    cores = [30, 70]
    assert_shares(run_mix(node, cores, ["100", "100"], policy), cores)


def test_four_saturating_slices_get_10_20_30_40(node):
    cores = [10, 20, 30, 40]
    assert_shares(run_mix(node, cores, ["100"] * 4), cores)


def test_kernels_of_10us_and_10ms_keep_the_shares(node):
    cores = [30, 70]
    # one tenant of 10 us kernels against one of 10 ms kernels, then each mixing both
    assert_shares(run_mix(node, cores, ["10", "10000"]), cores)
    assert_shares(run_mix(node, [70, 30], ["10000x1,10x1000", "10x500,10000x2"]), [70, 30])


def test_graph_launches_are_held_to_their_share(node):
    # the 30 % tenant launches graphs of four 100 us kernels, the other plain kernels
    assert_shares(run_mix(node, [30, 70], ["100", "100"], graphs=[4, 0]), [30, 70])


def test_hard_slice_alone_stays_at_its_share(node):
    assert_shares(run_mix(node, [30], ["100"], "hard"), [30])


def test_elastic_slice_borrows_the_idle_gpu_and_gives_it_back(node):
    alone = node.tenant(slice_of(30, "elastic"), SETTLE + 2 + 2 + WINDOW + 1, "100")
    time.sleep(SETTLE + 2)
    other = node.tenant(slice_of(70, "elastic"), 2 + WINDOW + 1, "1000")
    t0 = alone.started + int(SETTLE * 1e9)
    borrowed = alone.share(t0, t0 + 2 * 10**9)
    t2 = other.started + 2 * 10**9
    back = alone.share(t2, t2 + int(WINDOW * 1e9))
    seconds = [round(alone.share(t2 + i * 10**9, t2 + (i + 1) * 10**9), 1) for i in range(int(WINDOW))]
    grid = -(-other.started // 10**8) * 10**8
    first = [round(alone.share(grid + i * 10**8, grid + (i + 1) * 10**8)) for i in range(20)]
    print(f"elastic alone {borrowed:.1f} %, from 2 s after the second tenant {back:.1f} %, per second {seconds},"
          f" per 100 ms after it started {first}")  # fmt: skip
    assert borrowed > 90
    assert abs(back - 30) <= TOLERANCE
    assert abs(other.share(t2, t2 + int(WINDOW * 1e9)) - 70) <= TOLERANCE


def test_high_priority_takes_the_spare_capacity_first(node):
    # two elastic 30 % slices, both saturating: the 40 % no one holds goes to the high one
    assert_shares(run_mix(node, [30, 30], ["100", "100"], "elastic", priorities=["high", "normal"]), [70, 30])


def test_whole_gpu_slice_is_never_throttled(node):
    t = node.tenant({"gpuslice.io/memory": "1Gi", "gpuslice.io/cores": "100"}, SETTLE + 3, "100")
    start = t.started + int(SETTLE * 1e9)
    assert t.share(start, start + 2 * 10**9) > 97
