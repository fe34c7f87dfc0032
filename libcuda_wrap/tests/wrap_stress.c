/* The interposer itself under ASan/UBSan and TSan (make wrap-stress), in front
 * of the simulator built with the same sanitizer and attached to a real slice
 * (tests/integration/test_sanitizers.py runs it in a container's box).
 *
 * After one fork (the child attaches on its own, from four threads at once),
 * 8 threads at once allocate and free through every kind of path the
 * interposer charges (cuMemAlloc, async, pool, VMM, managed, pitch, arrays),
 * launch through the slice's launch gate (directly and through a pointer from
 * cuGetProcAddress), capture, instantiate, launch, update and destroy graphs
 * (the exec cost table), and create, use and destroy contexts of their own.
 * Meanwhile 2 more threads ask the NVML interposer (linked too) for the
 * slice's memory, its processes (the compute lists, sized and not, and the
 * detail list), their utilization samples (both forms), their accounting
 * records and the GPU's utilization: every answer is the
 * slice's, and no row of another tenant (the test keeps a busy process
 * outside the slice) reaches the caller's memory, not even past the count.
 * At the end every charge is given back: the slice shows as much free as
 * before.  Exits non-zero on any wrong answer. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpuslice_nvml.h"
#include "gpuslice_stress.h"

CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *);
CUresult cuMemPoolDestroy(CUmemoryPool);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemGetAllocationGranularity(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemAddressReserve(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult cuMemAddressFree(CUdeviceptr, size_t);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
CUresult cuMemUnmap(CUdeviceptr, size_t);
CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArrayDestroy(CUarray);
CUresult cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGraphExecUpdate_v2(CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo *);
CUresult cuGraphExecDestroy(CUgraphExec);
CUresult cuGraphDestroy(CUgraph);
CUresult cuModuleUnload(CUmodule);
CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlShutdown(void);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t, unsigned *, nvmlProcessInfo_v1_t *);
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned *,
                                             unsigned long long);
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t, nvmlUtilization_t *);
nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t, nvmlProcessDetailList_t *);
nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t, nvmlProcessesUtilizationInfo_t *);
nvmlReturn_t nvmlDeviceGetAccountingPids(nvmlDevice_t, unsigned *, unsigned *);
nvmlReturn_t nvmlDeviceGetAccountingStats(nvmlDevice_t, unsigned, nvmlAccountingStats_t *);

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);

#define ROUNDS 240
#define MiB (1ull << 20)
static const char PTX[] = ".version 8.0\n.target sm_80\n.visible .entry k()\n{\n ret;\n}\n";

static CUdevice dev;
static CUcontext primary;
static CUfunction fn;

static const CUmemAllocationProp VMM_PROP = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                             .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};

/* Written, read back, given back: each path the interposer charges. */
static void alloc_and_free(int path, size_t n, CUstream s, CUmemoryPool pool, unsigned char mark)
{
    CUdeviceptr p = 0;
    unsigned char back = 0;
    switch (path) {
    case 0:
        CHECK(cuMemAlloc_v2(&p, n));
        CHECK(cuMemsetD8_v2(p, mark, n));
        CHECK(cuMemcpyDtoH_v2(&back, p + n - 1, 1));
        if (back != mark) {
            fprintf(stderr, "read back %d, wrote %d\n", back, mark);
            exit(1);
        }
        CHECK(cuMemFree_v2(p));
        return;
    case 1:
        CHECK(cuMemAllocAsync(&p, n, s));
        CHECK(cuMemFreeAsync(p, s));
        return;
    case 2:
        CHECK(cuMemAllocFromPoolAsync(&p, n, pool, s));
        CHECK(cuMemFreeAsync(p, s));
        return;
    case 3: {
        size_t g;
        CHECK(cuMemGetAllocationGranularity(&g, &VMM_PROP, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        size_t size = (n + g - 1) / g * g;
        CUmemGenericAllocationHandle h;
        CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        CHECK(cuMemCreate(&h, size, &VMM_PROP, 0));
        CHECK(cuMemAddressReserve(&p, size, 0, 0, 0));
        CHECK(cuMemMap(p, size, 0, h, 0));
        CHECK(cuMemSetAccess(p, size, &access, 1));
        CHECK(cuMemsetD8_v2(p, mark, size));
        CHECK(cuMemUnmap(p, size));
        CHECK(cuMemAddressFree(p, size));
        CHECK(cuMemRelease(h));
        return;
    }
    case 4:
        CHECK(cuMemAllocManaged(&p, n, CU_MEM_ATTACH_GLOBAL));
        CHECK(cuMemFree_v2(p));
        return;
    case 5: {
        size_t pitch;
        CHECK(cuMemAllocPitch_v2(&p, &pitch, 1 + n / 64, 64, 4));
        CHECK(cuMemFree_v2(p));
        return;
    }
    default: {
        CUarray a;
        CUDA_ARRAY_DESCRIPTOR d = {.Width = 1 + n / 256, .Height = 64, .Format = CU_AD_FORMAT_UNSIGNED_INT8,
                                   .NumChannels = 4};
        CHECK(cuArrayCreate_v2(&a, &d));
        CHECK(cuArrayDestroy(a));
        return;
    }
    }
}

/* A graph of three launches captured from the stream. */
static CUgraph captured(CUstream s, unsigned blocks)
{
    CUgraph g;
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    for (int i = 0; i < 3; i++)
        CHECK(cuLaunchKernel(fn, blocks, 1, 1, 64, 1, 1, 0, s, NULL, NULL));
    CHECK(cuStreamEndCapture(s, &g));
    return g;
}

static void graphs(CUstream s, unsigned blocks)
{
    CUgraph g = captured(s, blocks), other = captured(s, blocks + 1);
    CUgraphExec e;
    CUgraphExecUpdateResultInfo info;
    CHECK(cuGraphInstantiateWithFlags(&e, g, 0));
    CHECK(cuGraphLaunch(e, s));
    CHECK(cuGraphExecUpdate_v2(e, other, &info));
    CHECK(cuGraphLaunch(e, s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuGraphExecDestroy(e));
    CHECK(cuGraphDestroy(g));
    CHECK(cuGraphDestroy(other));
}

/* A context of the thread's own: what it allocates goes with it. */
static void own_context(void)
{
    CUcontext c;
    CUdeviceptr p;
    CHECK(cuCtxCreate_v2(&c, 0, dev));
    CHECK(cuMemAlloc_v2(&p, 3 * MiB));
    CHECK(cuCtxDestroy_v2(c));
    CHECK(cuCtxSetCurrent(primary));
}

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    CHECK(cuCtxSetCurrent(primary));
    CUstream s;
    CUmemoryPool pool;
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED, .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
    launch_fn launch;
    CUdriverProcAddressQueryResult found;
    CHECK(cuStreamCreate(&s, 0));
    CHECK(cuMemPoolCreate(&pool, &props));
    CHECK(cuGetProcAddress_v2("cuLaunchKernel", (void **)&launch, 12000, 0, &found));
    for (int i = 0; i < ROUNDS; i++) {
        alloc_and_free(rand_r(&seed) % 7, 1 + (size_t)(rand_r(&seed) % (2 * MiB)), s, pool, (unsigned char)i);
        unsigned blocks = 1728 * (1 + (unsigned)(rand_r(&seed) % 20)); /* 1 to 20 waves of 108 SMs: 10 to 200 us */
        CHECK((i % 2 ? launch : cuLaunchKernel)(fn, blocks, 1, 1, 128, 1, 1, 0, s, NULL, NULL));
        if (i % 20 == 0)
            graphs(s, blocks);
        if (i % 60 == 0)
            own_context();
    }
    CHECK(cuStreamSynchronize(s));
    CHECK(cuMemPoolDestroy(pool));
    CHECK(cuStreamDestroy_v2(s));
    return NULL;
}

/* The forked child: a process of its own in the slice, attached by whichever
 * of its threads asks first. */
static void *child_worker(void *arg)
{
    (void)arg;
    CUcontext c;
    CUdeviceptr p;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&c, 0));
    CHECK(cuCtxSetCurrent(c));
    CHECK(cuMemAlloc_v2(&p, MiB));
    CHECK(cuMemFree_v2(p));
    return NULL;
}

