"""`kill -USR1 <pid>` on a gpuslice process: every thread's Python stack to its
stderr, and it goes on (a daemon, node agent or selftest that seems stuck says
where each thread is).

faulthandler.register(all_threads=True) does this inside the signal handler,
reading the other threads' frames without the GIL while they change: a daemon
dumped that way stopped mid-stack (`line ??? in fits`) and was gone before the
next call (CI at d9afd44). Here the handler does nothing: the relay's thread
(signal_relay.py) formats the stacks under the GIL, from frames that cannot
change under it."""

from __future__ import annotations

import signal
import sys
import threading
import traceback
from typing import TextIO

from gpuslice import signal_relay


def dump_on(signum: signal.Signals, file: TextIO) -> bool:
    """From now on `signum` writes every thread's stack to `file`; False where it cannot
    be set up (see signal_relay.on_signal)."""
    return signal_relay.on_signal(signum, lambda: write_stacks(file))


def write_stacks(file: TextIO) -> None:
    """Each thread's stack, most recent call first, in faulthandler's layout."""
    names = {t.ident: t.name for t in threading.enumerate()}
    lines = []
    for ident, frame in sys._current_frames().items():
        lines.append(f"Thread 0x{ident:016x} ({names.get(ident, 'not a threading thread')}) (most recent call first):")
        calls = reversed(traceback.extract_stack(frame))
        lines += [f'  File "{f.filename}", line {f.lineno} in {f.name}' for f in calls]
        lines.append("")
    file.write("\n".join(lines) + "\n")
    file.flush()
