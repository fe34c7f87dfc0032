/* Every allocation path reserves in the slice's shared ledger before the
 * driver sees it, gives it back when the driver fails or the memory is freed,
 * and the memory queries show the slice.  No lock, syscall or scan on these
 * paths: an atomic compare-and-swap on the ledger and the lock-free table. */
#define _GNU_SOURCE
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "gpuslice_array_format.h"
#include "gpuslice_cuda.h"
#include "wrap.h"

#include "real.h"

enum kind { K_MEM = 1, K_ARRAY, K_MIPMAP, K_VMM_HANDLE, K_VMM_MAP, K_IPC, K_EXT, K_POOL, K_CTX };

/* Whose end frees what is being allocated: the context (or pool) that
 * current_gpu/stream_gpu/pool_gpu found for this call. */
static __thread uint64_t owner;

/* Is the slice in force?  1: account; 0: pass through (unsliced); <0: no GPU. */
static inline int enforcing(void)
{
    int mode = __atomic_load_n(&gs.mode, __ATOMIC_ACQUIRE);
    return mode == GS_SLICE ? 1 : mode == GS_UNSLICED ? 0 : -1;
}

/* ---- devices ------------------------------------------------------------ */

#define MAX_DEVICES 64
static int8_t dev_map[MAX_DEVICES]; /* 0: unknown, else slice GPU + 1, or -1: not in the slice */

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
CUresult cuCtxGetDevice(CUdevice *dev);
CUresult cuCtxGetCurrent(CUcontext *ctx);

static int slice_gpu_of_device(CUdevice dev)
{
    if (dev < 0 || dev >= MAX_DEVICES)
        return -1;
    int8_t m = __atomic_load_n(&dev_map[dev], __ATOMIC_ACQUIRE);
    if (m == 0) {
        CUuuid u;
        int g = REAL(cuDeviceGetUuid_v2)(&u, dev) == CUDA_SUCCESS ? gs_gpu_of_uuid((unsigned char *)u.bytes) : -1;
        m = (int8_t)(g < 0 ? -1 : g + 1);
        __atomic_store_n(&dev_map[dev], m, __ATOMIC_RELEASE);
    }
    return m < 0 ? -1 : m - 1;
}

/* Contexts end rarely; each end bumps this so cached context->device pairs
 * of every thread go stale (a new context may reuse an old address). */
static uint64_t ctx_generation = 1;
static __thread struct {
    CUcontext ctx;
    uint64_t generation;
    CUdevice dev;
} ctx_cache;

/* fork: the child's contexts are new, whatever their addresses */
void gs_contexts_forget(void)
{
    __atomic_add_fetch(&ctx_generation, 1, __ATOMIC_ACQ_REL);
}

/* One driver call on the allocation path: the current context, whose device
 * is remembered per thread. */
