"""`kill -USR1 <pid>` on a gpuslice process: every thread's Python stack to its
stderr, and it goes on (a daemon, node agent or selftest that seems stuck says
where each thread is).

faulthandler.register(all_threads=True) does this inside the signal handler,
reading the other threads' frames without the GIL while they change: a daemon
dumped that way stopped mid-stack (`line ??? in fits`) and was gone before the
next call (CI at d9afd44). Here the handler does nothing, and the relay's thread
(signal_relay.py) calls faulthandler.dump_traceback holding the GIL, so no
thread's frames change under it. It walks the interpreter's own chain of frames:
walking frame objects' f_back instead, a CI run at 3dc6c7d got a selftest's two
GPU threads each cut off at a context manager's generator, with the function
that entered it (the one the test looked for) missing. faulthandler names no
thread, so each section gets its `threading` name here.
"""

from __future__ import annotations

import faulthandler
import os
import re
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
    """Each thread's stack, most recent call first, in faulthandler's layout with
    each thread's name and kernel thread id."""
    names = {t.ident: f"{t.name}, tid {t.native_id}" for t in threading.enumerate()}  # tid: as top -H shows it
    try:
        text = _faulthandler_dump()
    except OSError:  # no memfd (a seccomp profile): the frame objects' chain, as near as it gets
        text = _frames_dump()
    out = []
    for section in filter(None, text.strip("\n").split("\n\n")):
        head, _, body = section.partition("\n")
        m = HEADER.match(head)
        if m is None:  # not a thread's section (faulthandler's own note): as it is
            out.append(section + "\n")
            continue
        ident = int(m.group(1), 16)
        out.append(f"Thread 0x{ident:016x} ({names.get(ident, 'not a threading thread')}) (most recent call first):\n"
                   f"{body}\n")  # fmt: skip
    file.write("\n".join(out) + "\n")
    file.flush()


HEADER = re.compile(r"(?:Current thread|Thread) 0x([0-9a-f]+) \(most recent call first\):$")


def _faulthandler_dump() -> str:
    fd = os.memfd_create("gpuslice-stacks", os.MFD_CLOEXEC)  # no file anywhere, however read-only the root
    with open(fd, "w+") as f:
        faulthandler.dump_traceback(f, all_threads=True)
        f.seek(0)
        return f.read()


def _frames_dump() -> str:
    sections = []
    for ident, frame in sys._current_frames().items():
        calls = reversed(traceback.extract_stack(frame))
        lines = [f'  File "{f.filename}", line {f.lineno} in {f.name}' for f in calls]
        sections.append("\n".join([f"Thread 0x{ident:016x} (most recent call first):", *lines]))
    return "\n\n".join(sections)
