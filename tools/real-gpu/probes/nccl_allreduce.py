"""NCCL through PyTorch, one rank: an all-reduce of 64 MiB (the kit sets
NCCL_CUMEM_ENABLE=1: NCCL's buffers through cuMemCreate), then the process
group destroyed."""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
from common import hold, main


def run(argv: list[str]) -> dict:
    torch.cuda.set_device(0)
    with tempfile.TemporaryDirectory() as d:
        store = dist.FileStore(os.path.join(d, "store"), 1)
        dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0))
        x = torch.full((16 << 20,), 2.0, device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        same = bool((x == 2.0).all())
        hold("warm", pid=os.getpid())
        dist.destroy_process_group()
    del x
    torch.cuda.empty_cache()
    hold("freed")
    return {"all_reduce_right": same, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "cumem": os.environ.get("NCCL_CUMEM_ENABLE", "")}  # fmt: skip


if __name__ == "__main__":
    main(run)