static CUresult current_gpu(int *g)
{
    CUcontext ctx = NULL;
    CUresult r = REAL(cuCtxGetCurrent)(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t gen = __atomic_load_n(&ctx_generation, __ATOMIC_ACQUIRE);
    if (!ctx || ctx != ctx_cache.ctx || gen != ctx_cache.generation) {
        CUdevice dev;
        r = REAL(cuCtxGetDevice)(&dev); /* also the driver's error when no context is current */
        if (r != CUDA_SUCCESS)
            return r;
        ctx_cache.ctx = ctx;
        ctx_cache.generation = gen;
        ctx_cache.dev = dev;
    }
    owner = (uint64_t)(uintptr_t)ctx;
    *g = slice_gpu_of_device(ctx_cache.dev);
    return CUDA_SUCCESS;
}

/* The slice GPU the current context runs on (-1: none), for the launch gate. */
int gs_current_gpu(void)
{
    int g = -1;
    return current_gpu(&g) == CUDA_SUCCESS ? g : -1;
}

/* ---- the ledger --------------------------------------------------------- */

static inline int charge(int g, uint64_t bytes)
{
    if (g < 0) /* a GPU outside the slice has no memory for us */
        return -1;
    return gpuslice_usage_charge(gs.usage, gs.limits, gs.slot, (uint32_t)g, bytes);
}

static inline void uncharge(int g, uint64_t bytes)
{
    if (g >= 0)
        gpuslice_usage_uncharge(gs.usage, gs.slot, (uint32_t)g, bytes);
}

static void remember(uint64_t key, uint64_t bytes, int g, enum kind k)
{
    if (gs_table_put(key, bytes, (uint32_t)g, k, owner) != 0)
        gs_log(1, "allocation table full: %llu bytes stay charged until the process exits",
               (unsigned long long)bytes);
}

static int forget(uint64_t key, enum kind k, struct gs_entry *e)
{
    e->kind = k;
    return gs_table_take(key, e);
}

/* Reserve, call, record or undo: the shape of every allocation path. */
#define ALLOCATE(g, bytes, call, key_expr, kind)                           \
    do {                                                                   \
        int on_ = enforcing();                                             \
        if (on_ < 0)                                                       \
            return CUDA_ERROR_NOT_INITIALIZED;                             \
        if (on_ == 0)                                                      \
            return (call);                                                 \
        if (charge((g), (bytes)) != 0)                                     \
            return CUDA_ERROR_OUT_OF_MEMORY;                               \
        CUresult r_ = (call);                                              \
        if (r_ != CUDA_SUCCESS)                                            \
            uncharge((g), (bytes));                                        \
        else                                                               \
            remember((uint64_t)(key_expr), (bytes), (g), (kind));          \
        return r_;                                                         \
    } while (0)

#define CURRENT_GPU(g)                                                     \
    int g = -1;                                                            \
    if (enforcing() > 0) {                                                 \
        CUresult rg_ = current_gpu(&g);                                    \
        if (rg_ != CUDA_SUCCESS)                                           \
            return rg_;                                                    \
    }

static CUresult release(uint64_t key, enum kind k, CUresult r)
{
    struct gs_entry e;
    if (r == CUDA_SUCCESS && enforcing() > 0 && forget(key, k, &e) == 0)
        uncharge((int)e.gpu, e.bytes);
    return r;
}

/* ---- init and queries ---------------------------------------------------- */

WRAP_API CUresult cuInit(unsigned int flags)
{
    if (!gs_real_loaded()) {
        gs_log(1, "cannot load the real CUDA driver %s (set GPUSLICE_REAL_LIBCUDA)", gs_real_path());
        return CUDA_ERROR_NO_DEVICE;
    }
    if (gs_attach() != 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    return REAL(cuInit)(flags);
}

static void slice_view(int g, size_t *free_b, size_t *total)
{
    uint64_t limit = __atomic_load_n(&gs.limits->gpu[g].memory_limit, __ATOMIC_ACQUIRE);
    uint64_t used = __atomic_load_n(&gs.usage->used[g], __ATOMIC_ACQUIRE);
    *total = limit;
    *free_b = used >= limit ? 0 : limit - used;
}

WRAP_API CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total)
{
    CUresult r = REAL(cuMemGetInfo_v2)(free_b, total);
    int g;
    if (r != CUDA_SUCCESS || enforcing() <= 0 || current_gpu(&g) != CUDA_SUCCESS)
        return r;
    size_t driver_free = *free_b;
    if (g < 0)
        *free_b = *total = 0;
    else
        slice_view(g, free_b, total);
    /* where the driver limits the cgroup too, or the GPU runs short, its
     * word on what is free can be the smaller: never promise more */
    if (driver_free < *free_b)
        *free_b = driver_free;
    return CUDA_SUCCESS;
}

WRAP_API CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total)
{
    size_t f, t;
    if (!free_b || !total)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    if (r == CUDA_SUCCESS) {
        *free_b = f > 0xffffffffu ? 0xffffffffu : (unsigned)f;
        *total = t > 0xffffffffu ? 0xffffffffu : (unsigned)t;
    }
    return r;
}

WRAP_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CUresult r = REAL(cuDeviceTotalMem_v2)(bytes, dev);
    if (r == CUDA_SUCCESS && enforcing() > 0) {
        int g = slice_gpu_of_device(dev);
        *bytes = g < 0 ? 0 : __atomic_load_n(&gs.limits->gpu[g].memory_limit, __ATOMIC_ACQUIRE);
    }
    return r;
}

WRAP_API CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    size_t b;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuDeviceTotalMem_v2(&b, dev);
    if (r == CUDA_SUCCESS)
        *bytes = b > 0xffffffffu ? 0xffffffffu : (unsigned)b;
    return r;
}

