"""`kill -USR1` on a gpuslice process (gpuslice/stack_dump.py): every thread's stack on
its stderr, again and again, while its threads' frames come and go, and it goes on."""

from __future__ import annotations

import io
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpuslice import stack_dump

pytestmark = pytest.mark.unit

CHILD = """
import signal, sys, threading
from gpuslice import stack_dump
assert stack_dump.dump_on(signal.SIGUSR1, sys.stderr)

def churn(depth):  # frames made and dropped as fast as the thread can
    return 0 if depth == 0 else churn(depth - 1) + 1

def busy():
    while True:
        churn(50)

def blocked():  # the main thread blocked, as a daemon's is, until the test lets go of stdin;
    print("ready", flush=True)  # "ready" from inside it, so every dump finds it here
    sys.stdin.buffer.read()

threading.Thread(target=busy, name="churn", daemon=True).start()
blocked()
"""


def test_every_thread_is_dumped_each_time_and_the_process_goes_on() -> None:
    root = Path(__file__).parents[2]
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.PIPE, text=True, cwd=root)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
    try:
        assert proc.stdout.readline() == "ready\n"
        for _ in range(30):
            proc.send_signal(signal.SIGUSR1)
            dump: list[str] = []
            while sum(x == "\n" for x in dump) < 3:  # three threads (main, churn, signal-relay), each section
                dump.append(lines.get(timeout=30))  # ends with an empty line
            headers = [x for x in dump if x.startswith("Thread 0x")]
            assert any(f"(MainThread, tid {proc.pid})" in h for h in headers), dump
            assert any("(churn, tid " in h for h in headers), dump
            assert any("in busy" in x for x in dump) and any("in blocked" in x for x in dump), dump
            assert proc.poll() is None  # alive after each
    finally:
        proc.kill()
        proc.wait(10)


def _blocked_in_a_context_manager(entered: threading.Event, leave: threading.Event) -> None:
    from contextlib import contextmanager

    @contextmanager
    def holding():  # a selftest's GPU thread waits inside such a generator, entering a slice
        entered.set()
        leave.wait(30)
        yield

    def checks() -> None:  # the function a reader of the dump looks for
        with holding():
            pass

    checks()


@pytest.mark.parametrize("memfd", [True, False], ids=["faulthandler", "without memfd"])
def test_a_thread_inside_a_context_manager_is_dumped_down_to_its_start(monkeypatch, memfd: bool) -> None:
    """Both ways of walking the stacks: faulthandler's, and the frames' own where no memfd can be made."""
    if not memfd:

        def refused(*_args: object) -> int:
            raise OSError(1, "memfd_create refused")

        monkeypatch.setattr(stack_dump.os, "memfd_create", refused)
    entered, leave = threading.Event(), threading.Event()
    t = threading.Thread(target=_blocked_in_a_context_manager, args=(entered, leave), name="gpu-0")
    t.start()
    try:
        assert entered.wait(30)
        out = io.StringIO()
        stack_dump.write_stacks(out)
    finally:
        leave.set()
        t.join(30)
    sections = out.getvalue().split("\n\n")
    mine = next(s for s in sections if f"(gpu-0, tid {t.native_id}) (most recent call first):" in s)
    calls = [line.rsplit(" in ", 1)[1] for line in mine.splitlines()[1:]]
    assert calls[-1] == "_bootstrap" and "checks" in calls and "holding" in calls, mine
    assert any(f"(MainThread, tid {os.getpid()})" in s for s in sections), out.getvalue()
