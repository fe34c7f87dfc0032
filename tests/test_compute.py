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


def run_mix(node: Node, cores: list[int], mixes: list[str], policy: str = "hard") -> list[float]:
    seconds = SETTLE + WINDOW + 1.5
    tenants = [
        Tenant(node, f"t{i}", slice_of(c, policy), seconds, mix) for i, (c, mix) in enumerate(zip(cores, mixes))
    ]
    start = max(t.started for t in tenants) + int(SETTLE * 1e9)
    shares = [t.share(start, start + int(WINDOW * 1e9)) for t in tenants]
    print("targets", cores, "measured", [round(s, 2) for s in shares])
    return shares


def assert_shares(measured: list[float], cores: list[int]) -> None:
    for got, want in zip(measured, cores):
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
