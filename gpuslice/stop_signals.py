"""A long-running component stopped by SIGTERM or SIGINT, through an event; a command
stopped by SIGTERM or SIGHUP, by an exception raised in its main thread.

The event is set by the signal relay's thread (signal_relay.py), not in a
handler: a Python handler runs only in the main thread, and a main thread asleep
in the event's `wait()` does not run it for a SIGTERM the kernel delivered to
another thread (a node agent did not stop within 90 s, CI at 99c9a2f); a handler
that set the event could also wait forever for the lock its own thread holds
inside the event's wait (tests/unit/test_stop_signals.py makes both happen)."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable

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


WAKE = signal.SIGUSR2  # the relay's word to the main thread; nothing else here uses it


def raise_on_signals(
    exception: Callable[[signal.Signals], BaseException],
    signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGHUP),
) -> None:
    """From now on the first of `signals` raises `exception(signal)` in the main thread,
    as Ctrl-C raises KeyboardInterrupt, so a command unwinds through its `finally`s. Later
    ones are let be: a second raise would cut that unwinding short. Call it from the main
    thread.

    The kernel may give the signal to any thread, and a Python handler runs only in the
    main thread, once it runs: a main thread asleep waiting for a worker's result would
    sleep on. So the relay's thread, which gets them all, sends the main thread a signal
    of its own (pthread_kill), which ends its wait (EINTR) and raises there."""
    once = _RaiseOnce(exception, threading.main_thread().ident or 0)
    signal.signal(WAKE, once.raise_in_main)
    for s in signals:
        if not signal_relay.on_signal(s, functools.partial(once.stop, s)):
            log.warning("the interpreter's wakeup fd is taken: %s is acted on only once the main thread runs", s.name)
            signal.signal(s, once.raise_at_once)


class _RaiseOnce:
    def __init__(self, exception: Callable[[signal.Signals], BaseException], main: int) -> None:
        self._exception = exception
        self._main = main
        self._lock = threading.Lock()
        self._stopped_by: signal.Signals | None = None
        self._raised = False

    def stop(self, signum: signal.Signals) -> None:
        """In the relay's thread: the first stop signal wakes the main thread."""
        with self._lock:
            if self._stopped_by is not None:
                return
            self._stopped_by = signum
        signal.pthread_kill(self._main, WAKE)

    def raise_in_main(self, _signum: int, _frame: object) -> None:
        if self._stopped_by is None or self._raised:  # a WAKE from elsewhere, or said already
            return
        self._raised = True
        raise self._exception(self._stopped_by)

    def raise_at_once(self, signum: int, _frame: object) -> None:
        self._stopped_by = self._stopped_by or signal.Signals(signum)
        self.raise_in_main(signum, _frame)
