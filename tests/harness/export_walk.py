"""Call every name of an export list once, each in a forked child with zero
arguments, and print {name: answer} as JSON: the return code, "absent" when
the library lacks the name, "signal N" when the call crashed, "timeout" when
it did not return in 2 s.  Run as a script in the environment under test:

    python -m tests.harness.export_walk LIBRARY INIT NAMES_FILE
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys


def call_in_child(fn) -> str:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        signal.alarm(2)
        rc = fn(0, 0, 0, 0, 0, 0)
        os.write(write, str(rc).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        answer = pipe.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "timeout" if os.WTERMSIG(status) == signal.SIGALRM else f"signal {os.WTERMSIG(status)}"
    return answer


def walk(library: str, init: str, names: list[str]) -> dict[str, str]:
    lib = ctypes.CDLL(library)
    getattr(lib, init)(0)
    answers = {}
    for name in names:
        try:
            fn = getattr(lib, name)
        except AttributeError:
            answers[name] = "absent"
            continue
        fn.restype = ctypes.c_int
        answers[name] = call_in_child(fn)
    return answers


if __name__ == "__main__":
    library, init, names_file = sys.argv[1:4]
    with open(names_file) as listed:
        names = listed.read().split()
    json.dump(walk(library, init, names), sys.stdout)
