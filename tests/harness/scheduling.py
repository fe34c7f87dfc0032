"""How the suite shares pytest-xdist's workers (`dev.sh test` runs three).

Most tests wait on simulated GPUs, daemons and runtimes rather than use a
core, so they run side by side; the ones that measure (shares over seconds,
fits within a deadline) lose their points beside other tests' load, so they
run last, alone, in collection order, on one worker, after every other test
has finished. In two phases:

1. every e2e test (not measuring) on one worker, in order: they share the
   machine's runtimes, packages and systemd; every other test on whichever
   worker is free, each one a unit of its own;
2. once the queue is empty: one worker runs the measuring tests while the
   others have been shut down.

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
        self.held: dict[str, bool] | None = None  # the measuring tests, until phase 2
        self.measurer: WorkerController | None = None  # the worker that will run them

    def _split_scope(self, nodeid: str) -> str:
        if nodeid in self.measure:
            return MEASURE
        return E2E if nodeid.startswith(E2E + "/") else nodeid

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
        if MEASURE in self.workqueue:
            self.held = self.workqueue.pop(MEASURE)

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
        """Once the queue is empty: one worker keeps going, the others are shut
        down (a worker keeps its last test until it gets more or is told to
        stop); when the others have finished, the one left gets the measuring tests."""
        self._hold_measure()
        if self.workqueue or self.held is None:
            return
        live = [n for n in self.assigned_work if not n.shutting_down]
        if self.measurer not in live:
            self.measurer = live[0] if live else None
        for node in live:
            if node is not self.measurer:
                node.shutdown()
        if self.measurer is None:
            return  # every worker is gone; xdist starts another and schedules again
        others = [w for n, w in self.assigned_work.items() if n is not self.measurer]
        if any(self._pending_of(w) for w in others) or self._pending_of(self.assigned_work[self.measurer]) > 1:
            return
        self.workqueue = OrderedDict([(MEASURE, self.held)])
        self.held = None
        super()._assign_work_unit(self.measurer)

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
        if node is self.measurer:
            self.measurer = None
        self._advance()
        return crashed
