"""How the suite shares pytest-xdist's workers (`dev.sh test` runs three).

Most tests wait on simulated GPUs, daemons and runtimes rather than use a
core, so they run side by side; the ones that measure (shares over seconds,
fits within a deadline) lose their points beside other tests' load, so they
run last, after every other test has finished, on two workers. In two phases:

1. every e2e test (not measuring) on one worker, in order: they share the
   machine's runtimes, packages and systemd; every other test on whichever
   worker is free, each one a unit of its own;
2. once the queue is empty: two workers run the measuring tests while the
   others have been shut down; the measuring e2e tests are one unit, in
   order on one of them, and every other measuring test is a unit of its
   own for whichever of the two is free.

Two measure side by side and not one: a measuring test mostly waits on its
simulated GPU (a 30/70 pair: 3.2 s of CPU in 17 s), so two of them on two
cores keep their points, and the phase takes half as long (776 s of
measuring tests in one run; two halves side by side, 383 s each, every test
passing). Each of the two runs the phase-1 test it was holding first (an
xdist worker keeps its last test until it gets more), so one of those may
still run while the other worker's first measuring test begins: the queue
is in collection order, so that is a unit test near the end of tests/unit/
(the e2e worker, whose last e2e test may still be held, is the one shut
down and waited for).

Only the workers see the tests' markers, so each writes the ids of its
measuring tests to a file the controller names for it (`workerinput`),
before it reports its collection; the controller reads it when it schedules.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

E2E = "tests/e2e"
MEASURE = "measure"
MEASURERS = 2  # workers in phase 2
MEASURE_E2E = MEASURE + " " + E2E  # the measuring e2e tests' one unit (no node id has a space before "::")
KEY = "gpuslice_measure_ids"  # in a worker's workerinput: where it writes its measuring tests' ids


def name_ids_file(node: WorkerController, root: Path) -> None:
    """Controller side (pytest_configure_node): the file this worker writes."""
    node.workerinput[KEY] = str(root / f"measure-ids-{node.gateway.id}")


def write_ids(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Worker side (pytest_collection_modifyitems, after the markers are set)."""
    target = getattr(config, "workerinput", {}).get(KEY)
    if target is None:
        return
    partial = Path(target + ".part")
    partial.write_text("".join(f"{i.nodeid}\n" for i in items if i.get_closest_marker(MEASURE)))
    partial.replace(target)  # whole or absent when the controller reads it


class MeasureLast(LoadScopeScheduling):
    def __init__(self, config: pytest.Config, log=None) -> None:  # type: ignore[no-untyped-def]
        super().__init__(config, log)
        self.measure: frozenset[str] = frozenset()
        self.held: OrderedDict[str, dict[str, bool]] | None = None  # the measuring units, until phase 2
        self.measurers: list[WorkerController] = []  # the workers that will run them
        self.measuring = False  # phase 2 has begun: the queue is the measuring units'

    def _split_scope(self, nodeid: str) -> str:
        e2e = nodeid.startswith(E2E + "/")
        if nodeid in self.measure:
            return MEASURE_E2E if e2e else MEASURE + " " + nodeid
        return E2E if e2e else nodeid

    def schedule(self) -> None:
        if self.collection is None and self.registered_collections:
            self.measure = self._read_measure_ids()
        super().schedule()
        self._advance()

    def _read_measure_ids(self) -> frozenset[str]:
        node = next(iter(self.registered_collections))
        path = Path(node.workerinput[KEY])
        if not path.exists():
            raise RuntimeError(f"{node.gateway.id} wrote no {path}: is tests/conftest.py's collection hook in place?")
        return frozenset(path.read_text().splitlines())

    def _hold_measure(self) -> None:
        """In phase 1, the measuring units out of the queue, the e2e unit first (the longest)."""
        if self.measuring:
            return
        units = [scope for scope in self.workqueue if scope.startswith(MEASURE + " ")]
        if not units:
            return
        held = self.held if self.held is not None else OrderedDict()
        for scope in sorted(units, key=lambda s: s != MEASURE_E2E):
            held[scope] = self.workqueue.pop(scope)
        self.held = held

    def _assign_work_unit(self, node: WorkerController) -> None:
        self._hold_measure()
        if self.workqueue:
            super()._assign_work_unit(node)

    def _reschedule(self, node: WorkerController) -> None:
        self._hold_measure()
        if self.workqueue or self.held is None:
            super()._reschedule(node)
        if not self.workqueue:
            self._advance()

    def _advance(self) -> None:
        """Once the queue is empty: two workers keep going, the others are shut
        down (a worker keeps its last test until it gets more or is told to
        stop); when the others have finished, the two get the measuring units."""
        self._hold_measure()
        if self.workqueue or self.held is None:
            return
        live = [n for n in self.assigned_work if not n.shutting_down]
        self.measurers = [n for n in self.measurers if n in live]
        # the worker that holds an e2e test is shut down and its test waited for, not measured beside
        candidates = sorted((n for n in live if n not in self.measurers), key=self._holds_e2e)
        self.measurers += candidates[: MEASURERS - len(self.measurers)]
        for node in live:
            if node not in self.measurers:
                node.shutdown()
        if not self.measurers:
            return  # every worker is gone; xdist starts another and schedules again
        others = [w for n, w in self.assigned_work.items() if n not in self.measurers]
        if any(self._pending_of(w) for w in others):
            return
        if any(self._pending_of(self.assigned_work[n]) > 1 for n in self.measurers):
            return
        self.workqueue, self.held, self.measuring = self.held, None, True
        for node in self.measurers:
            if self.workqueue:
                super()._assign_work_unit(node)
        for node in self.measurers:
            super()._reschedule(node)  # more than one unit each, or shut down once none are left

    def _holds_e2e(self, node: WorkerController) -> bool:
        return not all(self.assigned_work[node].get(E2E, {}).values())

    @property
    def tests_finished(self) -> bool:
        return self.held is None and super().tests_finished

    @property
    def has_pending(self) -> bool:
        return self.held is not None or super().has_pending

    def remove_node(self, node: WorkerController) -> str | None:
        """A worker gone: xdist reports the test it died in as failed, and that
        test is not run again (xdist's own scope scheduling would give it to
        the next worker, and the next, until too many had crashed); the rest of
        its tests go back in the queue."""
        workload = self.assigned_work[node]
        crashed = next((t for unit in workload.values() for t, done in unit.items() if not done), None)
        if crashed is not None:
            workload[self._split_scope(crashed)][crashed] = True
        super().remove_node(node)
        if node in self.measurers:
            self.measurers.remove(node)
        self._advance()
        return crashed
