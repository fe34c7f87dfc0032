"""What every probe shares. A probe runs inside a slice (its own pid
namespace, the CDI layout's environment) and talks to the kit in JSON lines:
`{"hold": TAG, ...}` then waits for one line on stdin while the kit samples
the slice's charge and the driver's view of this process; `{"result": {...}}`
last. An error is `{"error": "..."}`, the probe's exit status 1."""

from __future__ import annotations

import faulthandler
import json
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

# a probe that does not answer: the kit sends SIGUSR1 and reads every thread's Python stack on stderr
faulthandler.register(signal.SIGUSR1, all_threads=True)

MiB = 1 << 20
CHUNK = 64 * MiB  # the tolerance: OOM within one chunk of the limit


def say(**fields: Any) -> None:
    print(json.dumps(fields, default=str), flush=True)


def hold(tag: str, **fields: Any) -> None:
    say(hold=tag, **fields)
    sys.stdin.readline()


def fill(alloc: Callable[[], object], is_oom: Callable[[BaseException], bool], limit: int) -> tuple[list, str]:
    """Allocate CHUNK at a time until the framework refuses; (what it gave, the
    refusal's first line). Stops at twice the limit so a lost limit cannot
    take the GPU."""
    held: list = []
    while len(held) * CHUNK < 2 * limit:
        try:
            held.append(alloc())
        except Exception as e:
            if not is_oom(e):
                raise
            return held, f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
    return held, "no OOM before twice the limit"


def main(run: Callable[[list[str]], dict]) -> None:
    try:
        out = run(sys.argv[1:])
    except Exception as e:
        say(error=f"{type(e).__name__}: {e}", trace=traceback.format_exc()[-2000:])
        sys.exit(1)
    say(result=out)


def timed(fn: Callable[[], object], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


class Memory:
    """A framework's side of the memory scenario."""

    def warm(self) -> None: ...
    def info(self) -> dict: ...  # its own view: at least free and total
    def alloc(self) -> object: ...
    def is_oom(self, e: BaseException) -> bool: ...
    def release(self) -> None: ...


def memory_run(fw: Memory, limit: int) -> dict:
    """Warm up, show the view, fill to the refusal, give it all back; the kit
    samples the slice at each hold."""
    fw.warm()
    view = fw.info()
    hold("warm", **view)
    held, refusal = fill(fw.alloc, fw.is_oom, limit)
    allocated = len(held) * CHUNK
    hold("full", allocated=allocated, refusal=refusal)
    del held[:]
    fw.release()
    after = fw.info()
    hold("freed", **after)
    return {"view": view, "allocated": allocated, "refusal": refusal, "after": after}
