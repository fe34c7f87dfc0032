"""Random allocations and frees through cuda.bindings, by several paths;
prints how many fitted-looking requests were refused."""

from __future__ import annotations

import json
import random
import sys

from cuda.bindings import driver as cu


def main() -> None:
    iterations, max_hold, max_size, seed = (int(a) for a in sys.argv[1:5])
    rnd = random.Random(seed)
    assert cu.cuInit(0)[0] == 0
    _, dev = cu.cuDeviceGet(0)
    _, ctx = cu.cuDevicePrimaryCtxRetain(dev)
    cu.cuCtxSetCurrent(ctx)
    _, stream = cu.cuStreamCreate(0)
    held: list[tuple[str, int]] = []
    refused = allocs = 0
    for _ in range(iterations):
        if held and (len(held) >= max_hold or rnd.random() < 0.45):
            path, ptr = held.pop(rnd.randrange(len(held)))
            err = cu.cuMemFreeAsync(ptr, stream)[0] if path == "async" else cu.cuMemFree(ptr)[0]
            assert err == 0, err
            continue
        size = rnd.randint(1, max_size)
        path = rnd.choice(["mem", "async", "managed"])
        if path == "mem":
            err, ptr = cu.cuMemAlloc(size)
        elif path == "async":
            err, ptr = cu.cuMemAllocAsync(size, stream)
        else:
            err, ptr = cu.cuMemAllocManaged(size, cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL)
        allocs += 1
        if err == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            refused += 1
        else:
            assert err == 0, err
            held.append((path, ptr))
    for path, ptr in held:
        assert (cu.cuMemFreeAsync(ptr, stream)[0] if path == "async" else cu.cuMemFree(ptr)[0]) == 0
    cu.cuStreamSynchronize(stream)
    print(json.dumps({"allocs": allocs, "refused": refused}))


if __name__ == "__main__":
    main()
