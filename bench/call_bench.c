/* Cost per call of a libcuda (the interposer or the simulator behind it):
 * ns per call, and under callgrind the instructions of each measured loop
 * (CALLGRIND_DUMP_STATS_AT names them).  Prints "op ns_per_call" lines.
 * usage: call_bench LIBCUDA ITERATIONS */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <valgrind/callgrind.h>

#include "gpuslice_cuda.h"

typedef CUresult (*init_t)(unsigned);
typedef CUresult (*dev_get_t)(CUdevice *, int);
typedef CUresult (*retain_t)(CUcontext *, CUdevice);
typedef CUresult (*set_t)(CUcontext);
typedef CUresult (*get_t)(CUcontext *);
typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*free_t)(CUdeviceptr);
typedef CUresult (*load_t)(CUmodule *, const void *);
typedef CUresult (*getfn_t)(CUfunction *, CUmodule, const char *);
typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
typedef CUresult (*sync_t)(void);

static void *sym(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "call_bench: %s missing\n", name);
        exit(2);
    }
    return p;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

#define MEASURE(label, n, body)                                          \
    do {                                                                 \
        CALLGRIND_ZERO_STATS;                                            \
        CALLGRIND_TOGGLE_COLLECT;                                        \
        double t0_ = now();                                              \
        for (long i_ = 0; i_ < (n); i_++) {                              \
            body;                                                        \
        }                                                                \
        double t1_ = now();                                              \
        CALLGRIND_TOGGLE_COLLECT;                                        \
        CALLGRIND_DUMP_STATS_AT(label);                                  \
        printf("%s %.1f\n", label, (t1_ - t0_) / (double)(n));           \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    long n = atol(argv[2]);
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        fprintf(stderr, "call_bench: %s\n", dlerror());
        return 2;
    }
    CUdevice dev;
    CUcontext ctx, cur;
    CUmodule mod;
    CUfunction fn;
    if (((init_t)sym(h, "cuInit"))(0) || ((dev_get_t)sym(h, "cuDeviceGet"))(&dev, 0) ||
        ((retain_t)sym(h, "cuDevicePrimaryCtxRetain"))(&ctx, dev) || ((set_t)sym(h, "cuCtxSetCurrent"))(ctx) ||
        ((load_t)sym(h, "cuModuleLoadData"))(&mod, ".version 8.0\n.visible .entry k()\n{\n ret;\n}\n") ||
        ((getfn_t)sym(h, "cuModuleGetFunction"))(&fn, mod, "k")) {
        fprintf(stderr, "call_bench: setup failed\n");
        return 1;
    }
    get_t get = (get_t)sym(h, "cuCtxGetCurrent");
    alloc_t alloc = (alloc_t)sym(h, "cuMemAlloc_v2");
    free_t release = (free_t)sym(h, "cuMemFree_v2");
    launch_t launch = (launch_t)sym(h, "cuLaunchKernel");
    sync_t sync = (sync_t)sym(h, "cuCtxSynchronize");
    CUdeviceptr p;
    MEASURE("forwarded:cuCtxGetCurrent", n, get(&cur));
    MEASURE("cuMemAlloc+cuMemFree", n / 10, (alloc(&p, 1 << 16), release(p)));
    MEASURE("cuLaunchKernel", n / 10, launch(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    /* the same gate in front of a driver call that does almost nothing (a launch
     * the driver rejects at once): what the gate adds, without the model's noise */
    MEASURE("cuLaunchKernel:rejected", n, launch(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    sync();
    return 0;
}
