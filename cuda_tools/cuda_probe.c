/* gpuslice-cuda-probe: a CUDA driver-API program for containers.  It loads
 * libcuda.so.1 the way applications do, reports the memory it sees, then
 * allocates 64 MiB at a time until the driver says no.  One JSON line out.
 * usage: gpuslice-cuda-probe [CHUNK_MIB [HOLD_SECONDS]]   (env GPUSLICE_PROBE_LIBCUDA) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "gpuslice_cuda.h"

typedef CUresult (*init_t)(unsigned);
typedef CUresult (*dev_get_t)(CUdevice *, int);
typedef CUresult (*retain_t)(CUcontext *, CUdevice);
typedef CUresult (*set_t)(CUcontext);
typedef CUresult (*info_t)(size_t *, size_t *);
typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*name_t)(CUresult, const char **);

int main(int argc, char **argv)
{
    size_t chunk = (argc > 1 ? strtoull(argv[1], NULL, 10) : 64) << 20;
    /* GPUSLICE_PROBE_LIBCUDA loads a given library instead: a program that
     * bypasses the interposer, for testing what the driver enforces alone */
    const char *lib = getenv("GPUSLICE_PROBE_LIBCUDA");
    void *h = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("{\"error\": \"dlopen: %s\"}\n", dlerror());
        return 2;
    }
    name_t name = (name_t)dlsym(h, "cuGetErrorName");
    const char *err = "";
    CUdevice dev;
    CUcontext ctx;
    CUresult r = ((init_t)dlsym(h, "cuInit"))(0);
    if (!r)
        r = ((dev_get_t)dlsym(h, "cuDeviceGet"))(&dev, 0);
    if (!r)
        r = ((retain_t)dlsym(h, "cuDevicePrimaryCtxRetain"))(&ctx, dev);
    if (!r)
        r = ((set_t)dlsym(h, "cuCtxSetCurrent"))(ctx);
    size_t free_b = 0, total = 0;
    if (!r)
        r = ((info_t)dlsym(h, "cuMemGetInfo_v2"))(&free_b, &total);
    if (r) {
        name(r, &err);
        printf("{\"error\": \"%s\"}\n", err ? err : "?");
        return 1;
    }
    alloc_t alloc = (alloc_t)dlsym(h, "cuMemAlloc_v2");
    unsigned long long allocated = 0;
    CUdeviceptr p;
    while ((r = alloc(&p, chunk)) == CUDA_SUCCESS)
        allocated += chunk;
    name(r, &err);
    printf("{\"total\": %zu, \"free\": %zu, \"allocated\": %llu, \"then\": \"%s\"}\n", total, free_b, allocated,
           err ? err : "?");
    fflush(stdout);
    if (argc > 2) /* keep the memory a while, for whoever watches */
        sleep((unsigned)atoi(argv[2]));
    return 0;
}
