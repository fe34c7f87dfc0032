"""The slice socket: identity by SO_PEERCRED and pid namespace, ledger fds,
usage zeroed when a process dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.harness import REPO
from tests.harness.machine import GiB, needs_root
from tests.harness.slice_socket import CLIENT, read_reply, run_client


@needs_root
def test_container_process_gets_its_slice_and_dies_to_zero_usage(daemon, containers):
    d = daemon()
    c = d.client()
    box = containers()
    c.reserve("box", {"gpuslice.io/memory": "2Gi", "gpuslice.io/cores": "50"})
    c.bind("box", box.init_pid)
    proc = run_client(box, d.slice_socket, GiB, linger=60)
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
    assert read_reply(run_client(box, d.slice_socket, 2 * GiB))["charged"] is False
    # a process in a namespace bound to no slice learns nothing
    reply = read_reply(run_client(stranger, d.slice_socket, 1))
    assert reply["status"] == 1 and "no container with a GPU slice" in reply["message"]
    assert "limit" not in reply


def test_host_process_of_no_slice_is_refused(daemon):
    d = daemon()
    d.client().reserve("x", {"gpuslice.io/memory": "1Gi"})
    proc = subprocess.Popen(
        [sys.executable, str(CLIENT), str(d.slice_socket), "1"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
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
    proc = run_client(box, d.slice_socket, GiB, linger=60)
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


@needs_root
def test_a_version_3_process_attaches_and_charges_and_a_version_2_one_is_refused_in_one_line(daemon, containers):
    """A process started before an upgrade speaks version 3 and maps the usage file up to
    the gates: this daemon serves it (version 4 only appended `charged`)."""
    d = daemon()
    c = d.client()
    box = containers()
    c.reserve("box", {"gpuslice.io/memory": "2Gi"})
    c.bind("box", box.init_pid)
    proc = run_client(box, d.slice_socket, GiB, linger=60, version=3)
    reply = read_reply(proc)
    assert (reply["status"], reply["limit"], reply["charged"]) == (0, 2 * GiB, True), reply
    assert c.get("box").memory_used == GiB
    os.kill(reply["host_pid"], signal.SIGKILL)
    killed = time.monotonic()
    while c.get("box").memory_used and time.monotonic() - killed < 1.0:
        time.sleep(0.01)
    assert c.get("box").memory_used == 0 and c.get("box").processes == 0
    proc.wait(10)
    refused = read_reply(run_client(box, d.slice_socket, 1, version=2))
    assert refused["status"] == 2 and refused["message"] == "protocol version 2 unsupported; this daemon speaks 3 to 4"
