"""Compute shares: saturating workloads in separate slices (each its own pid
namespace, behind the interposer's launch gate) on one simulated GPU, with the
daemon's controller setting their budgets.  GPU time is the simulator's exact
per-process accounting, read by each workload (gpuslice-cuda-load).  The
scenarios are ./dev.sh bench compute-shares' own."""

from __future__ import annotations

import signal
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.compute_shares import (
    MIXES,
    NS,
    SETTINGS,
    SETTLE,
    Mix,
    Tenant,
    measure_mix,
    run_drift,
    run_handover,
    run_lending,
    run_setting_gpu,
    slice_of,
)
from gpuslice.allocator.cost_split import DRIFT_STRIKES, DRIFT_WINDOW_NS
from gpuslice.allocator.slice_files import SliceFiles
from gpuslice.cli import sim_daemon
from tests.harness import interposer_env
from tests.harness.machine import Agent, gpu, needs_root

pytestmark = [needs_root, pytest.mark.measure]  # shares measured over seconds of simulated load
TOLERANCE = 3.0  # percentage points over 10 s windows


class Node:
    def __init__(self, daemon, containers, **config) -> None:  # type: ignore[no-untyped-def]
        self.d = daemon([gpu("16Gi")], **config)
        self.client = self.d.client()
        self.env = interposer_env(self.d)
        self.boxes = containers
        self.agents: list[Agent] = []

    def agent(self, name: str, annotations: dict[str, str]) -> Agent:
        """A cuda.bindings client (tests/clients/agent.py) in a new slice, CUDA initialised."""
        box = self.boxes()
        self.client.reserve(name, annotations)
        self.client.bind(name, box.init_pid)
        a = Agent(self.env, prefix=box.command([]))
        self.agents.append(a)
        assert a.call("init")["error"] == "CUDA_SUCCESS"
        return a


@pytest.fixture(autouse=True)
def fit_log(daemon, monkeypatch):
    """Shown with a failure: when each daemon began and ended fitting costs, why, and the rows."""
    # the daemons it starts inherit it: the fits, and how long the controller's ticks took
    monkeypatch.setenv("GPUSLICE_DEBUG", "gpuslice.allocator.cost_split,gpuslice.allocator.compute.ticks")
    yield
    for rd in daemon.running:
        lines = [ln for ln in rd.log().splitlines() if any(w in ln for w in ("fitt", "drifted", "fit rows", "again"))]
        print(f"{rd.dir.name}:", *lines, sep="\n  ")


@pytest.fixture
def node(daemon, containers):
    n = Node(daemon, containers)
    yield n
    for a in n.agents:
        a.close()


ONE_POINT = ("30/70 hard", "30/70 elastic", "10/20/30/40", "eight slices")  # issue 46's mixes: within 1 point


@pytest.mark.parametrize("mix", MIXES, ids=[m.name for m in MIXES])
def test_each_tenant_gets_its_share(node, mix: Mix):
    """On the simulator's default driver, the H100's (util_stamps: busiest: each 200 ms
    period, the GPU's use, to the process that ran most in it): the controller fits
    the tenants' costs together within SETTLE_PER_SLICE a tenant, then each gets its
    share over 10 s, issue 46's mixes within 1 point. With the controller before it
    (one slice measured at a time) 10/20/30/40 read 10.8 / 16.9 / 28.7 / 33.9 %."""
    r = measure_mix(node.client, node.env, node.boxes, mix)
    want = mix.expect or mix.cores
    print(mix.name, "targets", want, "measured", [round(g, 2) for g in r.shares], "costs fitted at", r.fitted_s)
    assert r.fitted_s is not None, (mix.name, "costs not fitted in time")
    tolerance = 1.0 if mix.name in ONE_POINT else TOLERANCE
    for g, w in zip(r.shares, want, strict=True):
        assert abs(g - w) <= tolerance, (mix.name, r.shares, want)


EVEN_BASE = ("30/70 hard", "10/20/30/40")