/* ---- linear memory -------------------------------------------------------- */

WRAP_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
    if (!dptr || bytes == 0)
        return REAL(cuMemAlloc_v2)(dptr, bytes);
    CURRENT_GPU(g);
    ALLOCATE(g, bytes, REAL(cuMemAlloc_v2)(dptr, bytes), *dptr, K_MEM);
}

WRAP_API CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytes)
{
    if (!dptr || bytes == 0)
        return REAL(cuMemAlloc)(dptr, bytes);
    CURRENT_GPU(g);
    ALLOCATE(g, bytes, REAL(cuMemAlloc)(dptr, bytes), *dptr, K_MEM);
}

WRAP_API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags)
{
    if (!dptr || bytes == 0)
        return REAL(cuMemAllocManaged)(dptr, bytes, flags);
    CURRENT_GPU(g);
    ALLOCATE(g, bytes, REAL(cuMemAllocManaged)(dptr, bytes, flags), *dptr, K_MEM);
}

CUresult cuMemFree_v2(CUdeviceptr dptr);

#define PITCH_ALIGN 512u

WRAP_API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                     unsigned int elem)
{
    int on = enforcing();
    if (on < 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (on == 0 || !dptr || !pitch || width == 0 || height == 0)
        return REAL(cuMemAllocPitch_v2)(dptr, pitch, width, height, elem);
    CURRENT_GPU(g);
    /* the driver chooses the pitch: reserve for the usual alignment, then settle */
    size_t guess_row = (width + PITCH_ALIGN - 1) / PITCH_ALIGN * PITCH_ALIGN;
    if (height > SIZE_MAX / guess_row)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t guess = (uint64_t)guess_row * height;
    if (charge(g, guess) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = REAL(cuMemAllocPitch_v2)(dptr, pitch, width, height, elem);
    if (r != CUDA_SUCCESS) {
        uncharge(g, guess);
        return r;
    }
    uint64_t actual = (uint64_t)*pitch * height;
    if (actual > guess && charge(g, actual - guess) != 0) {
        uncharge(g, guess);
        REAL(cuMemFree_v2)(*dptr);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (actual < guess)
        uncharge(g, guess - actual);
    remember(*dptr, actual, g, K_MEM);
    return CUDA_SUCCESS;
}

WRAP_API CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    return release(dptr, K_MEM, REAL(cuMemFree_v2)(dptr));
}

WRAP_API CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    return release(dptr, K_MEM, REAL(cuMemFree)(dptr));
}

/* ---- stream-ordered allocation and pools ----------------------------------- */

CUresult cuStreamGetCtx(CUstream h, CUcontext *ctx);
CUresult cuCtxGetDevice_v2(CUdevice *dev, CUcontext ctx);

static CUresult stream_gpu(CUstream s, int *g)
{
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        return current_gpu(g);
    CUcontext ctx;
    CUdevice dev;
    CUresult r = REAL(cuStreamGetCtx)(s, &ctx);
    if (r == CUDA_SUCCESS)
        r = REAL(cuCtxGetDevice_v2)(&dev, ctx);
    if (r != CUDA_SUCCESS)
        return current_gpu(g); /* older drivers: the stream's context is current */
    owner = (uint64_t)(uintptr_t)ctx;
    *g = slice_gpu_of_device(dev);
    return CUDA_SUCCESS;
}

#define STREAM_GPU(g, s)                                                   \
    int g = -1;                                                            \
    if (enforcing() > 0) {                                                 \
        CUresult rg_ = stream_gpu((s), &g);                                \
        if (rg_ != CUDA_SUCCESS)                                           \
            return rg_;                                                    \
    }

WRAP_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s)
{
    if (!dptr || bytes == 0)
        return REAL(cuMemAllocAsync)(dptr, bytes, s);
    STREAM_GPU(g, s);
    ALLOCATE(g, bytes, REAL(cuMemAllocAsync)(dptr, bytes, s), *dptr, K_MEM);
}

WRAP_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s)
{
    if (!dptr || bytes == 0)
        return REAL(cuMemAllocAsync_ptsz)(dptr, bytes, s);
    STREAM_GPU(g, s);
    ALLOCATE(g, bytes, REAL(cuMemAllocAsync_ptsz)(dptr, bytes, s), *dptr, K_MEM);
}

