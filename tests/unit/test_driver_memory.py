"""The reconciliation with the driver's per-process counts (allocator/driver_memory.py),
on a stand-in for a slice's files: what it charges as the driver's own when the
processes allocate and free while it reads."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from gpuslice.allocator.driver_memory import Reconciler
from gpuslice.allocator.slice_files import GpuLimit, SliceFiles

pytestmark = pytest.mark.unit
MiB = 1 << 20


@dataclass(frozen=True)
class Rows:
    """The stand-in's rows as read at once (SliceFiles.rows)."""

    pid_of: tuple[tuple[int, int], ...]
    held: tuple[tuple[int, int], ...]
    ever_of: tuple[tuple[int, int], ...]
    n_rows: int = 64

    def whole(self) -> bool:
        return True

    def first(self, count: int) -> Rows:
        return self

    def pids(self) -> dict[int, int]:
        return dict(self.pid_of)

    def used(self, slot: int, g: int) -> int:
        return dict(self.held)[slot]

    def ever(self, slot: int, g: int) -> int:
        return dict(self.ever_of).get(slot, 0)


@dataclass
class Files:
    """One slice on one GPU: each slot's process and what it charged through the interposer."""

    charges: dict[int, int]  # slot -> bytes
    pids: dict[int, int]  # slot -> pid
    ever: dict[int, int] = field(default_factory=dict)  # slot -> bytes it ever charged (only grows)
    slice_id: str = "s"
    driver: int = 0
    limit: int = 1024 * MiB
    said: list[int] = field(default_factory=list)

    def slot_pids(self) -> dict[int, int]:
        return dict(self.pids)

    def rows(self, ever_first: bool, count: int = 0) -> Rows:
        return Rows(tuple(self.pids.items()), tuple(self.charges.items()), tuple(self.ever.items()))

    def generation(self) -> int:
        return 1

    def release_seq(self) -> int:
        return 0  # its rows are never released while read

    def gpu_count(self) -> int:
        return 1

    def gpu_uuid(self, g: int) -> str:
        return "GPU-a"

    def proc_used(self, slot: int, g: int) -> int:
        return self.charges[slot]

    def proc_charged(self, slot: int, g: int) -> int:
        return self.ever.get(slot, 0)

    def charge(self, slot: int, nbytes: int) -> None:
        """As the ledger does: the row's bytes, then what it ever charged."""
        self.charges[slot] += nbytes
        self.ever[slot] = self.ever.get(slot, 0) + nbytes

    def uncharge(self, slot: int, nbytes: int) -> None:
        self.charges[slot] -= nbytes

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


def periods() -> Callable[[], float]:
    """A clock for the reads: each one a period (1 s) after the last, as the thread's periods are."""
    return itertools.count().__next__


def test_what_the_driver_holds_beyond_the_charges_is_the_slices_driver_side():
    f = Files({0: 300 * MiB, 1: 100 * MiB}, {0: 10, 1: 11})
    Reconciler(lambda: [f], lambda uuid: {10: 500 * MiB, 11: 50 * MiB, 99: 7 * MiB}).once()
    assert f.driver == 200 * MiB  # 10's 200 beyond; 11 below its charge counts 0; 99 is not the slice's


def test_each_change_of_the_driver_side_figure_is_logged_with_the_counts_it_came_from(caplog):
    """At DEBUG (the real-GPU kit turns it on): why a slice's total moved without an allocation,
    each process's count beside the most it can have held, and unsliced ones marked."""
    caplog.set_level(logging.DEBUG, logger="gpuslice.allocator.driver_memory")
    f = Files({0: 300 * MiB}, {0: 10})
    counts = {10: 500 * MiB, 20: 50 * MiB}
    r = Reconciler(lambda: [f], lambda uuid: counts, gpus=lambda: ["GPU-a"], owner_of={20: f}.get, clock=periods())
    r.once()
    r.once()  # 20 charged from its second period; nothing changed for 10
    counts[10] = 300 * MiB
    r.once()
    said = [m for m in caplog.messages if "driver-side" in m]
    assert said == [
        f"slice s GPU 0: driver-side {200 * MiB} bytes (was 0); pid, driver's count of most held: "
        f"10 {500 * MiB} of {300 * MiB}",
        f"slice s GPU 0: driver-side {250 * MiB} bytes (was {200 * MiB}); pid, driver's count of most held: "
        f"10 {500 * MiB} of {300 * MiB}; 20 {50 * MiB}, unsliced",
        f"slice s GPU 0: driver-side {50 * MiB} bytes (was {250 * MiB}); pid, driver's count of most held: "
        f"10 {300 * MiB} of {300 * MiB}; 20 {50 * MiB}, unsliced",
    ]


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