@pytest.mark.parametrize("mix", [m for m in MIXES if m.name in EVEN_BASE], ids=EVEN_BASE)
def test_each_tenant_gets_its_share_with_the_fits_even_base(daemon, containers, mix: Mix):
    """`compute_fit_base: even` (while fitting, every slice launches part of the slices' mean
    share, not of its own): on the simulator, which has no cost of sharing for it to even
    out, the costs are fitted as soon and the shares hold to a point as with the default."""
    node = Node(daemon, containers, compute_fit_base="even")
    r = measure_mix(node.client, node.env, node.boxes, mix)
    print(mix.name, "even base: measured", [round(g, 2) for g in r.shares], "costs fitted at", r.fitted_s)
    assert r.fitted_s is not None, (mix.name, "costs not fitted in time")
    for g, w in zip(r.shares, mix.expect or mix.cores, strict=True):
        assert abs(g - w) <= 1.0, (mix.name, r.shares)


@pytest.mark.parametrize("setting", SETTINGS[1:], ids=[s.label for s in SETTINGS[1:]])
def test_hard_shares_hold_to_a_point_at_each_period_and_driver_sampling(daemon, containers, setting):
    """Issue 30's goal: at longer periods, and with a driver that samples every
    170 ms (integer percent per sample), hard 30/70 within 1 point over 10 s."""
    d = daemon([gpu("16Gi", **run_setting_gpu(setting))], compute_period=setting.period)
    with d.client() as client:
        got = measure_mix(client, interposer_env(d), containers, MIXES[0])
    assert got.error([30, 70]) <= 1.0, (setting.label, got.shares, got.seconds)


def test_elastic_slice_borrows_the_idle_gpu_and_gives_it_back(node):
    h = run_handover(node.client, node.env, node.boxes)
    print(h)
    assert h.alone > 90
    # from 2 s after the second tenant started: over the next 10 s, and over the next 2 s alone
    assert abs(h.back - 30) <= TOLERANCE and abs(h.other - 70) <= TOLERANCE
    assert abs(h.back_2s - 30) <= TOLERANCE


def test_elastic_slice_borrows_what_a_light_slice_leaves_and_gives_it_back(node):
    """A hard 50 % slice running a 10 % load lends the rest: an elastic 30 %
    slice beside it gets well over the 50 % that the shares alone leave it.
    Once the light slice saturates, it has its 50 % back within 2 s."""
    r = run_lending(node.client, node.env, node.boxes)
    print(
        f"light hard 50: {r.light:.1f} %, elastic 30 beside it: {r.borrower:.1f} %; both saturating:"
        f" {r.light_after:.1f} / {r.borrower_after:.1f} %, given back in {r.given_back_ms} ms"
    )
    assert abs(r.light - 10) <= TOLERANCE and r.borrower >= 75
    assert abs(r.light_after - 50) <= TOLERANCE and abs(r.borrower_after - 50) <= TOLERANCE
    assert r.given_back_ms <= 2000


def test_whole_gpu_slice_is_never_throttled(node):
    t = Tenant(node.client, node.env, node.boxes(), "whole", {"gpuslice.io/memory": "1Gi", "gpuslice.io/cores": "100"},
               SETTLE + 3, "100")  # fmt: skip
    start = t.started + int(SETTLE * NS)
    assert t.share(start, start + 2 * NS) > 97


def test_launches_pass_while_the_daemon_is_gone_and_are_held_again_after_restart(node, daemon):
    # the load runs until the window after the restart has ended, however long the restart took
    t = Tenant(node.client, node.env, node.boxes(), "hard", slice_of(30, "hard"), 60, "100", stoppable=True)
    time.sleep(SETTLE + 1)
    node.d.proc.kill()  # no refills from now on
    node.d.proc.wait()
    killed = time.monotonic_ns()
    time.sleep(4.5)
    restarted = daemon.restart(node.d)
    time.sleep(3)  # a slow restart
    back = time.monotonic_ns()
    node.client = restarted.client()
    t.stop_at(back + 6 * NS)
    during = t.share(killed + 3 * NS, killed + 4 * NS)  # the gate gives up waiting 2 s after the last refill
    after = t.share(back + 2 * NS, back + 6 * NS)
    print(f"hard 30 %: {during:.1f} % with the daemon gone, {after:.1f} % from 2 s after its restart")
    assert during > 90
    assert abs(after - 30) <= TOLERANCE


def test_status_shows_each_slices_target_and_use(node):
    from gpuslice.cli.status_table import render_status

    t = Tenant(node.client, node.env, node.boxes(), "shown", slice_of(30, "hard"), 8, "100")
    time.sleep(6)  # past the start-up ramp, and a second of the average shown
    (s,) = node.client.list()
    g = s.gpus[0]
    table = render_status(node.client.inventory(), node.client.list())
    t.points()
    assert g.compute_target == pytest.approx(0.3)
    assert abs(g.compute_used - 0.3) < 0.05, g
    assert any(" 30 " in line and "%" in line and "hard" in line for line in table.splitlines()), table


