"""The reconciliation with the driver's per-process counts (allocator/driver_memory.py),
on a stand-in for a slice's files: what it charges as the driver's own when the
processes allocate and free while it reads."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gpuslice.allocator.driver_memory import Reconciler

pytestmark = pytest.mark.unit
MiB = 1 << 20


@dataclass
class Files:
    """One slice on one GPU: each slot's process and what it charged through the interposer."""

    charges: dict[int, int]  # slot -> bytes
    pids: dict[int, int]  # slot -> pid
    slice_id: str = "s"
    driver: int = 0
    limit: int = 1024 * MiB
    said: list[int] = field(default_factory=list)

    def slot_pids(self) -> dict[int, int]:
        return dict(self.pids)

    def gpu_count(self) -> int:
        return 1

    def gpu_uuid(self, g: int) -> str:
        return "GPU-a"

    def proc_used(self, slot: int, g: int) -> int:
        return self.charges[slot]

    def set_driver_side(self, g: int, nbytes: int) -> int:
        was, self.driver = self.driver, nbytes
        self.said.append(nbytes)
        return was

    def driver_side(self, g: int) -> int:
        return self.driver

    def used(self) -> list[int]:
        return [sum(self.charges.values()) + self.driver]

    def memory_limit(self, g: int) -> int:
        return self.limit


def test_what_the_driver_holds_beyond_the_charges_is_the_slices_driver_side():
    f = Files({0: 300 * MiB, 1: 100 * MiB}, {0: 10, 1: 11})
    Reconciler(lambda: [f], lambda uuid: {10: 500 * MiB, 11: 50 * MiB, 99: 7 * MiB}).once()
    assert f.driver == 200 * MiB  # 10's 200 beyond; 11 below its charge counts 0; 99 is not the slice's


def test_a_free_while_the_driver_is_read_is_not_charged_as_the_drivers():
    """The driver is read first, then the charges: a process that frees 40 MiB between the two
    reads left the driver's count with it and its charge without. On the H200-sized churn of
    tests/integration/test_interposer.py (8 processes allocating and freeing) that left 38 MiB
    on a slice whose processes had freed everything, until the next period."""
    f = Files({0: 140 * MiB}, {0: 10})

    def read(uuid: str) -> dict[int, int]:
        counts = {10: f.charges[0]}  # the driver's count: exactly what was charged, nothing of its own
        f.charges[0] -= 40 * MiB  # the free lands now, after the driver's answer
        return counts

    Reconciler(lambda: [f], read).once()
    assert f.said == [0]


def test_an_allocation_while_the_driver_is_read_is_not_charged_either():
    f = Files({0: 100 * MiB}, {0: 10})

    def read(uuid: str) -> dict[int, int]:
        f.charges[0] += 40 * MiB  # charged by the interposer, then made by the driver, before the count
        return {10: f.charges[0] + 30 * MiB}  # and 30 MiB of the driver's own

    Reconciler(lambda: [f], read).once()
    assert f.said == [30 * MiB]
