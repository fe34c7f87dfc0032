"""Shared fixtures: a simulated machine per test (config + state directory)
and client processes that drive it through NVIDIA's own Python clients.

Tests live in tiers, one directory each, and carry its marker: unit/ (pure
code, in-process), integration/ (the daemon, simulator, interposer and CLI as
real processes), e2e/ (real container runtimes, root).  `measure` marks the
timing-sensitive ones within a tier."""

from __future__ import annotations

import atexit
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from _pytest.pathlib import LOCK_TIMEOUT, make_numbered_dir_with_cleanup

import gpuslice_sim
from tests.harness import scheduling
from tests.harness.machine import Agent, Container, DaemonFactory, SimMachine, gpu
from tests.harness.timeline import Timeline

TIERS = ("unit", "integration", "e2e")


@pytest.fixture
def containers():
    made: list[Container] = []

    def make() -> Container:
        c = Container()
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


@pytest.fixture
def make_machine(tmp_path: Path):
    """make_machine(gpus=[...], topology=[...]) -> SimMachine with its own state."""
    count = 0

    def make(gpus: list[dict] | None = None, **top) -> SimMachine:
        nonlocal count
        count += 1
        config = tmp_path / f"sim{count}.yaml"
        config.write_text(yaml.safe_dump({"gpus": gpus or [gpu()], **top}))
        state = tmp_path / f"state{count}"
        env = {
            **os.environ,
            "LD_LIBRARY_PATH": str(gpuslice_sim.lib_dir()),
            "GPUSLICE_SIM_CONFIG": str(config),
            "GPUSLICE_SIM_STATE_DIR": str(state),
        }
        return SimMachine(config, state, env)

    return make


@pytest.fixture
def agents() -> Iterator:
    """agents(machine) -> a started client process; all are closed at the end."""
    started: list[Agent] = []

    def start(machine: SimMachine, init: bool = True, device: int = 0) -> Agent:
        a = Agent(machine.env)
        started.append(a)
        if init:
            a.call("init", device=device)
        return a

    yield start
    for a in started:
        a.close()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Temporary directories under a short root: the tests bind unix sockets
    below tmp_path (108 bytes at most, NUL included), and pytest-xdist adds a
    `popen-gwN` level to pytest's own /tmp/pytest-of-USER/pytest-N. The root
    keeps the last three runs, as pytest's does; a worker gets its
    controller's directory and needs none of its own."""
    if config.option.basetemp or hasattr(config, "workerinput"):
        return
    root = Path(tempfile.gettempdir()) / f"gs-{os.getuid()}"
    root.mkdir(mode=0o700, exist_ok=True)
    if root.is_symlink() or root.lstat().st_uid != os.getuid():
        raise pytest.UsageError(f"{root} is a link or another user's: remove it, or pass --basetemp")
    run = make_numbered_dir_with_cleanup(
        root=root, prefix="r", keep=3, lock_timeout=LOCK_TIMEOUT, mode=0o700, register=atexit.register
    )
    config.option.basetemp = str(run / "t")  # pytest empties a given basetemp; the run's lock stays beside it


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(str(item.path)).parent.name
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: a test belongs in one of tests/{{{','.join(TIERS)}}}/")
        item.add_marker(getattr(pytest.mark, tier))
    scheduling.write_ids(config, items)


_timeline = Timeline(time.time())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _timeline.add(report)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    """Where the run's time went (tests/harness/timeline.py): what bounds the suite's budget."""
    if hasattr(config, "workerinput") or not _timeline.spans:
        return
    terminalreporter.section("timeline")
    for line in _timeline.lines(time.time()):
        terminalreporter.write_line(line)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # type: ignore[no-untyped-def]
    scheduling.name_ids_file(node, Path(node.config.option.basetemp))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # type: ignore[no-untyped-def]
    """`dev.sh test` runs on pytest-xdist's workers: the measuring tests last and
    alone, every e2e test on one worker in order (tests/harness/scheduling.py)."""
    return scheduling.MeasureLast(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    """Under CI (CI=true: root, everything installed) nothing may skip: a skip
    there means a missing install step, so it is reported as a failure."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("CI") == "true" and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true (missing install step?): {report.longrepr}"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonFactory]:
    factory = DaemonFactory(tmp_path)
    yield factory
    factory.stop_all()


@pytest.fixture(scope="session")
def root_fs(tmp_path_factory) -> Path:
    """A busybox root filesystem with the CUDA probe, for real containers."""
    from gpuslice.cli import rootfs

    return rootfs.build(tmp_path_factory.mktemp("rootfs"))
