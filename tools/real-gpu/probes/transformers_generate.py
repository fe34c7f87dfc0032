"""A small Llama built from a config with random weights (no download),
generating NEW tokens for a batch of 4 prompts. argv: LIMIT NEW (the slice's
limit first, as the kit passes every memory probe; unused here).

On the H200 this probe read the limit as NEW and was asked for 4294967296
tokens: the "hang" of the first run was the kit's, not the slice's."""

from __future__ import annotations

import os
import time

from common import hold, main

MAX_NEW = 2048 - 64  # the model's positions less the prompt


def parse(argv: list[str]) -> int:
    """NEW from LIMIT NEW; one line naming what is wrong otherwise."""
    if len(argv) != 2 or not argv[1].isdigit() or not 0 < int(argv[1]) <= MAX_NEW:
        raise ValueError(f"argv LIMIT NEW with NEW from 1 to {MAX_NEW}, got {argv}")
    return int(argv[1])


def run(argv: list[str]) -> dict:
    new = parse(argv)
    import torch  # here, not above: the kit's tests read parse() where there is no torch
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                                   num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=16,
                                   max_position_embeddings=2048)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    prompts = torch.randint(0, cfg.vocab_size, (4, 64), device="cuda")
    start = time.monotonic()
    with torch.no_grad():
        out = model.generate(prompts, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    took = time.monotonic() - start
    first = torch.cuda.memory_stats()  # what the first run asked of the driver: allocations, retries after an OOM
    again = time.monotonic()
    with torch.no_grad():  # warm: what the first paid once (module loading, autotuning) is behind it
        model.generate(prompts, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    again = time.monotonic() - again
    hold("warm", pid=os.getpid())
    return {"new_tokens": int(out.shape[1] - prompts.shape[1]), "batch": 4, "seconds": took, "again_seconds": again,
            "parameters": sum(p.numel() for p in model.parameters()), "transformers": transformers.__version__,
            "peak_allocated": torch.cuda.max_memory_allocated(), **paths(torch),
            **{k: int(first.get(k, 0)) for k in ("num_device_alloc", "num_device_free", "num_alloc_retries",
                                                 "num_ooms")}}  # fmt: skip


def paths(torch) -> dict:  # type: ignore[no-untyped-def]
    """What a tiny op costs through each path a generate takes: launches alone, and a
    launch with a copy back to the host (a token's stopping check), in microseconds."""
    x = torch.zeros(16, device="cuda")
    for _ in range(100):
        x.add_(1)
    torch.cuda.synchronize()
    t = time.monotonic()
    for _ in range(20000):
        x.add_(1)
    torch.cuda.synchronize()
    launch = (time.monotonic() - t) / 20000 * 1e6
    t = time.monotonic()
    for _ in range(2000):
        x.add_(1)
        x[0].item()
    sync = (time.monotonic() - t) / 2000 * 1e6
    torch.cuda.empty_cache()  # each of these then asks the driver for memory (and the slice's ledger)
    t = time.monotonic()
    held = [torch.empty((2 << 20) + (i << 16), dtype=torch.uint8, device="cuda") for i in range(64)]
    torch.cuda.synchronize()
    malloc = (time.monotonic() - t) / len(held) * 1e6
    del held
    torch.cuda.empty_cache()
    return {"launch_us": launch, "launch_and_copy_us": sync, "malloc_us": malloc}


if __name__ == "__main__":
    main(run)
