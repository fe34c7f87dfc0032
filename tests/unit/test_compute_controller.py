"""The compute controller's policy on a fake clock, without a daemon or a
simulator: slices' real shared files (their gates), tenants that launch
kernels while their gate lets them, a GPU that time-slices what was launched
among them, and a sampler that reports what each ran.  Each period the clock
moves by hand and the controller ticks once."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuslice.allocator.compute import ComputeController, Reading
from gpuslice.allocator.slice_files import GpuLimit, SliceFiles, constant

PERIOD = 0.05
PERIOD_NS = int(PERIOD * 1e9)
NS_PER_THREAD = 100  # what one launched thread costs the GPU
KERNEL = 1000  # threads per launch: 100 us of GPU time
UUID = "GPU-00000000-0000-0000-0000-000000000000"


@dataclass
class Tenant:
    files: SliceFiles
    pid: int
    launched: int = 0  # threads this period
    ran_ns: list[float] = field(default_factory=list)  # GPU time per period

    def launch(self, max_threads: int) -> None:
        """Launch like the interposer's gate: while the budget is above zero (an open
        gate has no limit), counting a wait when it is spent."""
        gate = self.files.usage.gate[0]
        self.launched = 0
        while self.launched + KERNEL <= max_threads:
            if gate.tokens < constant("GPUSLICE_GATE_OPEN"):
                if gate.tokens <= 0:
                    gate.waits += 1
                    return
                gate.tokens -= KERNEL
            self.launched += KERNEL


class FakeGpu:
    """A GPU that runs what was launched, time-sliced when it is more than a period holds."""

    def __init__(self) -> None:
        self.now = 100.0
        self.reading = Reading({}, 0)

    def clock(self) -> float:
        return self.now

    def sample(self, uuid: str) -> Reading:
        assert uuid == UUID
        reading, self.reading = self.reading, Reading({}, 0)
        return reading

    def run(self, tenants: list[Tenant], busy: dict[int, bool]) -> None:
        for t in tenants:
            # a busy tenant launches as much as the GPU could run for it alone; an idle one nothing
            t.launch(PERIOD_NS // NS_PER_THREAD if busy[t.pid] else 0)
        demand = {t.pid: t.launched * NS_PER_THREAD for t in tenants}
        scale = min(1.0, PERIOD_NS / max(1, sum(demand.values())))
        for t in tenants:
            t.ran_ns.append(demand[t.pid] * scale)
        self.reading = Reading({t.pid: t.ran_ns[-1] for t in tenants if t.ran_ns[-1]}, PERIOD_NS)
        self.now += PERIOD


def node(tmp_path: Path, *slices: tuple[int, bool]) -> tuple[FakeGpu, list[Tenant], ComputeController]:
    """Slices of (cores, hard) on one GPU, each with one process."""
    tenants = []
    limits = {}  # the daemon's records, as SliceManager.limits_of gives them
    for i, (cores, hard) in enumerate(slices):
        f = SliceFiles(tmp_path, f"slice{i}")
        limits[f.slice_id] = [GpuLimit(UUID, 1 << 30, cores, hard)]
        f.write_limits(limits[f.slice_id])
        f.claim_slot(1000 + i)
        tenants.append(Tenant(f, 1000 + i))
    gpu = FakeGpu()
    files = {t.files.slice_id: t.files for t in tenants}
    controller = ComputeController(lambda: files, lambda sid: limits.get(sid, []), gpu.sample, PERIOD,
                                   clock=gpu.clock)  # fmt: skip
    return gpu, tenants, controller


def drive(gpu: FakeGpu, tenants: list[Tenant], controller: ComputeController, seconds: float,
          busy: dict[int, bool] | None = None) -> list[float]:  # fmt: skip
    """Run for a while; each tenant's share of the GPU over that time, in percent."""
    busy = busy or {t.pid: True for t in tenants}
    start = [len(t.ran_ns) for t in tenants]
    for _ in range(round(seconds / PERIOD)):
        gpu.run(tenants, busy)
        controller.tick()
    total_ns = round(seconds / PERIOD) * PERIOD_NS
    return [100 * sum(t.ran_ns[s:]) / total_ns for t, s in zip(tenants, start, strict=True)]


@pytest.mark.parametrize("shares", [(30, 70), (20, 30, 50), (10, 15, 25, 50)])
def test_hard_slices_saturating_one_gpu_get_their_shares(tmp_path, shares):
    gpu, tenants, controller = node(tmp_path, *((c, True) for c in shares))
    drive(gpu, tenants, controller, 3.0)  # learning each slice's cost
    got = drive(gpu, tenants, controller, 10.0)
    assert got == pytest.approx(list(shares), abs=3.0)


def test_a_hard_slice_alone_is_held_to_its_share_and_an_elastic_one_is_not(tmp_path):
    gpu, tenants, controller = node(tmp_path, (30, True))
    drive(gpu, tenants, controller, 3.0)
    assert drive(gpu, tenants, controller, 5.0) == pytest.approx([30], abs=3.0)
    (tmp_path / "elastic").mkdir()
    gpu, tenants, controller = node(tmp_path / "elastic", (30, False))
    drive(gpu, tenants, controller, 3.0)
    assert drive(gpu, tenants, controller, 5.0)[0] > 95


def test_an_idle_slice_lends_its_share_to_an_elastic_one_and_gets_it_back(tmp_path):
    gpu, tenants, controller = node(tmp_path, (30, False), (70, True))
    elastic, hard = tenants
    alone = drive(gpu, tenants, controller, 5.0, busy={elastic.pid: True, hard.pid: False})
    assert alone[0] > 90 and alone[1] == 0
    drive(gpu, tenants, controller, 2.0)  # the hard slice starts: the elastic one hands its share back
    both = drive(gpu, tenants, controller, 8.0)
    assert both == pytest.approx([30, 70], abs=3.0)
