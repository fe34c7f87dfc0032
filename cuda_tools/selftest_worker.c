/* gpuslice-selftest-worker: the CUDA side of `gpuslice selftest`.  It loads
 * libcuda.so.1 and libnvidia-ml.so.1 the way applications do (so, in a slice,
 * the interposer's), works on the GPU named by its UUID, and prints one JSON
 * line per command (`spin` and `hold` keep running until killed or done).
 *
 * usage: gpuslice-selftest-worker UUID COMMAND [ARGS]
 *   view                 what CUDA and NVML say of the GPU's memory, and which
 *                        files the loader gave for the two libraries
 *   fill PATH CHUNK      allocate CHUNK bytes at a time through one allocation
 *                        path until the driver refuses; report, free everything
 *                        PATH: mem managed pitch async pool vmm array array3d mipmap
 *   hold BYTES           allocate, report, then wait to be killed
 *   procaddr             what cuGetProcAddress hands out, against the library's
 *                        own exports, at the driver's version and older ones
 *   spin SECONDS WAVES CYCLES  launch a spin kernel (PTX text, JIT-compiled by
 *                        the driver) back to back, each WAVES full waves of
 *                        blocks spinning CYCLES clocks; report the launches made
 *   work SECONDS WAVES ITERS  launch a fixed-work kernel (ITERS dependent FMAs a
 *                        thread) back to back, printing the launches made every
 *                        0.2 s: the work done, which the selftest compares with
 *                        the rate alone
 *   launches N           the CPU time of one kernel launch: the median batch of
 *                        16 over N launches (at most 65536)
 * env GPUSLICE_SELFTEST_LIBCUDA: load this library instead (the driver's own,
 * to measure what the interposer adds). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpuslice_cuda.h"
#include "gpuslice_nvml.h"

#define MAX_ALLOCS 4096
#define SPIN_BATCH 16
#define MAX_BATCHES 4096

/* Spins each block for `cycles` SM clocks: the same PTX runs on any GPU from
 * Volta on, compiled by the driver's JIT (no toolkit needed). */
static const char SPIN_PTX[] =
    ".version 7.0\n.target sm_70\n.address_size 64\n"
    ".visible .entry spin(.param .u64 cycles)\n{\n"
    " .reg .pred %p;\n .reg .b64 %rd<5>;\n"
    " ld.param.u64 %rd1, [cycles];\n mov.u64 %rd2, %clock64;\n"
    "WAIT:\n mov.u64 %rd3, %clock64;\n sub.s64 %rd4, %rd3, %rd2;\n"
    " setp.lt.u64 %p, %rd4, %rd1;\n @%p bra WAIT;\n ret;\n}\n"
    ".visible .entry empty()\n{\n ret;\n}\n"
    /* `iters` dependent FMAs a thread: a fixed amount of work, unlike a spin on the clock,
     * which ends on time however little of it the context had while time-sliced */
    ".visible .global .f32 sink;\n"
    ".visible .entry work(.param .u64 iters)\n{\n"
    " .reg .pred %p;\n .reg .b64 %rd<3>;\n .reg .f32 %f<3>;\n"
    " ld.param.u64 %rd1, [iters];\n mov.u64 %rd2, 0;\n mov.f32 %f1, 0f3F800000;\n mov.f32 %f2, 0f3F7FFFFE;\n"
    "LOOP:\n fma.rn.f32 %f1, %f1, %f2, 0f3A83126F;\n add.u64 %rd2, %rd2, 1;\n"
    " setp.lt.u64 %p, %rd2, %rd1;\n @%p bra LOOP;\n st.global.f32 [sink], %f1;\n ret;\n}\n";

static void *cuda, *nvml;
#define CU(name, ...) ((CUresult(*)())dlsym(cuda, #name))(__VA_ARGS__)
#define NV(name, ...) ((nvmlReturn_t(*)())dlsym(nvml, #name))(__VA_ARGS__)

static CUdevice dev;
static int dev_ordinal;
static CUstream stream;

