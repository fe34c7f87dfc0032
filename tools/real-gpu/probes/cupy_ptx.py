"""CuPy running a kernel given as PTX text, which the driver JIT-compiles
through libnvidia-ptxjitcompiler: in a container that library is there only
if the CDI spec mounts it. argv: LIMIT (unused; the kit passes it first)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import cupy as cp
from common import main

# out[i] = in[i] + 1 for i < n: PTX for any GPU from Volta on
PTX = """.version 7.0
.target sm_70
.address_size 64
.visible .entry add_one(.param .u64 src, .param .u64 dst, .param .u32 n)
{
 .reg .pred %p;
 .reg .b32 %r<6>;
 .reg .f32 %f<3>;
 .reg .b64 %rd<8>;
 ld.param.u64 %rd1, [src];
 ld.param.u64 %rd2, [dst];
 ld.param.u32 %r1, [n];
 mov.u32 %r2, %ctaid.x;
 mov.u32 %r3, %ntid.x;
 mov.u32 %r4, %tid.x;
 mad.lo.s32 %r5, %r2, %r3, %r4;
 setp.ge.u32 %p, %r5, %r1;
 @%p bra DONE;
 cvta.to.global.u64 %rd3, %rd1;
 cvta.to.global.u64 %rd4, %rd2;
 mul.wide.u32 %rd5, %r5, 4;
 add.s64 %rd6, %rd3, %rd5;
 add.s64 %rd7, %rd4, %rd5;
 ld.global.f32 %f1, [%rd6];
 add.f32 %f2, %f1, 0f3F800000;
 st.global.f32 [%rd7], %f2;
DONE:
 ret;
}
"""


def run(argv: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "add_one.ptx"
        path.write_text(PTX)
        kernel = cp.RawModule(path=str(path)).get_function("add_one")  # cuModuleLoad: the driver's JIT
    n = 1 << 20
    src = cp.arange(n, dtype=cp.float32)
    dst = cp.empty_like(src)
    kernel(((n + 255) // 256,), (256,), (src, dst, cp.uint32(n)))
    right = bool((dst == src + 1).all())
    return {"right": right, "n": n, "cupy": cp.__version__}


if __name__ == "__main__":
    main(run)
