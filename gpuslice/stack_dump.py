"""`kill -USR1 <pid>` on a gpuslice process: every thread's Python stack to its
stderr, and it goes on (a daemon, node agent or selftest that seems stuck says
where each thread is).

faulthandler.register(all_threads=True) does this inside the signal handler,
reading the other threads' frames without the GIL while they change: a daemon
dumped that way stopped mid-stack (`line ??? in fits`) and was gone before the
next call (CI at d9afd44). Here the handler only writes a byte: the
interpreter's wakeup fd, which its C-level handler writes even while the main
thread is blocked. A thread of its own reads it and formats the stacks under
the GIL, from frames that cannot change under it."""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from typing import TextIO


def dump_on(signum: signal.Signals, file: TextIO) -> bool:
    """From now on `signum` writes every thread's stack to `file`; False where it cannot
    be set up (not the main thread, or the wakeup fd already someone else's)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    r, w = os.pipe()
    os.set_blocking(w, False)  # the C handler must never block; a full pipe has said it already
    if signal.set_wakeup_fd(w, warn_on_full_buffer=False) != -1:  # another's: leave it to them
        signal.set_wakeup_fd(-1)
        os.close(r)
        os.close(w)
        return False
    signal.signal(signum, _nothing)  # a handler of Python's own, so its C handler runs and writes the fd
    threading.Thread(target=_serve, args=(r, int(signum), file), name="stack-dump", daemon=True).start()
    return True


def _nothing(_signum: int, _frame: object) -> None:
    """The dump is the stack-dump thread's; the main thread has nothing to do."""


def _serve(r: int, signum: int, file: TextIO) -> None:
    while data := os.read(r, 64):  # a byte per signal the interpreter caught (any of them)
        if signum in data:
            write_stacks(file)


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
