"""SIGTERM while the main thread is inside the stop event's own wait (gpuslice/stop_signals.py).

A Python process whose main thread holds a `threading.Event`'s lock, as `Event.wait()` does
for a few bytecodes on the way in and out, gets SIGTERM. Its handler runs right there."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.harness import REPO

pytestmark = pytest.mark.unit

PROGRAM = textwrap.dedent("""
    import os, signal, sys, threading
    from gpuslice import stop_signals
    ev = threading.Event()
    if sys.argv[1] == "handler sets the event":  # what the daemon, the node agent and app.serve did
        signal.signal(signal.SIGTERM, lambda *_: ev.set())
    else:
        stop_signals.set_on_signals(ev)
    with ev._cond:  # where Event.wait() holds its lock
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs between two of these bytecodes
            pass
    print("stopped" if ev.wait(60) else "not stopped", flush=True)
""")


def run(how: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROGRAM, how], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)  # fmt: skip


def test_a_handler_that_sets_the_event_itself_hangs_for_good():
    """The fault, made to happen: the handler waits for the lock its own thread holds. CI's node
    agent did not stop within 90 s of SIGTERM (f007d39); a kubelet would have killed it before its
    undo."""
    with pytest.raises(subprocess.TimeoutExpired):  # its 60 s wait would have ended it otherwise
        run("handler sets the event", timeout=5)


def test_the_stop_signals_set_the_event_from_a_thread_of_their_own():
    r = run("through a pipe", timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, "stopped\n", "")
