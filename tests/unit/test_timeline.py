"""The run's timeline (tests/harness/timeline.py): each worker's groups of
tests with their span and busy time, from the reports xdist hands back."""

from __future__ import annotations

from types import SimpleNamespace

from tests.harness.timeline import Timeline


def report(worker: str | None, nodeid: str, when: str, start: float, stop: float, *marks: str) -> SimpleNamespace:
    node = SimpleNamespace(gateway=SimpleNamespace(id=worker)) if worker else None
    return SimpleNamespace(node=node, nodeid=nodeid, when=when, start=start, stop=stop, keywords={m: 1 for m in marks})


def test_each_workers_groups_are_counted_spanned_and_summed_from_the_sessions_start():
    t = Timeline(1000.0)
    for r in (
        report("gw0", "tests/e2e/test_a.py::t", "setup", 1010, 1300),
        report("gw0", "tests/e2e/test_a.py::t", "call", 1300, 1320),
        report("gw0", "tests/e2e/test_a.py::t", "teardown", 1320, 1321),
        report("gw1", "tests/unit/test_b.py::t", "setup", 1005, 1005.5),
        report("gw1", "tests/unit/test_b.py::t", "call", 1005.5, 1006),
        report("gw1", "tests/integration/test_c.py::m", "setup", 1400, 1401, "measure"),
        report("gw1", "tests/integration/test_c.py::m", "call", 1401, 1430, "measure"),
        report("gw1", "tests/e2e/test_d.py::m", "call", 1430, 1440, "measure"),  # measuring outranks e2e
        report(None, "tests/unit/test_e.py::t", "setup", 0, 0),  # no times: not counted
    ):
        t.add(r)
    lines = t.lines(1500.0)
    assert lines[0].startswith("the run took 500 s")
    assert [line.split() for line in lines[1:]] == [
        ["gw1", "other", "1", "tests", "5", "→", "6", "(busy", "1", "s)"],
        ["gw0", "e2e", "1", "tests", "10", "→", "321", "(busy", "311", "s)"],
        ["gw1", "measure", "1", "tests", "400", "→", "440", "(busy", "40", "s)"],
    ]


def test_a_run_without_xdist_is_the_main_processs():
    t = Timeline(0.5)
    t.add(report(None, "tests/unit/test_e.py::t", "setup", 1.0, 2.0))
    assert t.lines(3.0)[1].split()[:2] == ["main", "other"]
