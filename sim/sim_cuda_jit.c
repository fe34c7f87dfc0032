/* Simulated driver: the PTX JIT compiler is a library of its own. The real
 * libcuda loads libnvidia-ptxjitcompiler.so.1 the first time it compiles PTX
 * (a module, a library or a link input given as PTX text) and answers
 * CUDA_ERROR_JIT_COMPILER_NOT_FOUND where the loader cannot find it: in a
 * container whose CDI spec mounts libcuda without it, PTX kernels (CuPy's,
 * NVRTC's, numba's) fail so. The simulator ships a stand-in of that library
 * beside its libcuda and loads it the same way, by its soname, so that the
 * container's view of the driver is tested, not assumed. Where the loader's
 * search does not find it, it is looked for beside this libcuda's file, as
 * loaded (not its link's target): what a node's loader cache does for a real
 * driver; in a container, that is where the CDI spec mounts the driver. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include "sim_cuda.h"

#define SONAME "libnvidia-ptxjitcompiler.so.1"

static void *load(void)
{
    void *h = dlopen(SONAME, RTLD_NOW | RTLD_LOCAL);
    Dl_info info;
    if (h || !dladdr((void *)sim_ptx_jit, &info) || !info.dli_fname)
        return h;
    char path[4096];
    const char *slash = strrchr(info.dli_fname, '/');
    if (!slash)
        return NULL;
    snprintf(path, sizeof path, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname, SONAME);
    return dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

CUresult sim_ptx_jit(void)
{
    /* once per process, as the real driver keeps the library loaded */
    static int state; /* 0 not tried, 1 loaded, 2 not found */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s == 0) {
        s = load() ? 1 : 2;
        if (s == 2)
            sim_log("PTX JIT: " SONAME " not found (by the loader's search, nor beside libcuda)");
        __atomic_store_n(&state, s, __ATOMIC_RELEASE);
    }
    return s == 1 ? CUDA_SUCCESS : CUDA_ERROR_JIT_COMPILER_NOT_FOUND;
}
