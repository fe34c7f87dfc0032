"""The slice socket: identity by SO_PEERCRED and pid namespace, ledger fds,
usage zeroed when a process dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import GiB

CLIENT = Path(__file__).parent / "clients" / "slice_client.py"
ROOT = Path(__file__).resolve().parents[1]

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create pid namespaces (unshare)")


class Container:
    """A process in a new pid namespace, standing for a container's init."""

    def __init__(self) -> None:
        self.unshare = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "sleep", "600"])
        deadline = time.monotonic() + 5
        self.init_pid = 0
        while not self.init_pid and time.monotonic() < deadline:
            children = Path(f"/proc/{self.unshare.pid}/task/{self.unshare.pid}/children").read_text().split()
            self.init_pid = int(children[0]) if children else 0
            time.sleep(0.02)
        assert self.init_pid, "unshare did not start its child"

    def run_client(self, socket: Path, charge: int, linger: float = 0) -> subprocess.Popen:
        return subprocess.Popen(
            [
                "nsenter",
                "--target",
                str(self.init_pid),
                "--pid",
                "--",
                sys.executable,
                str(CLIENT),
                str(socket),
                str(charge),
                str(linger),
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )

    def stop(self) -> None:
        self.unshare.kill()
        self.unshare.wait(10)


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


def read_reply(proc: subprocess.Popen) -> dict:
    assert proc.stdout
    line = proc.stdout.readline()
    assert line, "client printed nothing"
    return json.loads(line)


@needs_root
def test_container_process_gets_its_slice_and_dies_to_zero_usage(daemon, containers):
    d = daemon()
    c = d.client()
    box = containers()
    c.reserve("box", {"gpuslice.io/memory": "2Gi", "gpuslice.io/cores": "50"})
    c.bind("box", box.init_pid)
    proc = box.run_client(d.slice_socket, GiB, linger=60)
    reply = read_reply(proc)
    assert reply["status"] == 0, reply
    assert reply["limit"] == 2 * GiB and reply["charged"] is True
    assert reply["limits_writable"] is False
    view = c.get("box")
    assert view.memory_used == GiB and view.processes == 1

    os.kill(reply["host_pid"], signal.SIGKILL)
    killed = time.monotonic()
    while c.get("box").memory_used and time.monotonic() - killed < 1.0:
        time.sleep(0.01)
    assert c.get("box").memory_used == 0, "usage not zeroed within 1 s"
    assert c.get("box").processes == 0
    proc.wait(10)


@needs_root
def test_over_limit_charges_fail_and_other_namespaces_are_refused(daemon, containers):
    d = daemon()
    c = d.client()
    box, stranger = containers(), containers()
    c.reserve("box", {"gpuslice.io/memory": "1Gi"})
    c.bind("box", box.init_pid)
    assert read_reply(box.run_client(d.slice_socket, 2 * GiB))["charged"] is False
    # a process in a namespace bound to no slice learns nothing
    reply = read_reply(stranger.run_client(d.slice_socket, 1))
    assert reply["status"] == 1 and "no container with a GPU slice" in reply["message"]
    assert "limit" not in reply


def test_host_process_of_no_slice_is_refused(daemon):
    d = daemon()
    d.client().reserve("x", {"gpuslice.io/memory": "1Gi"})
    proc = subprocess.Popen(
        [sys.executable, str(CLIENT), str(d.slice_socket), "1"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    reply = read_reply(proc)
    assert reply["status"] == 1 and "limit" not in reply


@needs_root
def test_attached_processes_survive_a_daemon_restart(daemon, containers):
    d = daemon()
    c = d.client()
    box = containers()
    c.reserve("box", {"gpuslice.io/memory": "2Gi"})
    c.bind("box", box.init_pid)
    proc = box.run_client(d.slice_socket, GiB, linger=60)
    reply = read_reply(proc)
    d.kill()
    d = daemon.restart(d)
    c = d.client()
    assert c.get("box").memory_used == GiB  # the ledger files outlived the daemon
    os.kill(reply["host_pid"], signal.SIGKILL)
    deadline = time.monotonic() + 1.0
    while c.get("box").memory_used and time.monotonic() < deadline:
        time.sleep(0.01)
    assert c.get("box").memory_used == 0
    proc.wait(10)
