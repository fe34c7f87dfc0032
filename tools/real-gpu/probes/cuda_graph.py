"""A CUDA graph captured from a few bf16 layers and replayed for SECONDS
(under a hard share the kit measures what it gets); the replay must give what
the eager run gives. argv: SECONDS."""

from __future__ import annotations

import os
import time

import torch
from common import hold, main


def run(argv: list[str]) -> dict:
    seconds = float(argv[0])
    torch.manual_seed(0)
    x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    ws = [torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16) / 45 for _ in range(4)]

    def layers(v: torch.Tensor) -> torch.Tensor:
        for w in ws:
            v = torch.relu(v @ w)
        return v

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the default stream, as capture requires
        for _ in range(3):
            layers(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = layers(x)
    eager = layers(x)
    graph.replay()
    torch.cuda.synchronize()
    same = bool(torch.allclose(y.float(), eager.float(), rtol=1e-2, atol=1e-2))
    hold("ready", pid=os.getpid())
    replays, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        for _ in range(10):
            graph.replay()
        torch.cuda.synchronize()
        replays += 10
    return {"same_as_eager": same, "replays": replays, "seconds": time.monotonic() - start}


if __name__ == "__main__":
    main(run)
