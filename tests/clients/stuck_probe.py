"""A kit probe that never answers: a context in its slice, then it waits
forever in a function the stacks name (the kit's overrun record is tested on it)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "real-gpu" / "probes"))

from common import say
from cuda.bindings import driver as cu


def wait_forever() -> None:
    while True:
        time.sleep(0.05)


if __name__ == "__main__":
    cu.cuInit(0)
    err, dev = cu.cuDeviceGet(0)
    err, ctx = cu.cuDevicePrimaryCtxRetain(dev)
    cu.cuCtxSetCurrent(ctx)
    say(started=True)  # not a hold, not a result: the kit waits on
    wait_forever()
