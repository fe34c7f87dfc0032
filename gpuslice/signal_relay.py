"""Signals a gpuslice process acts on, acted on by a thread of its own, whichever thread
the kernel delivered them to.

CPython runs a Python signal handler only in the main thread, between two of its
bytecodes. A signal the kernel delivers to another thread (any thread may get a
process-directed signal) leaves a main thread asleep in a lock asleep: a node agent
waiting in its stop event's `wait()` did not stop within 90 s of SIGTERM, and
stopped at once when a SIGUSR1 reached the main thread (CI at 99c9a2f). A handler
that does the work itself can also wait for good on a lock its own thread holds
(tests/unit/test_stop_signals.py). So nothing is done in a handler. The
interpreter's C-level handler, which runs in the thread that got the signal, writes
the signal's number to the wakeup fd; one thread reads it and calls what was
registered for that number. The wakeup fd is one per process, hence one reader for
every signal here (stack_dump.py, stop_signals.py)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

_lock = threading.Lock()
_callbacks: dict[int, list[Callable[[], None]]] = {}
_reader: threading.Thread | None = None


def on_signal(signum: signal.Signals, callback: Callable[[], None]) -> bool:
    """From now on each `signum` the process gets calls `callback` in the relay's thread.
    False where it cannot be set up: not the main thread, or the wakeup fd already set by
    someone else (an asyncio loop's, say)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    with _lock:
        if _reader is None and not _start_reader():
            return False
        _callbacks.setdefault(int(signum), []).append(callback)
    signal.signal(signum, _nothing)  # a handler of Python's own, so its C handler runs and writes the fd
    return True


def _start_reader() -> bool:
    global _reader
    r, w = os.pipe()
    os.set_blocking(w, False)  # the C handler must never block; a full pipe has said it already
    if signal.set_wakeup_fd(w, warn_on_full_buffer=False) != -1:  # another's: leave it to them
        signal.set_wakeup_fd(-1)
        os.close(r)
        os.close(w)
        return False
    _reader = threading.Thread(target=_serve, args=(r,), name="signal-relay", daemon=True)
    _reader.start()
    return True


def _nothing(_signum: int, _frame: object) -> None:
    """The relay's thread does the work; the main thread has nothing to do."""


def _serve(r: int) -> None:
    while data := os.read(r, 64):  # a byte per signal the interpreter caught
        for signum in data:
            with _lock:
                callbacks = list(_callbacks.get(signum, ()))
            for callback in callbacks:
                try:
                    callback()
                except Exception:  # one callback's fault must not end the relay for the others
                    log.exception("handling signal %d", signum)