WRAP_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s)
{
    return release(dptr, K_MEM, REAL(cuMemFreeAsync)(dptr, s));
}

WRAP_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s)
{
    return release(dptr, K_MEM, REAL(cuMemFreeAsync_ptsz)(dptr, s));
}

/* A pool's device comes from its properties, remembered at creation. */
WRAP_API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    CUresult r = REAL(cuMemPoolCreate)(pool, props);
    if (r == CUDA_SUCCESS && enforcing() > 0 && props && props->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        owner = 0;
        remember((uint64_t)(uintptr_t)*pool, 0, slice_gpu_of_device(props->location.id), K_POOL);
    }
    return r;
}

static void give_back(const struct gs_entry *e)
{
    uncharge((int)e->gpu, e->bytes);
}

/* Destroying a pool frees what was still allocated from it. */
WRAP_API CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    struct gs_entry e;
    CUresult r = REAL(cuMemPoolDestroy)(pool);
    if (r == CUDA_SUCCESS && enforcing() > 0) {
        forget((uint64_t)(uintptr_t)pool, K_POOL, &e);
        gs_table_drop_owner((uint64_t)(uintptr_t)pool, give_back);
    }
    return r;
}

static CUresult pool_gpu(CUmemoryPool pool, CUstream s, int *g)
{
    struct gs_entry e = {.kind = K_POOL};
    if (gs_table_get((uint64_t)(uintptr_t)pool, &e) == 0) {
        *g = (int)e.gpu;
        owner = (uint64_t)(uintptr_t)pool;
        return CUDA_SUCCESS;
    }
    return stream_gpu(s, g); /* a device's own pool */
}

#define POOL_GPU(g, pool, s)                                               \
    int g = -1;                                                            \
    if (enforcing() > 0) {                                                 \
        CUresult rg_ = pool_gpu((pool), (s), &g);                          \
        if (rg_ != CUDA_SUCCESS)                                           \
            return rg_;                                                    \
    }

WRAP_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s)
{
    if (!dptr || bytes == 0)
        return REAL(cuMemAllocFromPoolAsync)(dptr, bytes, pool, s);
    POOL_GPU(g, pool, s);
    ALLOCATE(g, bytes, REAL(cuMemAllocFromPoolAsync)(dptr, bytes, pool, s), *dptr, K_MEM);
}

WRAP_API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s)
{
    if (!dptr || bytes == 0)
        return REAL(cuMemAllocFromPoolAsync_ptsz)(dptr, bytes, pool, s);
    POOL_GPU(g, pool, s);
    ALLOCATE(g, bytes, REAL(cuMemAllocFromPoolAsync_ptsz)(dptr, bytes, pool, s), *dptr, K_MEM);
}

/* ---- virtual memory management --------------------------------------------- */
/* Physical memory is charged at cuMemCreate and given back only when the
 * driver frees it: no reference to the handle is left (the creation's, and one
 * per cuMemRetainAllocationHandle, each ended by a cuMemRelease) and no
 * mapping of it is left (cuMemMap, cuMemUnmap). A release does not say which
 * reference it ends, so only their number counts. */

/* The handle's table entry packs, beside its GPU (low 8 bits): its mappings,
 * the references retained beyond the creation's, whether the creation's was
 * released, and "saturated": more of either than the fields hold, in which
 * case the memory stays charged until the process ends (never too little). */
#define VMM_MAPS_SHIFT 8
#define VMM_RETAINS_SHIFT 19
#define VMM_FIELD_MAX 0x7ffu
#define VMM_RELEASED (1u << 30)
#define VMM_SATURATED (1u << 31)

WRAP_API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                              unsigned long long flags)
{
    if (!h || !prop || size == 0)
        return REAL(cuMemCreate)(h, size, prop, flags);
    int g = enforcing() > 0 && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE
                ? slice_gpu_of_device(prop->location.id)
                : -1;
    owner = 0; /* VMM handles belong to the process, not to a context */
    ALLOCATE(g, size, REAL(cuMemCreate)(h, size, prop, flags), *h, K_VMM_HANDLE);
}

