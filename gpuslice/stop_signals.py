"""A long-running component stopped by SIGTERM or SIGINT, through an event.

A Python signal handler runs in the main thread between any two of its
bytecodes, those in which the main thread holds the event's own lock inside
`Event.wait()` included: a handler that sets the event there waits for that
lock forever, and so does every later SIGTERM's (tests/unit/test_stop_signals.py
makes it happen). Only SIGKILL ends it, and a node agent killed so cannot undo
what it wrote on the host. So the handler only writes a byte to a pipe, which
takes no lock, and a thread of its own sets the event."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def set_on_signals(event: threading.Event, signals: Iterable[signal.Signals] = STOP_SIGNALS) -> None:
    """From now on, any of `signals` sets `event` (call it from the main thread)."""
    r, w = os.pipe()
    os.set_blocking(w, False)

    def handler(_signum: int, _frame: object) -> None:
        with contextlib.suppress(BlockingIOError):  # a pipe already full has said it
            os.write(w, b"x")

    def relay() -> None:
        os.read(r, 1)
        event.set()

    threading.Thread(target=relay, name="stop-signals", daemon=True).start()
    for s in signals:
        signal.signal(s, handler)