static const char *err_name(CUresult r)
{
    const char *s = NULL;
    CU(cuGetErrorName, r, &s);
    return s ? s : "?";
}

static int fail(const char *what, CUresult r)
{
    printf("{\"error\": \"%s: %s\"}\n", what, err_name(r));
    return 1;
}

static unsigned long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

/* The device whose UUID is `uuid` ("GPU-xxxxxxxx-xxxx-..."). */
static CUresult find_device(const char *uuid)
{
    int n = 0;
    CUresult r = CU(cuDeviceGetCount, &n);
    for (int i = 0; !r && i < n; i++) {
        CUuuid u;
        char text[64];
        if ((r = CU(cuDeviceGet, &dev, i)) || (r = CU(cuDeviceGetUuid_v2, &u, dev)))
            return r;
        const unsigned char *b = (const unsigned char *)u.bytes;
        snprintf(text, sizeof text,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
                 b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
        if (strcasecmp(text, uuid) == 0) {
            dev_ordinal = i;
            return CUDA_SUCCESS;
        }
    }
    return r ? r : CUDA_ERROR_INVALID_DEVICE;
}

static const char *loaded_from(void *handle)
{
    struct link_map *map = NULL;
    return handle && dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map ? map->l_name : "";
}

static int view(const char *uuid)
{
    size_t free_b = 0, total = 0;
    CUresult r = CU(cuMemGetInfo_v2, &free_b, &total);
    if (r)
        return fail("cuMemGetInfo", r);
    nvmlMemory_t m = {0};
    nvmlDevice_t d;
    int nr = nvml ? NV(nvmlInit_v2) : -1;
    if (!nr)
        nr = NV(nvmlDeviceGetHandleByUUID, uuid, &d);
    if (!nr)
        nr = NV(nvmlDeviceGetMemoryInfo, d, &m);
    printf("{\"cuda_total\": %zu, \"cuda_free\": %zu, \"nvml\": %d, \"nvml_total\": %llu, \"nvml_used\": %llu, "
           "\"libcuda\": \"%s\", \"libnvml\": \"%s\"}\n",
           total, free_b, nr, (unsigned long long)m.total, (unsigned long long)m.used, loaded_from(cuda),
           loaded_from(nvml));
    return 0;
}

/* One allocation of `chunk` bytes' worth through `path`; *charge is what the
 * interposer charges for it (docs/interposer.md). */
struct allocation {
    int kind;
    CUdeviceptr ptr;
    void *obj;
    unsigned long long handle;
};

enum { MEM, MANAGED, PITCH, ASYNC, POOL, VMM, ARRAY, ARRAY3D, MIPMAP, NPATHS };
static const char *const PATHS[NPATHS] = {"mem", "managed", "pitch", "async", "pool",
                                          "vmm", "array", "array3d", "mipmap"};
static CUmemoryPool pool;

static CUresult alloc_one(int kind, size_t chunk, struct allocation *a, size_t *charge)
{
    a->kind = kind;
    *charge = chunk;
    switch (kind) {
    case MEM:
        return CU(cuMemAlloc_v2, &a->ptr, chunk);
    case MANAGED:
        return CU(cuMemAllocManaged, &a->ptr, chunk, (unsigned)CU_MEM_ATTACH_GLOBAL);
    case PITCH: {
        size_t pitch = 0;
        return CU(cuMemAllocPitch_v2, &a->ptr, &pitch, (size_t)4096, chunk / 4096, (unsigned)16);
    }
    case ASYNC: {
        CUresult r = CU(cuMemAllocAsync, &a->ptr, chunk, stream);
        return r ? r : CU(cuStreamSynchronize, stream);
    }
    case POOL: {
        CUresult r = CU(cuMemAllocFromPoolAsync, &a->ptr, chunk, pool, stream);
        return r ? r : CU(cuStreamSynchronize, stream);
    }
    case VMM: {
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {CU_MEM_LOCATION_TYPE_DEVICE, dev_ordinal}};
        return CU(cuMemCreate, &a->handle, chunk, &prop, 0ull);
    }
    case ARRAY: {
        CUDA_ARRAY_DESCRIPTOR d = {4096, chunk / (4096 * 16), CU_AD_FORMAT_FLOAT, 4};
        return CU(cuArrayCreate_v2, (CUarray *)&a->obj, &d);
    }
    case ARRAY3D: {
        CUDA_ARRAY3D_DESCRIPTOR d = {1024, 1024, chunk / (1024 * 1024 * 16), CU_AD_FORMAT_FLOAT, 4, 0};
        return CU(cuArray3DCreate_v2, (CUarray *)&a->obj, &d);
    }
    case MIPMAP: { /* two levels: w x h, then w/2 x h/2 */
        size_t w = 2048, h = chunk / (2048 * 16);
        CUDA_ARRAY3D_DESCRIPTOR d = {w, h, 0, CU_AD_FORMAT_FLOAT, 4, 0};
        *charge = w * h * 16 + (w / 2) * (h / 2) * 16;
        return CU(cuMipmappedArrayCreate, (CUmipmappedArray *)&a->obj, &d, 2u);
    }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult free_one(const struct allocation *a)
{
    switch (a->kind) {
    case ASYNC:
    case POOL: {
        CUresult r = CU(cuMemFreeAsync, a->ptr, stream);
        return r ? r : CU(cuStreamSynchronize, stream);
    }
    case VMM:
        return CU(cuMemRelease, a->handle);
    case ARRAY:
    case ARRAY3D:
        return CU(cuArrayDestroy, (CUarray)a->obj);
    case MIPMAP:
        return CU(cuMipmappedArrayDestroy, (CUmipmappedArray)a->obj);
    default:
        return CU(cuMemFree_v2, a->ptr);
    }
}

static int fill(const char *path, size_t chunk)
{
    int kind = -1;
    for (int i = 0; i < NPATHS; i++)
        if (strcmp(path, PATHS[i]) == 0)
            kind = i;
    if (kind < 0 || chunk < (1u << 20) || chunk % (1u << 20)) {
        printf("{\"error\": \"fill: path one of mem managed pitch async pool vmm array array3d mipmap, chunk a "
               "whole number of MiB\"}\n");
        return 2;
    }
    if (kind == POOL) {
        CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {CU_MEM_LOCATION_TYPE_DEVICE, dev_ordinal}};
        CUresult r = CU(cuMemPoolCreate, &pool, &props);
        if (r)
            return fail("cuMemPoolCreate", r);
    }
    static struct allocation held[MAX_ALLOCS];
    int n = 0;
    unsigned long long allocated = 0;
    size_t charge = 0;
    CUresult r = CUDA_SUCCESS;
    while (n < MAX_ALLOCS && (r = alloc_one(kind, chunk, &held[n], &charge)) == CUDA_SUCCESS) {
        allocated += charge;
        n++;
    }
    CUresult freed = CUDA_SUCCESS;
    for (int i = n - 1; i >= 0; i--)
        if (!freed)
            freed = free_one(&held[i]);
    if (kind == POOL && !freed)
        freed = CU(cuMemPoolDestroy, pool);
    size_t free_after = 0, total = 0;
    CU(cuMemGetInfo_v2, &free_after, &total);
    printf("{\"path\": \"%s\", \"count\": %d, \"allocated\": %llu, \"charge\": %zu, \"then\": \"%s\", "
           "\"freed\": \"%s\", \"free_after\": %zu, \"total\": %zu}\n",
           path, n, allocated, charge, err_name(r), err_name(freed), free_after, total);
    return 0;
}

static int hold(size_t bytes)
{
    CUdeviceptr p;
    CUresult r = CU(cuMemAlloc_v2, &p, bytes);
    if (r)
        return fail("cuMemAlloc", r);
    printf("{\"held\": %zu}\n", bytes);
    fflush(stdout);
    for (;;)
        pause();
}

/* Symbols the interposer hooks, with the export cuGetProcAddress must give. */
static const char *const HOOKED[][2] = {
    {"cuMemAlloc", "cuMemAlloc_v2"},         {"cuMemFree", "cuMemFree_v2"},
    {"cuMemGetInfo", "cuMemGetInfo_v2"},     {"cuMemAllocManaged", "cuMemAllocManaged"},
    {"cuMemAllocAsync", "cuMemAllocAsync"},  {"cuMemCreate", "cuMemCreate"},
    {"cuArrayCreate", "cuArrayCreate_v2"},   {"cuLaunchKernel", "cuLaunchKernel"},
    {"cuGetProcAddress", "cuGetProcAddress_v2"},
};

static int procaddr(void)
{
    int driver = 0;
    CU(cuDriverGetVersion, &driver);
    const int versions[] = {driver, 12000, 11080};
    int checked = 0, hooked = 0;
    char wrong[1024] = "";
    for (size_t v = 0; v < sizeof versions / sizeof *versions; v++)
        for (size_t i = 0; i < sizeof HOOKED / sizeof *HOOKED; i++) {
            void *fn = NULL;
            CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
            CUresult r = CU(cuGetProcAddress_v2, HOOKED[i][0], &fn, versions[v], 0ull, &status);
            /* before 12.0, cuGetProcAddress was the first version */
            const char *want = versions[v] < 12000 && strcmp(HOOKED[i][0], "cuGetProcAddress") == 0
                                   ? "cuGetProcAddress"
                                   : HOOKED[i][1];
            checked++;
            if (!r && fn && fn == dlsym(cuda, want))
                hooked++;
            else if (strlen(wrong) + 64 < sizeof wrong)
                snprintf(wrong + strlen(wrong), sizeof wrong - strlen(wrong), "%s%s@%d", *wrong ? " " : "",
                         HOOKED[i][0], versions[v]);
        }
    printf("{\"driver\": %d, \"checked\": %d, \"hooked\": %d, \"not_hooked\": \"%s\"}\n", driver, checked, hooked,
           wrong);
    return 0;
}

static CUresult load_kernel(const char *name, CUfunction *f)
{
    CUmodule m;
    CUresult r = CU(cuModuleLoadData, &m, SPIN_PTX);
    return r ? r : CU(cuModuleGetFunction, f, m, name);
}

/* Launches `kernel` (one u64 parameter) back to back for `seconds`, no
 * synchronisation: the driver's queue (or the launch gate) holds the process when
 * it is ahead, so the GPU never waits for it. With `progress`, prints the launches
 * made so far every PROGRESS_NS: in steady state the queue holds as much at the
 * end of a window as at its start, so the launches made in it are the work done. */
#define PROGRESS_NS 200000000ull
static int back_to_back(const char *kernel, const char *started, double seconds, unsigned waves,
                        unsigned long long arg, int progress)
{
    CUfunction f;
    int sms = 0;
    CUresult r = load_kernel(kernel, &f);
    if (!r)
        r = CU(cuDeviceGetAttribute, &sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    if (r)
        return fail(kernel, r);
    /* 1024 threads a block, 2 blocks an SM: whole waves, no SM idle in the last */
    unsigned grid = waves * 2u * (unsigned)sms;
    void *params[] = {&arg};
    unsigned long long start = now_ns(), end = start + (unsigned long long)(seconds * 1e9), launches = 0;
    unsigned long long next = start;
    printf("{\"%s\": true}\n", started);
    fflush(stdout);
    for (unsigned long long t = start; t < end; t = now_ns()) {
        if (progress && t >= next) {
            printf("{\"t\": %llu, \"launches\": %llu}\n", t, launches);
            fflush(stdout);
            next = t + PROGRESS_NS;
        }
        for (int i = 0; i < SPIN_BATCH && !r; i++, launches++)
            r = CU(cuLaunchKernel, f, grid, 1u, 1u, 1024u, 1u, 1u, 0u, stream, params, NULL);
        if (r)
            return fail("cuLaunchKernel", r);
    }
    printf("{\"launches\": %llu}\n", launches);
    return 0;
}

static int by_value(const void *a, const void *b)
{
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return (x > y) - (x < y);
}

/* Only the launch calls are timed: the kernels run between batches.  The
 * entry point is looked up once, so the figure is the launch's own cost; the
 * median batch stands for the run, since a batch the scheduler interrupted
 * on a busy node says nothing of the launch path. */
static int launches(unsigned n)
{
    typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, CUstream, void **, void **);
    static unsigned long long batch_ns[MAX_BATCHES];
    CUfunction f;
    CUresult r = load_kernel("empty", &f);
    if (r)
        return fail("empty kernel", r);
    launch_fn launch = (launch_fn)dlsym(cuda, "cuLaunchKernel");
    if (!launch)
        return fail("cuLaunchKernel not exported", CUDA_ERROR_NOT_FOUND);
    unsigned batches = (n + SPIN_BATCH - 1) / SPIN_BATCH;
    if (batches > MAX_BATCHES)
        batches = MAX_BATCHES;
    if (batches == 0)
        batches = 1;
    for (unsigned b = 0; b < batches && !r; b++) {
        unsigned long long t = now_ns();
        for (int i = 0; i < SPIN_BATCH && !r; i++)
            r = launch(f, 1u, 1u, 1u, 32u, 1u, 1u, 0u, stream, NULL, NULL);
        batch_ns[b] = now_ns() - t;
        if (!r)
            r = CU(cuStreamSynchronize, stream);
    }
    if (r)
        return fail("cuLaunchKernel", r);
    qsort(batch_ns, batches, sizeof batch_ns[0], by_value);
    printf("{\"launches\": %u, \"ns_per_launch\": %.1f}\n", batches * SPIN_BATCH,
           (double)batch_ns[batches / 2] / SPIN_BATCH);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s UUID view|fill PATH CHUNK|hold BYTES|procaddr|spin S WAVES CYCLES|work S WAVES ITERS|launches N\n",
                argv[0]);
        return 2;
    }
    const char *lib = getenv("GPUSLICE_SELFTEST_LIBCUDA");
    cuda = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_NOW);
    if (!cuda) {
        printf("{\"error\": \"dlopen: %s\"}\n", dlerror());
        return 1;
    }
    nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    CUcontext ctx;
    CUresult r = CU(cuInit, 0u);
    if (!r)
        r = find_device(argv[1]);
    if (!r)
        r = CU(cuDevicePrimaryCtxRetain, &ctx, dev);
    if (!r)
        r = CU(cuCtxSetCurrent, ctx);
    if (!r)
        r = CU(cuStreamCreate, &stream, 0u);
    if (r)
        return fail("CUDA setup", r);
    const char *cmd = argv[2];
    if (strcmp(cmd, "view") == 0)
        return view(argv[1]);
    if (strcmp(cmd, "fill") == 0 && argc == 5)
        return fill(argv[3], strtoull(argv[4], NULL, 10));
    if (strcmp(cmd, "hold") == 0 && argc == 4)
        return hold(strtoull(argv[3], NULL, 10));
    if (strcmp(cmd, "procaddr") == 0)
        return procaddr();
    if (strcmp(cmd, "work") == 0 && argc == 6)
        return back_to_back("work", "working", atof(argv[3]), (unsigned)atoi(argv[4]),
                            strtoull(argv[5], NULL, 10), 1);
    if (strcmp(cmd, "spin") == 0 && argc == 6)
        return back_to_back("spin", "spinning", atof(argv[3]), (unsigned)atoi(argv[4]),
                            strtoull(argv[5], NULL, 10), 0);
    if (strcmp(cmd, "launches") == 0 && argc == 4)
        return launches((unsigned)atoi(argv[3]));
    fprintf(stderr, "%s: unknown command or arguments: %s\n", argv[0], cmd);
    return 2;
}
