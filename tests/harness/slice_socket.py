"""A process in a container's box that attaches to the slice socket and
charges its slice (tests/clients/slice_client.py), and its one-line reply."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpuslice.cli.pid_namespace import first_child
from tests.harness import CLIENTS, REPO

CLIENT = CLIENTS / "slice_client.py"


def run_client(box, socket: Path, charge: int, linger: float = 0, version: int | None = None) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    argv = [sys.executable, str(CLIENT), str(socket), str(charge), str(linger)] + ([str(version)] if version else [])
    return subprocess.Popen(
        box.command(argv, cwd=str(REPO)),
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def read_reply(proc: subprocess.Popen) -> dict:
    """The client's reply, and its host pid (nsenter's child: inside, it knows only its namespace's)."""
    assert proc.stdout
    line = proc.stdout.readline()
    assert line, "client printed nothing"
    return {**json.loads(line), "host_pid": first_child(proc.pid)}