@pytest.mark.parametrize(("own", "charged"), [(0, 0), (30 * MiB, 30 * MiB)])
def test_an_allocation_freed_while_the_driver_is_read_is_not_charged_as_the_drivers(own, charged):
    """Charged, made, counted by the driver, freed: all between the two reads of the charges,
    which both saw 100 MiB while the driver counted 140. Each read alone misses the 40 MiB the
    process held in between; what it ever charged does not (a phantom would stay until the next
    period, on a slice whose processes may have freed everything and exited, and refuse
    allocations that fit). The driver's own memory beside the churn still counts."""
    f = Files({0: 100 * MiB}, {0: 10})

    def read(uuid: str) -> dict[int, int]:
        f.charge(0, 40 * MiB)
        counts = {10: f.charges[0] + own}
        f.uncharge(0, 40 * MiB)
        return counts

    Reconciler(lambda: [f], read).once()
    assert f.said == [charged]


def test_on_the_real_ledger_a_process_s_churn_while_the_driver_is_read_leaves_nothing(tmp_path):
    """The same race on a slice's real files: the ledger counts what a row ever charged, and a
    released row starts again from nothing."""
    files = SliceFiles(tmp_path, "s")
    files.write_limits([GpuLimit("GPU-a", 1 << 30, 0, False)])
    slot = files.claim_slot(10)
    assert slot is not None and files.charge(slot, 0, 100 * MiB)

    def read(uuid: str) -> dict[int, int]:
        assert files.charge(slot, 0, 40 * MiB)
        counts = {10: files.proc_used(slot, 0)}  # the driver counts the 40 MiB, then they are freed
        files.uncharge(slot, 0, 40 * MiB)
        return counts

    Reconciler(lambda: [files], read).once()
    assert (files.driver_side(0), files.used(), files.proc_charged(slot, 0)) == (0, [100 * MiB], 140 * MiB)
    files.release_slot(slot)
    again = files.claim_slot(11)
    assert again == slot and (files.proc_used(slot, 0), files.proc_charged(slot, 0)) == (0, 0)


def test_a_process_whose_row_is_released_while_the_driver_is_read_leaves_nothing(tmp_path, caplog):
    """The watcher releases an exited process's row (its charges, then its pid) on its own
    thread, and the driver lets go of the process's context a moment later: a reading that
    took the row's pid before the release and its charges after saw the driver count 300 MiB
    for a process that held 0, and charged it all to the slice as the driver's own (a fresh
    clone's suite, 2026-12-02: "driver-side 314572800 bytes (was 0); ... 15086 314572800 of
    0", the next process's array fill then 300 MiB short). A reading across a release leaves
    the slice's figure as it was and reads again at once."""
    caplog.set_level(logging.DEBUG, "gpuslice.allocator.driver_memory")
    files = SliceFiles(tmp_path, "s")
    files.write_limits([GpuLimit("GPU-a", 1 << 30, 0, False)])
    slot = files.claim_slot(10)
    assert slot is not None and files.charge(slot, 0, 300 * MiB)  # its context's reserve

    released = []

    def read(uuid: str) -> dict[int, int]:
        if not released:
            released.append(files.release_slot(slot))  # it exited: the watcher's release, while the driver is read
            return {10: 300 * MiB}  # the driver still counts its context
        return {}

    r = Reconciler(lambda: [files], read)
    r.once()
    assert (files.driver_side(0), files.used()) == (0, [0])
    assert r._soon.is_set()  # read again at once
    assert not [m for m in caplog.messages if "driver-side" in m]
    r._soon.clear()  # as the reconciler's thread does before each reading
    r.once()  # the driver has let go
    assert released == [300 * MiB] and (files.driver_side(0), files.used(), r._soon.is_set()) == (0, [0], False)


