"""CuPy in a slice, with its default pool (cudaMalloc) or MemoryAsyncPool
(cudaMallocAsync, the driver's stream-ordered pools). argv: LIMIT POOL."""

from __future__ import annotations

import cupy as cp
from common import CHUNK, Memory, main, memory_run


class Cupy(Memory):
    def __init__(self, pool: str) -> None:
        if pool == "async":
            self.pool = cp.cuda.MemoryAsyncPool()
        elif pool == "default":
            self.pool = cp.get_default_memory_pool()
        else:
            raise ValueError(f"pool {pool!r}: default or async")
        cp.cuda.set_allocator(self.pool.malloc)

    def warm(self) -> None:
        a = cp.random.rand(512, 512, dtype=cp.float32)
        float((a @ a).sum())

    def info(self) -> dict:
        free, total = cp.cuda.runtime.memGetInfo()
        return {"free": free, "total": total, "cupy": cp.__version__}

    def alloc(self) -> object:
        x = cp.empty(CHUNK, dtype=cp.uint8)
        cp.cuda.Device().synchronize()  # an async pool allocates in stream order
        return x

    def is_oom(self, e: BaseException) -> bool:
        return isinstance(e, cp.cuda.memory.OutOfMemoryError) or "cudaErrorMemoryAllocation" in str(e)

    def release(self) -> None:
        cp.cuda.Device().synchronize()
        self.pool.free_all_blocks()
        cp.cuda.Device().synchronize()


if __name__ == "__main__":
    main(lambda argv: memory_run(Cupy(argv[1]), int(argv[0])))