def test_cuda_bindings_launches_are_held_to_a_hard_share(node):
    """NVIDIA's own Python client: cuda.bindings resolves cuLaunchKernel through
    cuGetProcAddress, and gets the gated hook."""
    agent = node.agent("py", slice_of(30, "hard"))
    start = time.monotonic_ns()
    agent.call("launch_for", seconds=6.0, grid=8640)  # 100 us kernels
    time.sleep(4.3)  # the simulator keeps the last 2.5 s of its accounting
    a, b = start + 2 * NS, start + 4 * NS  # whole 10 ms buckets of the simulator's accounting
    a, b = a - a % (NS // 100), b - b % (NS // 100)
    used = 100 * agent.call("sim_busy", from_ns=a, to_ns=b)["busy"] / (b - a)
    agent.call("join")
    print(f"cuda.bindings client in a hard 30 % slice: {used:.1f} %")
    assert abs(used - 30) <= TOLERANCE


def test_a_two_gpu_slice_is_held_to_its_share_on_each_gpu(daemon, containers):
    """Each GPU of a slice has its own gate: a hard 30 % slice of two GPUs
    launching on its second GPU gets 30 % of that GPU."""
    d = daemon([gpu("16Gi"), gpu("16Gi")])
    client, box = d.client(), containers()
    client.reserve("two", {**slice_of(30, "hard"), "gpuslice.io/gpus": "2"})
    client.bind("two", box.init_pid)
    agent = Agent(interposer_env(d), prefix=box.command([]))
    try:
        assert agent.call("init", device=1)["error"] == "CUDA_SUCCESS"
        start = time.monotonic_ns()
        agent.call("launch_for", seconds=6.0, grid=8640)  # 100 us kernels
        time.sleep(4.3)  # the simulator keeps the last 2.5 s of its accounting
        a, b = start + 2 * NS, start + 4 * NS
        a, b = a - a % (NS // 100), b - b % (NS // 100)
        used = 100 * agent.call("sim_busy", from_ns=a, to_ns=b, device=1)["busy"] / (b - a)
        agent.call("join")
    finally:
        agent.close()
    print(f"hard 30 % slice of two GPUs, on its second GPU: {used:.1f} %")
    assert abs(used - 30) <= TOLERANCE


def test_launches_recorded_by_stream_capture_are_not_charged(node):
    """Captured launches run (and are charged) when their graph is launched: a
    capture of 10 s of kernels in a hard 30 % slice takes no time at all."""
    agent = node.agent("cap", slice_of(30, "hard"))
    agent.call("launch_for", seconds=3.0, grid=8640)  # the slice is busy and held to its budget
    time.sleep(1.5)
    got = agent.call("capture", kernels=1000, grid=864 * 1000)  # 1000 kernels of 10 ms
    agent.call("join")
    assert got["error"] == "CUDA_SUCCESS" and got["seconds"] < 1.0, got


def test_a_graph_costs_what_it_runs_after_updates_and_captures_into_it(node):
    """What each call takes from the gate, exactly: the daemon is stopped, so
    nothing refills and, 2 s on, launches pass and still pay.  A graph costs
    its kernel nodes' threads (child graphs included) as they are after
    cuGraphExecKernelNodeSetParams, cuGraphExecNodeSetParams,
    cuGraphExecChildGraphNodeSetParams and cuGraphExecUpdate; launches recorded by cuStreamBeginCaptureToGraph
    cost nothing until their graph runs."""
    agent = node.agent("g", slice_of(30, "hard"))
    files = SliceFiles(node.d.slice_files_dir, node.client.get("g").id)

    def blocks(op: str, **args) -> int:
        """Blocks of 256 threads the call took from the gate."""
        before = int(files.usage.gate[0].tokens)
        got = agent.call(op, **args)
        assert got["error"] == "CUDA_SUCCESS", (op, got)
        return (before - int(files.usage.gate[0].tokens)) // 256

    g = agent.call("graph", grids=[4, 6])["id"]
    ex = agent.call("instantiate", id=g)["id"]
    small = agent.call("graph", grids=[1, 2])["id"]
    into = agent.call("graph", grids=[])["id"]
    parent = agent.call("graph", grids=[5], child=[3, 4])["id"]
    nested = agent.call("instantiate", id=parent)["id"]
    node.d.proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(2.3)
        assert blocks("launch", grid=10) == 10
        assert blocks("graph_launch", exec=ex) == 4 + 6
        assert blocks("exec_set_grid", exec=ex, graph=g, node=0, grid=40) == 0
        assert blocks("graph_launch", exec=ex) == 40 + 6
        assert blocks("exec_set_grid", exec=ex, graph=g, node=0, grid=8) == 0
        assert blocks("graph_launch", exec=ex) == 8 + 6
        assert blocks("exec_set_grid", exec=ex, graph=g, node=1, grid=12, generic=True) == 0
        assert blocks("graph_launch", exec=ex) == 8 + 12
        assert blocks("exec_update", exec=ex, graph=small) == 0
        assert blocks("graph_launch", exec=ex) == 1 + 2
        assert blocks("capture_into", id=into, grids=[5, 5, 5]) == 0
        captured = agent.call("instantiate", id=into)["id"]
        assert blocks("graph_launch", exec=captured) == 15
        assert blocks("graph_launch", exec=nested) == 3 + 4 + 5
        assert blocks("exec_set_child", exec=nested, graph=parent, node=0, grids=[1, 1]) == 0
        assert blocks("graph_launch", exec=nested) == 1 + 1 + 5
        refused = agent.call("exec_update", exec=ex, graph=into)  # three kernels for two: nothing changes
        assert refused["error"] == "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", refused
        assert blocks("graph_launch", exec=ex) == 1 + 2
    finally:
        node.d.proc.send_signal(signal.SIGCONT)


def test_resize_moves_the_share(node):
    t = Tenant(node.client, node.env, node.boxes(), "grow", slice_of(30, "hard"), 12, "100")
    time.sleep(SETTLE + 3)
    node.client.resize("grow", {"gpuslice.io/cores": "60"})
    resized = time.monotonic_ns()
    before = t.share(t.started + int(SETTLE * NS), t.started + int(SETTLE * NS) + 3 * NS)
    after = t.share(resized + 2 * NS, resized + 6 * NS)
    print(f"hard slice resized from 30 to 60 %: {before:.1f} % before, {after:.1f} % after")
    assert abs(before - 30) <= TOLERANCE and abs(after - 60) <= TOLERANCE


# two tenants of one 1 ms kernel, whose costs are the same, were fitted up to 3.3 % apart, either way,
# each claimed within 0.3-0.9 % (30.7 / 68.9 % over 10 s): the fit's errors are still too small for
# 1 ms kernels (docs/compute.md, Limits). The 100 us kernels of MIXES fit within 1 point.
DRIFT_TOLERANCE = 1.5


def test_a_tenant_whose_kernels_change_is_held_to_its_share_again(daemon, containers):
    """Hard 30 / 70 with their costs fitted; then the 30 % tenant's kernels, as long,
    launch half the threads (half occupancy: twice the cost per thread). Charged at
    the old cost it would get about half the GPU; the controller notices what the
    GPU does drift off the fitted costs, fits them again, and the shares hold to a
    point and a half again (DRIFT_TOLERANCE)."""
    node = Node(daemon, containers, metrics={"port": sim_daemon.free_port()})
    r = run_drift(node.client, node.env, node.boxes)
    print("drift: before", r.before, "2 s after", r.stale, "refit", r.refit_ms, "after", r.after)
    assert r.before == pytest.approx([30, 70], abs=DRIFT_TOLERANCE)
    assert r.refit_ms is not None and r.refit_ms[0] <= (DRIFT_STRIKES + 1) * DRIFT_WINDOW_NS // 1_000_000 + 1000
    assert r.after == pytest.approx([30, 70], abs=DRIFT_TOLERANCE)
    body = urllib.request.urlopen(f"http://127.0.0.1:{node.d.metrics_port}/metrics", timeout=10).read().decode()
    fits = {
        s.labels["reason"]: s.value
        for f in text_string_to_metric_families(body)
        for s in f.samples
        if s.name == "gpuslice_gpu_compute_fits_total"
    }
    assert fits == {"join": 1.0, "drift": 1.0}