def test_a_process_of_the_slices_container_that_never_attached_is_charged_whole(caplog):
    """A process that loaded a libcuda.so.1 of its own (an image's compat driver) holds memory
    the interposer never saw. From its second period on (a process leaving its slot while the
    driver still counts it is not one), all of it is charged to its container's slice; named
    once; gone with it. Processes of no slice's container, or on a GPU the slice does not
    hold, are not the slice's."""
    caplog.set_level(logging.INFO)
    f = Files({0: 100 * MiB}, {0: 10})
    counts = {"GPU-a": {10: 100 * MiB, 20: 300 * MiB, 30: 50 * MiB}, "GPU-b": {40: 70 * MiB}}
    owners = {20: f, 40: f}  # 40 is the container's too, but on a GPU the slice does not hold
    r = Reconciler(lambda: [f], lambda uuid: counts[uuid], gpus=lambda: ["GPU-a", "GPU-b"], owner_of=owners.get,
                   clock=periods())  # fmt: skip
    r.once()
    assert f.said == [0]
    r.once()
    r.once()
    assert f.said == [0, 300 * MiB] and f.driver == 300 * MiB  # set once: a figure that stands is not set again
    warned = [m for m in caplog.messages if "without the interposer" in m]
    assert warned == [
        "slice s GPU 0: process 20 of its container holds 314572800 bytes on the GPU without the interposer "
        "(it loaded a libcuda.so.1 of its own); charged to the slice, its launches not gated"
    ]
    del counts["GPU-a"][20]
    r.once()
    assert f.said[-1] == 0 and "slice s: process 20, unsliced, no longer holds memory on GPU-a" in caplog.messages


def test_an_unattached_process_is_charged_only_once_seen_a_period_on_however_often_the_driver_is_read():
    """A process's exit wakes a read of the driver at once, and a burst of exits reads it every
    20 ms: a process that left its slot while the driver still counts it (the driver may take
    longer than that to let go of it) is not one that never attached until a period has passed."""
    f = Files({0: 100 * MiB}, {0: 10})
    now = [0.0]
    r = Reconciler(lambda: [f], lambda uuid: {10: 100 * MiB, 20: 300 * MiB}, gpus=lambda: ["GPU-a"],
                   owner_of={20: f}.get, clock=lambda: now[0])  # fmt: skip
    for now[0] in (0.0, 0.02, 0.5, 0.98):
        r.once()
    assert f.said == [0] and r.unsliced == {}  # 0 from the first, and never changed
    now[0] = 1.0
    r.once()
    assert f.said[-1] == 300 * MiB and r.unsliced == {(20, "GPU-a"): "s"}


def test_a_slice_whose_only_process_never_attached_is_charged_and_cleared():
    f = Files({}, {})
    counts = {20: 300 * MiB}
    r = Reconciler(list, lambda uuid: counts, gpus=lambda: ["GPU-a"], owner_of={20: f}.get, clock=periods())
    r.once()
    r.once()
    assert f.driver == 300 * MiB and f.used() == [300 * MiB]
    counts.clear()
    r.once()
    assert f.driver == 0


def test_a_process_that_attaches_while_the_driver_is_read_is_not_unsliced():
    """Who is attached is read after the driver: a process that attached between would
    otherwise be charged whole beside its own charges."""
    f = Files({0: 100 * MiB}, {})

    def read(uuid: str) -> dict[int, int]:
        f.pids[0] = 20  # it attaches now
        return {20: 100 * MiB}

    r = Reconciler(lambda: [f], read, gpus=lambda: ["GPU-a"], owner_of={20: f}.get)
    r.once()
    r.once()
    assert f.said == [0, 0]


def _slice(tmp_path, limit: int = 1 << 30) -> SliceFiles:
    files = SliceFiles(tmp_path, "s")
    files.write_limits([GpuLimit("GPU-a", limit, 0, False)])
    return files