static int vmm_field_add(uint32_t *packed, int shift, int delta)
{
    uint32_t v = (*packed >> shift) & VMM_FIELD_MAX;
    if ((delta > 0 && v == VMM_FIELD_MAX) || (delta < 0 && v == 0))
        return -1;
    *packed = (*packed & ~(VMM_FIELD_MAX << shift)) | ((uint32_t)((int)v + delta) << shift);
    return 0;
}

/* One reference more (+1) or less (-1), one mapping more or less; the charge
 * goes back when neither is left. -1: not a handle this process created. */
static int vmm_adjust(uint64_t handle, int ref_delta, int map_delta)
{
    struct gs_entry e;
    if (forget(handle, K_VMM_HANDLE, &e) != 0)
        return -1;
    uint32_t p = e.gpu;
    if (map_delta && vmm_field_add(&p, VMM_MAPS_SHIFT, map_delta) != 0)
        p |= VMM_SATURATED;
    if (ref_delta > 0 && vmm_field_add(&p, VMM_RETAINS_SHIFT, +1) != 0)
        p |= VMM_SATURATED;
    if (ref_delta < 0 && vmm_field_add(&p, VMM_RETAINS_SHIFT, -1) != 0)
        p |= VMM_RELEASED; /* no retained reference left: this ends the creation's */
    int refs = !(p & VMM_RELEASED) + (int)((p >> VMM_RETAINS_SHIFT) & VMM_FIELD_MAX);
    int maps = (int)((p >> VMM_MAPS_SHIFT) & VMM_FIELD_MAX);
    if (refs == 0 && maps == 0) { /* the driver frees it, and may hand its value out again */
        if (!(p & VMM_SATURATED))
            uncharge((int)(int8_t)(p & 0xff), e.bytes);
        return 0; /* saturated or exported: the charge stays until the process ends */
    }
    gs_table_put(handle, e.bytes, p, K_VMM_HANDLE, 0);
    return 0;
}

WRAP_API CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    CUresult r = REAL(cuMemRelease)(h);
    if (r == CUDA_SUCCESS && enforcing() > 0)
        vmm_adjust(h, -1, 0);
    return r;
}

WRAP_API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr)
{
    CUresult r = REAL(cuMemRetainAllocationHandle)(h, addr);
    if (r == CUDA_SUCCESS && h && enforcing() > 0)
        vmm_adjust(*h, +1, 0); /* one more release before the driver frees it */
    return r;
}

/* An exported handle can be kept alive by an importer this process cannot
 * count (another process's references): its charge stays until this process
 * ends (never too little). */
WRAP_API CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h,
                                               CUmemAllocationHandleType type, unsigned long long flags)
{
    CUresult r = REAL(cuMemExportToShareableHandle)(out, h, type, flags);
    struct gs_entry e;
    if (r == CUDA_SUCCESS && enforcing() > 0 && forget(h, K_VMM_HANDLE, &e) == 0)
        gs_table_put(h, e.bytes, e.gpu | VMM_SATURATED, K_VMM_HANDLE, 0);
    return r;
}

/* This process's own export imported back is one more reference to a handle
 * it counts. Memory another process exported is refused in a slice: holding
 * its handle keeps it alive, and its size is not known until it is mapped. */
WRAP_API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle,
                                                 CUmemAllocationHandleType type)
{
    if (enforcing() < 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = REAL(cuMemImportFromShareableHandle)(h, os_handle, type);
    if (r != CUDA_SUCCESS || !h || enforcing() == 0 || vmm_adjust(*h, +1, 0) == 0)
        return r;
    REAL(cuMemRelease)(*h);
    gs_log(1, "cuMemImportFromShareableHandle is refused: memory another process exported cannot be accounted "
              "in a slice (NCCL: set NCCL_CUMEM_ENABLE=0 for its accounted IPC path)");
    return CUDA_ERROR_NOT_SUPPORTED;
}

WRAP_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                           unsigned long long flags)
{
    CUresult r = REAL(cuMemMap)(ptr, size, offset, h, flags);
    if (r == CUDA_SUCCESS && enforcing() > 0 && vmm_adjust(h, 0, +1) == 0)
        gs_table_put(ptr, h, 0, K_VMM_MAP, 0); /* the mapping remembers its handle */
    return r;
}

WRAP_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CUresult r = REAL(cuMemUnmap)(ptr, size);
    struct gs_entry e;
    if (r == CUDA_SUCCESS && enforcing() > 0 && forget(ptr, K_VMM_MAP, &e) == 0)
        vmm_adjust(e.bytes, 0, -1);
    return r;
}

