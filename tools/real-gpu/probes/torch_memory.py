"""PyTorch in a slice: its view, the caching allocator (or expandable segments,
which map VMM memory, when PYTORCH_CUDA_ALLOC_CONF says so) filled to the
refusal, everything given back. argv: LIMIT (bytes)."""

from __future__ import annotations

import torch
from common import CHUNK, Memory, main, memory_run


class Torch(Memory):
    def warm(self) -> None:
        a = torch.randn(512, 512, device="cuda")
        (a @ a).sum().item()  # cuBLAS's handle and workspace, as a real job has

    def info(self) -> dict:
        free, total = torch.cuda.mem_get_info()
        return {"free": free, "total": total, "torch": torch.__version__, "cuda": torch.version.cuda}

    def alloc(self) -> object:
        return torch.empty(CHUNK, dtype=torch.uint8, device="cuda")

    def is_oom(self, e: BaseException) -> bool:
        return isinstance(e, torch.OutOfMemoryError)

    def release(self) -> None:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(lambda argv: memory_run(Torch(), int(argv[0])))
