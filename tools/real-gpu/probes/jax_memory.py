"""JAX in a slice: its allocator's limit (XLA's BFC, a fraction of what the
driver says the GPU has: here the slice), filled to the refusal. The kit sets
XLA_PYTHON_CLIENT_PREALLOCATE. argv: LIMIT."""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
from common import CHUNK, Memory, main, memory_run


class Jax(Memory):
    def __init__(self) -> None:
        self.device = jax.devices("gpu")[0]

    def warm(self) -> None:
        a = jnp.ones((512, 512), dtype=jnp.float32)
        (a @ a).block_until_ready()

    def info(self) -> dict:
        stats = self.device.memory_stats() or {}
        limit = int(stats.get("bytes_limit", 0))
        return {"free": limit - int(stats.get("bytes_in_use", 0)), "total": limit, "jax": jax.__version__,
                "stats": {k: int(v) for k, v in stats.items() if isinstance(v, int)}}  # fmt: skip

    def alloc(self) -> object:
        x = jnp.zeros((CHUNK,), dtype=jnp.uint8)
        x.block_until_ready()
        return x

    def is_oom(self, e: BaseException) -> bool:
        return "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower()

    def release(self) -> None:
        gc.collect()
        jax.clear_caches()


if __name__ == "__main__":
    main(lambda argv: memory_run(Jax(), int(argv[0])))