/* ---- arrays ---------------------------------------------------------------- */

static uint64_t format_bytes(int f)
{
    uint64_t b = gpuslice_format_bytes(f);
    return b ? b : 4; /* a format the table does not know (packed, compressed, YUV): charged at least this */
}

static uint64_t array3d_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    uint64_t h = d->Height ? d->Height : 1, z = d->Depth ? d->Depth : 1;
    return format_bytes(d->Format) * (d->NumChannels ? d->NumChannels : 1) * d->Width * h * z;
}

WRAP_API CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    if (!a || !d)
        return REAL(cuArray3DCreate_v2)(a, d);
    CURRENT_GPU(g);
    uint64_t bytes = array3d_bytes(d);
    ALLOCATE(g, bytes, REAL(cuArray3DCreate_v2)(a, d), *a, K_ARRAY);
}

WRAP_API CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d)
{
    if (!a || !d)
        return REAL(cuArrayCreate_v2)(a, d);
    CURRENT_GPU(g);
    CUDA_ARRAY3D_DESCRIPTOR d3 = {.Width = d->Width, .Height = d->Height, .Format = d->Format,
                                  .NumChannels = d->NumChannels};
    uint64_t bytes = array3d_bytes(&d3);
    ALLOCATE(g, bytes, REAL(cuArrayCreate_v2)(a, d), *a, K_ARRAY);
}

WRAP_API CUresult cuArrayDestroy(CUarray a)
{
    return release((uint64_t)(uintptr_t)a, K_ARRAY, REAL(cuArrayDestroy)(a));
}

WRAP_API CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    if (!m || !d || levels == 0 || levels > 32)
        return REAL(cuMipmappedArrayCreate)(m, d, levels);
    CURRENT_GPU(g);
    uint64_t bytes = 0;
    CUDA_ARRAY3D_DESCRIPTOR l = *d;
    for (unsigned i = 0; i < levels; i++) {
        bytes += array3d_bytes(&l);
        l.Width = l.Width > 1 ? l.Width / 2 : 1;
        l.Height = l.Height > 1 ? l.Height / 2 : l.Height;
        l.Depth = l.Depth > 1 ? l.Depth / 2 : l.Depth;
    }
    ALLOCATE(g, bytes, REAL(cuMipmappedArrayCreate)(m, d, levels), *m, K_MIPMAP);
}

WRAP_API CUresult cuMipmappedArrayDestroy(CUmipmappedArray m)
{
    return release((uint64_t)(uintptr_t)m, K_MIPMAP, REAL(cuMipmappedArrayDestroy)(m));
}

/* ---- imports --------------------------------------------------------------- */


WRAP_API CUresult cuImportExternalMemory(CUexternalMemory *ext, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *desc)
{
    if (!ext || !desc)
        return REAL(cuImportExternalMemory)(ext, desc);
    CURRENT_GPU(g);
    ALLOCATE(g, desc->size, REAL(cuImportExternalMemory)(ext, desc), *ext, K_EXT);
}

WRAP_API CUresult cuDestroyExternalMemory(CUexternalMemory ext)
{
    return release((uint64_t)(uintptr_t)ext, K_EXT, REAL(cuDestroyExternalMemory)(ext));
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr);

/* The size of an IPC import is known only once it is open: charge then, and
 * close it again if the slice has no room. */