static int child(void)
{
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, child_worker, NULL);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    return 0;
}

/* ---- the NVML interposer, read while the slice changes ---- */

#define NVML_CHECK(x)                                                         \
    do {                                                                      \
        nvmlReturn_t r_ = (x);                                                \
        if (r_ != NVML_SUCCESS) {                                             \
            fprintf(stderr, "%s:%d: %s -> %d\n", __FILE__, __LINE__, #x, r_); \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

#define ROOM 16
#define FILL 0xab

static int workers_done;
static pid_t child_pid;
static unsigned long nvml_answers;

static void fail(const char *what, unsigned got)
{
    fprintf(stderr, "nvml: %s (%u)\n", what, got);
    exit(1);
}

/* Rows [0, n) are this slice's processes (the pid at `pid_at` in each); rows [n, ROOM) are untouched or
 * zeroed, never a row the driver gave. */
static void check_rows_at(const unsigned char *rows, size_t stride, size_t pid_at, unsigned n)
{
    if (n > 2)
        fail("more processes than the slice has", n);
    for (unsigned i = 0; i < n; i++) {
        unsigned pid;
        memcpy(&pid, rows + i * stride + pid_at, sizeof pid);
        if (pid != (unsigned)getpid() && pid != (unsigned)child_pid)
            fail("a process of another tenant listed", pid);
    }
    for (size_t b = n * stride; b < ROOM * stride; b++)
        if (rows[b] != FILL && rows[b] != 0)
            fail("a row past the count left in the caller's memory, byte", (unsigned)b);
}

static void check_rows(const unsigned char *rows, size_t stride, unsigned n)
{
    check_rows_at(rows, stride, 0, n);
}

static void nvml_round(nvmlDevice_t h, unsigned long long total)
{
    nvmlMemory_t m;
    NVML_CHECK(nvmlDeviceGetMemoryInfo(h, &m));
    if (m.total != total || m.used + m.free != m.total)
        fail("memory not the slice's, MiB used", (unsigned)(m.used >> 20));

    nvmlProcessInfo_t procs[ROOM];
    memset(procs, FILL, sizeof procs);
    unsigned n = ROOM;
    NVML_CHECK(nvmlDeviceGetComputeRunningProcesses_v3(h, &n, procs));
    check_rows((unsigned char *)procs, sizeof *procs, n);
    nvmlProcessInfo_v1_t old[ROOM];
    memset(old, FILL, sizeof old);
    n = ROOM;
    NVML_CHECK(nvmlDeviceGetComputeRunningProcesses(h, &n, old));
    check_rows((unsigned char *)old, sizeof *old, n);
    n = 0; /* sized first, as pynvml asks */
    nvmlReturn_t r = nvmlDeviceGetComputeRunningProcesses_v3(h, &n, NULL);
    if ((r != NVML_SUCCESS && r != NVML_ERROR_INSUFFICIENT_SIZE) || n > 2)
        fail("a sized list not the slice's", n);

    nvmlProcessUtilizationSample_t samples[ROOM];
    memset(samples, FILL, sizeof samples);
    n = ROOM;
    r = nvmlDeviceGetProcessUtilization(h, samples, &n, 0);
    if (r != NVML_SUCCESS && r != NVML_ERROR_NOT_FOUND && r != NVML_ERROR_INSUFFICIENT_SIZE)
        fail("utilization samples", r);
    check_rows((unsigned char *)samples, sizeof *samples, r == NVML_SUCCESS ? n : 0);

    nvmlProcessDetail_v1_t details[ROOM];
    memset(details, FILL, sizeof details);
    nvmlProcessDetailList_t list = {nvmlProcessDetailList_v1, NVML_PROCESS_MODE_ALL, ROOM, details};
    NVML_CHECK(nvmlDeviceGetRunningProcessDetailList(h, &list));
    check_rows((unsigned char *)details, sizeof *details, list.numProcArrayEntries);

    nvmlProcessUtilizationInfo_v1_t infos[ROOM];
    memset(infos, FILL, sizeof infos);
    nvmlProcessesUtilizationInfo_t info = {nvmlProcessesUtilizationInfo_v1, ROOM, 0, infos};
    r = nvmlDeviceGetProcessesUtilizationInfo(h, &info);
    if (r != NVML_SUCCESS && r != NVML_ERROR_NOT_FOUND && r != NVML_ERROR_INSUFFICIENT_SIZE)
        fail("utilization info", r);
    check_rows_at((unsigned char *)infos, sizeof *infos, offsetof(nvmlProcessUtilizationInfo_v1_t, pid),
                  r == NVML_SUCCESS ? info.processSamplesCount : 0);

    unsigned pids[ROOM];
    memset(pids, FILL, sizeof pids);
    n = ROOM;
    NVML_CHECK(nvmlDeviceGetAccountingPids(h, &n, pids)); /* the test turned accounting on */
    check_rows((unsigned char *)pids, sizeof *pids, n);
    for (unsigned i = 0; i < n; i++) {
        /* the forked child may end between the two calls: its record then leaves the slice's view */
        nvmlAccountingStats_t stats;
        r = nvmlDeviceGetAccountingStats(h, pids[i], &stats);
        if (r != NVML_SUCCESS && r != NVML_ERROR_NOT_FOUND)
            fail("accounting stats", r);
    }

    nvmlUtilization_t u;
    NVML_CHECK(nvmlDeviceGetUtilizationRates(h, &u));
    if (u.gpu > 100)
        fail("utilization above 100", u.gpu);
    __atomic_add_fetch(&nvml_answers, 1, __ATOMIC_RELAXED);
}

static void *nvml_reader(void *arg)
{
    unsigned long long total = *(const unsigned long long *)arg;
    nvmlDevice_t h;
    NVML_CHECK(nvmlInit_v2());
    NVML_CHECK(nvmlDeviceGetHandleByIndex_v2(0, &h));
    while (!__atomic_load_n(&workers_done, __ATOMIC_ACQUIRE))
        nvml_round(h, total);
    NVML_CHECK(nvmlShutdown());
    return NULL;
}

int main(void)
{
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    CHECK(cuCtxSetCurrent(primary));
    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&fn, mod, "k"));
    size_t free0, total;
    CHECK(cuMemGetInfo_v2(&free0, &total));

    /* fork before the threads start: forking a threaded process can hang
     * under TSan's own locks */
    pid_t pid = fork();
    if (pid == 0)
        _exit(child());
    child_pid = pid;
    unsigned long long slice_total = total;
    pthread_t readers[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&readers[i], NULL, nvml_reader, &slice_total);
    int failed = stress_threads_and_child(worker, pid);
    __atomic_store_n(&workers_done, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 2; i++)
        pthread_join(readers[i], NULL);
    if (failed)
        return 1;
    CHECK(cuCtxSynchronize());
    size_t free1;
    CHECK(cuMemGetInfo_v2(&free1, &total));
    if (free1 != free0) {
        fprintf(stderr, "charged: free %zu before, %zu after\n", free0, free1);
        return 1;
    }
    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease_v2(dev));
    printf("wrap_stress: ok (slice total %zu; %lu NVML rounds)\n", total, nvml_answers);
    return 0;
}
