/* Threads hammering the simulated driver: allocations, copies, launches,
 * streams and events from 8 threads at once, plus a fork; built with ASan/UBSan
 * and with TSan (make check-sanitizers).  Exits non-zero on any wrong answer. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpuslice_stress.h"

static CUcontext ctx;
static CUfunction fn;

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    CHECK(cuCtxSetCurrent(ctx));
    CUstream s;
    CUevent ev;
    CHECK(cuStreamCreate(&s, 0));
    CHECK(cuEventCreate(&ev, 0));
    unsigned char buf[256];
    for (int i = 0; i < 400; i++) {
        size_t n = 1 + (size_t)(rand_r(&seed) % (1 << 20));
        CUdeviceptr p;
        if (i % 2)
            CHECK(cuMemAlloc_v2(&p, n));
        else
            CHECK(cuMemAllocAsync(&p, n, s));
        CHECK(cuMemsetD8_v2(p, (unsigned char)i, n));
        CHECK(cuMemcpyDtoH_v2(buf, p + (n > sizeof buf ? n - sizeof buf : 0), n < sizeof buf ? n : sizeof buf));
        if (buf[0] != (unsigned char)i) {
            fprintf(stderr, "copy returned %d, wrote %d\n", buf[0], i & 0xff);
            exit(1);
        }
        CHECK(cuLaunchKernel(fn, 1 + (unsigned)(rand_r(&seed) % 64), 1, 1, 128, 1, 1, 0, s, NULL, NULL));
        CHECK(cuEventRecord(ev, s));
        if (i % 2)
            CHECK(cuMemFree_v2(p));
        else
            CHECK(cuMemFreeAsync(p, s));
        if (i % 50 == 0)
            CHECK(cuEventSynchronize(ev));
    }
    CHECK(cuStreamSynchronize(s));
    CHECK(cuEventDestroy_v2(ev));
    CHECK(cuStreamDestroy_v2(s));
    return NULL;
}

int main(void)
{
    CUdevice dev;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, ".version 8.0\n.target sm_80\n.visible .entry k()\n{\n ret;\n}\n"));
    CHECK(cuModuleGetFunction(&fn, mod, "k"));
    size_t free0, total;
    CHECK(cuMemGetInfo_v2(&free0, &total));

    /* fork before the threads start: forking a threaded process can hang
     * under TSan's own locks */
    pid_t child = fork();
    if (child == 0) { /* the child starts uninitialised and gets its own slot */
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, 16) != CUDA_ERROR_NOT_INITIALIZED)
            _exit(3);
        CUcontext c;
        if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c) || cuMemAlloc_v2(&p, 1 << 20))
            _exit(4);
        _exit(0);
    }
    if (stress_threads_and_child(worker, child))
        return 1;
    CHECK(cuCtxSynchronize());
    size_t free1;
    CHECK(cuMemGetInfo_v2(&free1, &total));
    if (free1 != free0) { /* the dead child's megabyte is reclaimed too */
        fprintf(stderr, "leak: free %zu before, %zu after\n", free0, free1);
        return 1;
    }
    CHECK(cuDevicePrimaryCtxRelease_v2(dev));
    puts("sim_stress: ok");
    return 0;
}