static CUresult ipc_opened(CUdeviceptr *dptr, CUresult r, CUresult (*close_fn)(CUdeviceptr))
{
    if (r != CUDA_SUCCESS || enforcing() <= 0)
        return r;
    int g;
    CUdeviceptr base;
    size_t size;
    if (current_gpu(&g) != CUDA_SUCCESS || REAL(cuMemGetAddressRange_v2)(&base, &size, *dptr) != CUDA_SUCCESS ||
        charge(g, size) != 0) {
        close_fn(*dptr);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    remember(*dptr, size, g, K_IPC);
    return CUDA_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);

WRAP_API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *dptr, CUipcMemHandle h, unsigned int flags)
{
    if (enforcing() < 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    return ipc_opened(dptr, REAL(cuIpcOpenMemHandle_v2)(dptr, h, flags), REAL(cuIpcCloseMemHandle));
}

WRAP_API CUresult cuIpcOpenMemHandle(CUdeviceptr *dptr, CUipcMemHandle h, unsigned int flags)
{
    if (enforcing() < 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    return ipc_opened(dptr, REAL(cuIpcOpenMemHandle)(dptr, h, flags), REAL(cuIpcCloseMemHandle));
}

WRAP_API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    return release(dptr, K_IPC, REAL(cuIpcCloseMemHandle)(dptr));
}

/* ---- contexts ------------------------------------------------------------------ */
/* Each context costs the slice its configured reserve (the driver's own use of
 * the GPU), and its end frees everything allocated in it. */

static inline uint64_t reserve_of(int g)
{
    return g < 0 ? 0 : __atomic_load_n(&gs.limits->gpu[g].context_reserve, __ATOMIC_ACQUIRE);
}

static void context_ended(CUcontext ctx)
{
    struct gs_entry e;
    __atomic_add_fetch(&ctx_generation, 1, __ATOMIC_ACQ_REL);
    gs_table_drop_owner((uint64_t)(uintptr_t)ctx, give_back);
    if (forget((uint64_t)(uintptr_t)ctx, K_CTX, &e) == 0)
        uncharge((int)e.gpu, e.bytes);
}

static CUresult ctx_created(CUcontext *pctx, CUdevice dev, CUresult (*create)(void *), void *args)
{
    int on = enforcing();
    if (on < 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (on == 0 || !pctx)
        return create(args);
    int g = slice_gpu_of_device(dev);
    uint64_t bytes = reserve_of(g);
    if (bytes && charge(g, bytes) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = create(args);
    if (r != CUDA_SUCCESS) {
        if (bytes)
            uncharge(g, bytes);
        return r;
    }
    owner = 0;
    remember((uint64_t)(uintptr_t)*pctx, bytes, g, K_CTX);
    return r;
}

struct create_args {
    CUcontext *pctx;
    void *params;
    int n;
    unsigned flags;
    CUdevice dev;
    int variant;
};

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev);

static CUresult create_ctx(void *p)
{
    struct create_args *a = p;
    switch (a->variant) {
    case 1: return REAL(cuCtxCreate)(a->pctx, a->flags, a->dev);
    case 2: return REAL(cuCtxCreate_v2)(a->pctx, a->flags, a->dev);
    case 3: return REAL(cuCtxCreate_v3)(a->pctx, a->params, a->n, a->flags, a->dev);
    default: return REAL(cuCtxCreate_v4)(a->pctx, a->params, a->flags, a->dev);
    }
}

WRAP_API CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    struct create_args a = {pctx, NULL, 0, flags, dev, 1};
    return ctx_created(pctx, dev, create_ctx, &a);
}

WRAP_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    struct create_args a = {pctx, NULL, 0, flags, dev, 2};
    return ctx_created(pctx, dev, create_ctx, &a);
}

WRAP_API CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags,
                                 CUdevice dev)
{
    struct create_args a = {pctx, params, n, flags, dev, 3};
    return ctx_created(pctx, dev, create_ctx, &a);
}

WRAP_API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev)
{
    struct create_args a = {pctx, params, 0, flags, dev, 4};
    return ctx_created(pctx, dev, create_ctx, &a);
}

WRAP_API CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    CUresult r = REAL(cuCtxDestroy_v2)(ctx);
    if (r == CUDA_SUCCESS && enforcing() > 0)
        context_ended(ctx);
    return r;
}

WRAP_API CUresult cuCtxDestroy(CUcontext ctx)
{
    CUresult r = REAL(cuCtxDestroy)(ctx);
    if (r == CUDA_SUCCESS && enforcing() > 0)
        context_ended(ctx);
    return r;
}

/* Primary contexts: charged at the first retain, ended by the last release
 * or a reset; their handle is the same for every retain of a device. */
static int primary_refs[MAX_DEVICES];
static CUcontext primary_ctx[MAX_DEVICES];

