"""A tenant: bf16 matrix products back to back for SECONDS, counted per second
of wall time; with IDLE_AFTER > 0 it stops launching after that many seconds
and stays alive, idle (an elastic share's give-back); with LIGHT_PER_S > 0 it
does no more than that many products a second until RISE_AT, then as many as
it can (a light slice that lends what it leaves, then claims its share).
argv: SECONDS [IDLE_AFTER [LIGHT_PER_S RISE_AT]]."""

from __future__ import annotations

import os
import time

import torch
from common import hold, main

N = 4096
SYNC_EVERY = 4  # products between synchronizations: each counted in the second it completed


def run(argv: list[str]) -> dict:
    seconds = float(argv[0])
    idle_after = float(argv[1]) if len(argv) > 1 else 0.0
    light_per_s, rise_at = (float(argv[2]), float(argv[3])) if len(argv) > 3 else (0.0, 0.0)
    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    for _ in range(8):
        a @ b
    torch.cuda.synchronize()
    hold("ready", pid=os.getpid())
    per_second = [0] * (int(seconds) + 1)
    start, done = time.monotonic(), 0
    while (now := time.monotonic() - start) < seconds:
        if idle_after and now >= idle_after:
            time.sleep(min(0.1, seconds - now))
            continue
        if light_per_s and now < rise_at and done > light_per_s * now:  # ahead of its light rate
            time.sleep(min(done / light_per_s, rise_at, seconds) - now)
            continue
        for _ in range(SYNC_EVERY):
            a @ b
        torch.cuda.synchronize()
        per_second[min(int(time.monotonic() - start), len(per_second) - 1)] += SYNC_EVERY
        done += SYNC_EVERY
    return {"per_second": per_second[: int(seconds)], "n": N, "flop_per_product": 2 * N**3}


if __name__ == "__main__":
    main(run)
