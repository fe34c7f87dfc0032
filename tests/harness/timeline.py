"""Where a run's time went, printed at its end: for each worker and each of
its groups of tests (e2e, measure, the rest: tests/harness/scheduling.py's
phases) how many ran, from when to when since the session began, and how
long they took together. The suite's budget is its wall time, so what bounds
it (the e2e worker's chain, or the measuring tests alone at the end) can be
read off any CI log, not guessed from the slowest tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.harness.scheduling import E2E, MEASURE


@dataclass
class Span:
    tests: int = 0
    first: float = float("inf")
    last: float = float("-inf")
    busy: float = 0.0

    def add(self, start: float, stop: float, new_test: bool) -> None:
        self.tests += new_test
        self.first = min(self.first, start)
        self.last = max(self.last, stop)
        self.busy += stop - start


def group(nodeid: str, keywords: Any) -> str:
    if MEASURE in keywords:
        return MEASURE
    return "e2e" if nodeid.startswith(E2E + "/") else "other"


@dataclass
class Timeline:
    began: float
    spans: dict[tuple[str, str], Span] = field(default_factory=dict)  # (worker, group) -> its span

    def add(self, report: Any) -> None:
        """A report of a test's setup, call or teardown, from whichever worker ran it."""
        start, stop = getattr(report, "start", 0.0), getattr(report, "stop", 0.0)
        if not start or stop < start:
            return  # a report that carries no times (collection, a worker's crash)
        node = getattr(report, "node", None)
        worker = node.gateway.id if node is not None else "main"
        span = self.spans.setdefault((worker, group(report.nodeid, report.keywords)), Span())
        span.add(start, stop, new_test=report.when == "setup")

    def lines(self, ended: float) -> list[str]:
        out = [f"the run took {ended - self.began:.0f} s; each worker's tests, in seconds since it began:"]
        for (worker, name), s in sorted(self.spans.items(), key=lambda kv: (kv[1].first, kv[0])):
            out.append(
                f"  {worker:5} {name:7} {s.tests:4} tests  {s.first - self.began:6.0f} → {s.last - self.began:6.0f}"
                f"  (busy {s.busy:.0f} s)"
            )
        return out