WRAP_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    int on = enforcing();
    if (on <= 0 || !pctx || dev < 0 || dev >= MAX_DEVICES)
        return on < 0 ? CUDA_ERROR_NOT_INITIALIZED : REAL(cuDevicePrimaryCtxRetain)(pctx, dev);
    int g = slice_gpu_of_device(dev);
    uint64_t bytes = reserve_of(g);
    int first = __atomic_fetch_add(&primary_refs[dev], 1, __ATOMIC_ACQ_REL) == 0;
    if (first && bytes && charge(g, bytes) != 0) {
        __atomic_fetch_sub(&primary_refs[dev], 1, __ATOMIC_ACQ_REL);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = REAL(cuDevicePrimaryCtxRetain)(pctx, dev);
    if (r != CUDA_SUCCESS) {
        if (__atomic_sub_fetch(&primary_refs[dev], 1, __ATOMIC_ACQ_REL) == 0 && first && bytes)
            uncharge(g, bytes);
        return r;
    }
    if (first) {
        __atomic_store_n(&primary_ctx[dev], *pctx, __ATOMIC_RELEASE);
        owner = 0;
        remember((uint64_t)(uintptr_t)*pctx, bytes, g, K_CTX);
    }
    return r;
}

static CUresult primary_dropped(CUdevice dev, CUresult r, int reset)
{
    if (r != CUDA_SUCCESS || enforcing() <= 0 || dev < 0 || dev >= MAX_DEVICES)
        return r;
    int last = reset ? __atomic_exchange_n(&primary_refs[dev], 0, __ATOMIC_ACQ_REL) > 0
                     : __atomic_sub_fetch(&primary_refs[dev], 1, __ATOMIC_ACQ_REL) == 0;
    if (last)
        context_ended(__atomic_load_n(&primary_ctx[dev], __ATOMIC_ACQUIRE));
    return r;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
CUresult cuDevicePrimaryCtxReset(CUdevice dev);

WRAP_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    return primary_dropped(dev, REAL(cuDevicePrimaryCtxRelease_v2)(dev), 0);
}

WRAP_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return primary_dropped(dev, REAL(cuDevicePrimaryCtxRelease)(dev), 0);
}

WRAP_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    return primary_dropped(dev, REAL(cuDevicePrimaryCtxReset_v2)(dev), 1);
}

WRAP_API CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    return primary_dropped(dev, REAL(cuDevicePrimaryCtxReset)(dev), 1);
}

/* ---- paths gpuslice cannot account yet: refused, never escaped -------------- */

#define REFUSE(name, params, why)                                                        \
    WRAP_API CUresult name params                                                        \
    {                                                                                    \
        if (enforcing() == 0)                                                            \
            return ((CUresult(*) params)gs_real_##name) args_of_##name;                  \
        gs_log(1, #name " is refused: " why);                                            \
        return CUDA_ERROR_NOT_SUPPORTED;                                                 \
    }


#define args_of_cuMemAllocPitch (dptr, pitch, w, h, e)
REFUSE(cuMemAllocPitch, (CUdeviceptr_v1 * dptr, unsigned *pitch, unsigned w, unsigned h, unsigned e),
       "the 32-bit legacy API cannot be accounted; use cuMemAllocPitch_v2")
#define args_of_cuArrayCreate (a, d)
REFUSE(cuArrayCreate, (CUarray * a, const CUDA_ARRAY_DESCRIPTOR_v1 *d), "the 32-bit legacy API; use cuArrayCreate_v2")
#define args_of_cuArray3DCreate (a, d)
REFUSE(cuArray3DCreate, (CUarray * a, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d), "the 32-bit legacy API; use cuArray3DCreate_v2")
#define args_of_cuGraphAddMemAllocNode (n, g, deps, nd, p)
REFUSE(cuGraphAddMemAllocNode,
       (CUgraphNode * n, CUgraph g, const CUgraphNode *deps, size_t nd, CUDA_MEM_ALLOC_NODE_PARAMS *p),
       "graph memory nodes allocate at launch, outside the slice's ledger")
#define args_of_cuMemPoolImportPointer (p, pool, d)
REFUSE(cuMemPoolImportPointer, (CUdeviceptr * p, CUmemoryPool pool, CUmemPoolPtrExportData *d),
       "imported pool memory cannot be accounted yet")
#define args_of_cuMulticastCreate (h, p)
REFUSE(cuMulticastCreate, (CUmemGenericAllocationHandle * h, const CUmulticastObjectProp *p),
       "multicast objects cannot be accounted yet")