def test_a_settled_slice_keeps_its_figure_and_moves_with_its_rows_or_the_drivers_count(tmp_path):
    """A slice whose rows, limits and driver's counts did not move since the last period is
    not worked out or set again (2,000 such slices a period: docs/performance.md); any one of
    them moving is seen the period it moves."""
    files = _slice(tmp_path)
    slot = files.claim_slot(10)
    assert slot is not None and files.charge(slot, 0, 100 * MiB)
    counts = {10: 150 * MiB}
    sets = []
    real_set = files.set_driver_side
    files.set_driver_side = lambda g, n: sets.append(n) or real_set(g, n)  # type: ignore[method-assign]
    r = Reconciler(lambda: [files], lambda uuid: counts)
    r.once()
    r.once()
    assert (files.driver_side(0), sets) == (50 * MiB, [50 * MiB])  # worked out and set once
    counts[10] = 170 * MiB  # the driver alone moved
    r.once()
    assert files.driver_side(0) == 70 * MiB
    assert files.charge(slot, 0, 20 * MiB)  # the rows alone moved: the process charged what the driver counted
    r.once()
    r.once()
    assert (files.driver_side(0), files.used(), sets) == (50 * MiB, [170 * MiB], [50 * MiB, 70 * MiB, 50 * MiB])


def test_a_settled_slice_whose_limit_is_lowered_is_said_to_be_over_it(tmp_path, caplog):
    """Its rows and the driver's counts as they were; its limits' generation is not."""
    files = _slice(tmp_path)
    slot = files.claim_slot(10)
    assert slot is not None and files.charge(slot, 0, 100 * MiB)
    r = Reconciler(lambda: [files], lambda uuid: {10: 300 * MiB})
    r.once()
    r.once()
    assert r.over == {}
    files.write_limits([GpuLimit("GPU-a", 256 * MiB, 0, False)])  # a Resize
    r.once()
    assert r.over == {("s", 0): 44 * MiB} and any("past its limit" in m for m in caplog.messages)


def test_a_process_that_attaches_to_a_settled_slice_is_read_whole_at_once_and_is_not_unsliced(tmp_path):
    """A settled slice's rows are read only up to the first free one past those in use: a new
    process takes the first free row, so one that did is seen there, and the slice keeps its
    figure and is read again at once, every row, its new process with it."""
    files = _slice(tmp_path)
    first = files.claim_slot(10)
    assert first is not None and files.charge(first, 0, 100 * MiB)
    counts = {10: 150 * MiB}
    r = Reconciler(lambda: [files], lambda uuid: counts, gpus=lambda: ["GPU-a"], owner_of={11: files}.get,
                   clock=periods())  # fmt: skip
    r.once()
    r.once()
    second = files.claim_slot(11)
    assert second == 1 and files.charge(second, 0, 200 * MiB)
    counts[11] = 260 * MiB
    r._soon.clear()
    r.once()
    assert (files.driver_side(0), r._soon.is_set(), r.suspects) == (50 * MiB, True, {})
    r.once()
    assert (files.driver_side(0), r.unsliced, r.suspects) == (110 * MiB, {}, {})


def test_the_rows_read_from_a_slices_files_are_the_ledgers(tmp_path):
    """Rows: each row's pid, what it holds and ever charged, from the bytes of the first rows."""
    files = _slice(tmp_path)
    for pid, n in ((10, 5 * MiB), (11, 7 * MiB)):
        slot = files.claim_slot(pid)
        assert slot is not None and files.charge(slot, 0, n)
    files.uncharge(1, 0, 2 * MiB)
    rows = files.rows(ever_first=True)
    assert rows == files.rows(ever_first=False) and rows.pids() == {0: 10, 1: 11} and rows.whole()
    assert [(rows.used(s, 0), rows.ever(s, 0)) for s in (0, 1)] == [(5 * MiB, 5 * MiB), (5 * MiB, 7 * MiB)]
    assert rows.first(3) == files.rows(ever_first=True, count=3) and rows.first(3).whole()
    assert not rows.first(2).whole()  # its last row is in use: one past it may be too
