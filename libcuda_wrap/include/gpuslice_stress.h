/* What the threaded stress programs share (sim/tests/sim_stress.c against the
 * simulator, libcuda_wrap/tests/wrap_stress.c against the interposer): the
 * driver entry points both call, and CHECK, which ends the program with the
 * call and its answer on anything but CUDA_SUCCESS. */
#ifndef GPUSLICE_STRESS_H
#define GPUSLICE_STRESS_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>

#include "gpuslice_cuda.h"

CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuStreamSynchronize(CUstream);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                        void **, void **);
CUresult cuEventCreate(CUevent *, unsigned);
CUresult cuEventRecord(CUevent, CUstream);
CUresult cuEventSynchronize(CUevent);
CUresult cuEventDestroy_v2(CUevent);

#define CHECK(x)                                                              \
    do {                                                                      \
        CUresult r_ = (x);                                                    \
        if (r_ != CUDA_SUCCESS) {                                             \
            fprintf(stderr, "%s:%d: %s -> %d\n", __FILE__, __LINE__, #x, r_); \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

#define STRESS_THREADS 8

/* Runs `worker` on STRESS_THREADS threads (each given its number, from 1), waits
 * for them and then for the forked `child`: 0, or 1 with a line if the child failed. */
static inline int stress_threads_and_child(void *(*worker)(void *), pid_t child)
{
    pthread_t t[STRESS_THREADS];
    for (uintptr_t i = 0; i < STRESS_THREADS; i++)
        pthread_create(&t[i], NULL, worker, (void *)(i + 1));
    for (int i = 0; i < STRESS_THREADS; i++)
        pthread_join(t[i], NULL);
    int status;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "fork child failed: %d\n", status);
        return 1;
    }
    return 0;
}

#endif
