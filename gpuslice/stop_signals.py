"""A long-running component stopped by SIGTERM or SIGINT, through an event.

The event is set by the signal relay's thread (signal_relay.py), not in a
handler: a Python handler runs only in the main thread, and a main thread asleep
in the event's `wait()` does not run it for a SIGTERM the kernel delivered to
another thread (a node agent did not stop within 90 s, CI at 99c9a2f); a handler
that set the event could also wait forever for the lock its own thread holds
inside the event's wait (tests/unit/test_stop_signals.py makes both happen)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterable

from gpuslice import signal_relay

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def set_on_signals(event: threading.Event, signals: Iterable[signal.Signals] = STOP_SIGNALS) -> None:
    """From now on, any of `signals` sets `event` (call it from the main thread)."""
    signals = tuple(signals)
    if all(signal_relay.on_signal(s, event.set) for s in signals):
        return
    log.warning("the interpreter's wakeup fd is taken: a stop signal is acted on only once the main thread runs")
    _set_through_a_pipe(event, signals)


def _set_through_a_pipe(event: threading.Event, signals: tuple[signal.Signals, ...]) -> None:
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
