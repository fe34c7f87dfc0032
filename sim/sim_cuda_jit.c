/* Simulated driver: the PTX JIT compiler is a library of its own. The real
 * libcuda loads libnvidia-ptxjitcompiler.so.1 the first time it compiles PTX
 * (a module, a library or a link input given as PTX text) and answers
 * CUDA_ERROR_JIT_COMPILER_NOT_FOUND where the loader cannot find it: in a
 * container whose CDI spec mounts libcuda without it, PTX kernels (CuPy's,
 * NVRTC's, numba's) fail so. The simulator ships a stand-in of that library
 * beside its libcuda and loads it the same way, by its soname, so that the
 * container's view of the driver is tested, not assumed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include "sim_cuda.h"

CUresult sim_ptx_jit(void)
{
    /* once per process, as the real driver keeps the library loaded */
    static int state; /* 0 not tried, 1 loaded, 2 not found */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s == 0) {
        s = dlopen("libnvidia-ptxjitcompiler.so.1", RTLD_NOW | RTLD_LOCAL) ? 1 : 2;
        if (s == 2)
            sim_log("PTX JIT: libnvidia-ptxjitcompiler.so.1 not found: %s", dlerror());
        __atomic_store_n(&state, s, __ATOMIC_RELEASE);
    }
    return s == 1 ? CUDA_SUCCESS : CUDA_ERROR_JIT_COMPILER_NOT_FOUND;
}
