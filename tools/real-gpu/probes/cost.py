"""What the interposer costs a PyTorch job (the kit runs this with and without
it, interleaved): a training step of a small MLP, and the time to launch a
tiny kernel (the median of batches, so a preemption does not count)."""

from __future__ import annotations

import statistics
import time

import torch
from common import main


def training_step_ms(steps: int = 40) -> float:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(2048, 2048), torch.nn.ReLU())]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(512, 2048, device="cuda")
    times = []
    for i in range(steps + 5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        torch.cuda.synchronize()
        if i >= 5:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def launch_ns(batches: int = 20, per_batch: int = 2000) -> float:
    x = torch.zeros(1, device="cuda")
    for _ in range(per_batch):
        x.add_(1)
    torch.cuda.synchronize()
    times = []
    for _ in range(batches):
        start = time.perf_counter_ns()
        for _ in range(per_batch):
            x.add_(1)
        times.append((time.perf_counter_ns() - start) / per_batch)
        torch.cuda.synchronize()
    return statistics.median(times)


if __name__ == "__main__":
    main(lambda argv: {"step_ms": training_step_ms(), "launch_ns": launch_ns()})
