"""The suite's worker scheduling (tests/harness/scheduling.py), run by real
pytest-xdist on a small suite of its own: each test logs when and where it
ran, and the log shows what ran beside what."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import scheduling

pytestmark = pytest.mark.unit

CONFTEST = f"""
import importlib.util
import pytest

spec = importlib.util.spec_from_file_location("suite_scheduling", {str(Path(scheduling.__file__))!r})
scheduling = importlib.util.module_from_spec(spec)
spec.loader.exec_module(scheduling)


def pytest_collection_modifyitems(config, items):
    scheduling.write_ids(config, items)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    from pathlib import Path
    scheduling.name_ids_file(node, Path(node.config.option.basetemp))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return scheduling.MeasureLast(config, log)
"""

LOGGED = """
import os, time
import pytest

def logged(name, seconds):
    start = time.monotonic()
    time.sleep(seconds)
    with open(os.environ["RUN_LOG"], "a") as f:
        f.write(f"{{name}} {{os.environ['PYTEST_XDIST_WORKER']}} {{start}} {{time.monotonic()}}\\n")
"""


def suite(root: Path) -> None:
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    measure: timing-sensitive\n")
    (root / "conftest.py").write_text(CONFTEST)
    for d in ("tests", "tests/e2e", "tests/integration"):
        (root / d).mkdir(exist_ok=True)
        (root / d / "__init__.py").write_text("")
    e2e = [f"def test_e{i}():\n    logged('e{i}', 0.3)\n" for i in range(4)]
    e2e.insert(2, "@pytest.mark.measure\ndef test_e_measured():\n    logged('em', 0.1)\n")
    e2e.append("@pytest.mark.measure\ndef test_e_measured_too():\n    logged('em2', 0.1)\n")
    (root / "tests/e2e/test_e.py").write_text(LOGGED.format() + "\n".join(e2e))
    quick = [f"def test_i{i}():\n    logged('i{i}', {0.1 + 0.1 * (i % 3)})\n" for i in range(8)]
    (root / "tests/integration/test_i.py").write_text(LOGGED.format() + "\n".join(quick))
    measured = [f"def test_m{i}():\n    logged('m{i}', 0.1)\n" for i in range(2)]
    # an id with a space, as the compute mixes' ids have
    measured.append("@pytest.mark.parametrize('x', ['30/70 hard'])\ndef test_m2(x):\n    logged('m2', 0.1)\n")
    (root / "tests/integration/test_m.py").write_text(
        LOGGED.format() + "pytestmark = pytest.mark.measure\n" + "\n".join(measured)
    )


def run(root: Path, *args: str, rc: int = 0) -> tuple[list[tuple[str, str, float, float]], str]:
    """Each test's (name, worker, start, end) as it logged them, and pytest's output."""
    log = root / "run.log"
    log.unlink(missing_ok=True)
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3", *args],
        cwd=root,
        env={"PATH": "/usr/bin:/bin", "RUN_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == rc, r.stdout + r.stderr
    rows = [line.split() for line in log.read_text().splitlines()]
    return [(n, w, float(s), float(e)) for n, w, s, e in rows], r.stdout


MEASURED = {"em", "em2", "m0", "m1", "m2"}


def most_at_once(rows: list[tuple[str, str, float, float]]) -> int:
    edges = sorted([(r[2], 1) for r in rows] + [(r[3], -1) for r in rows])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def test_measuring_tests_run_last_on_two_workers_the_e2e_ones_in_order_and_e2e_on_one_worker(tmp_path):
    suite(tmp_path)
    rows, _ = run(tmp_path, "--basetemp", str(tmp_path / "t"))
    measured = [r for r in rows if r[0] in MEASURED]
    others = [r for r in rows if r not in measured]
    assert len(rows) == 17 and len(measured) == 5
    began = min(r[2] for r in measured)
    assert began >= max(r[2] for r in others)  # none begun once measuring has
    beside = [r for r in others if r[3] > began]  # the other measurer's held test, at most
    assert len(beside) <= 1 and not any(r[0].startswith("e") for r in beside), beside
    assert len({r[1] for r in measured}) == 2 and most_at_once(measured) <= 2  # two workers, two at a time
    e2e_measured = sorted((r for r in measured if r[0].startswith("em")), key=lambda r: r[2])
    assert [r[0] for r in e2e_measured] == ["em", "em2"] and len({r[1] for r in e2e_measured}) == 1
    e2e = sorted((r for r in others if r[0].startswith("e")), key=lambda r: r[2])
    assert len({r[1] for r in e2e}) == 1 and [r[0] for r in e2e] == ["e0", "e1", "e2", "e3"]
    assert len({r[1] for r in others}) >= 2  # the rest spread over the workers


def test_a_run_of_measuring_tests_only_runs_them_on_two_workers_and_ends(tmp_path):
    suite(tmp_path)
    rows, _ = run(tmp_path, "--basetemp", str(tmp_path / "t"), "-m", "measure")
    assert sorted(r[0] for r in rows) == sorted(MEASURED) and len({r[1] for r in rows}) <= 2
    assert most_at_once(rows) <= 2


def test_a_run_without_measuring_tests_is_plain_load_scheduling(tmp_path):
    suite(tmp_path)
    rows, _ = run(tmp_path, "--basetemp", str(tmp_path / "t"), "-m", "not measure")
    assert len(rows) == 12 and len({r[1] for r in rows}) >= 2


def test_a_worker_that_dies_in_a_measuring_test_fails_it_once_and_the_rest_run(tmp_path):
    suite(tmp_path)
    measured = tmp_path / "tests/integration/test_m.py"
    measured.write_text(measured.read_text() + "\ndef test_m_dies():\n    os._exit(3)\n\n"
                        "def test_m_after():\n    logged('ma', 0.1)\n")  # fmt: skip
    rows, out = run(tmp_path, "--basetemp", str(tmp_path / "t"), rc=1)
    assert out.count("FAILED tests/integration/test_m.py::test_m_dies") == 1 and "1 failed, 18 passed" in out, out
    others = [r for r in rows if r[0] not in MEASURED | {"ma"}]
    ma = next(r for r in rows if r[0] == "ma")
    assert ma[2] >= max(r[3] for r in others)  # on the worker that replaced it, still after the rest
