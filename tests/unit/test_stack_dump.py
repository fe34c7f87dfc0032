"""`kill -USR1` on a gpuslice process (gpuslice/stack_dump.py): every thread's stack on
its stderr, again and again, while its threads' frames come and go, and it goes on."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

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
            assert any("(MainThread)" in h for h in headers) and any("(churn)" in h for h in headers), dump
            assert any("in busy" in x for x in dump) and any("in blocked" in x for x in dump), dump
            assert proc.poll() is None  # alive after each
    finally:
        proc.kill()
        proc.wait(10)
