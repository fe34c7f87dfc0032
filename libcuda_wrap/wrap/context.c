/* Devices and contexts on the allocation path: which slice GPU a device, the
 * current context or a stream's is (an allocation's place), and what each
 * context costs the slice. */
#define _GNU_SOURCE
#include <string.h>

#include "alloc.h"
#include "real.h"

/* ---- devices and places ---------------------------------------------------- */

#define MAX_DEVICES 64
static int8_t dev_map[MAX_DEVICES]; /* 0: unknown, else slice GPU + 1, or -1: not in the slice */

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
CUresult cuCtxGetDevice(CUdevice *dev);
CUresult cuCtxGetCurrent(CUcontext *ctx);

int gs_slice_gpu_of_device(CUdevice dev)
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
 * is remembered per thread (a cache, not state: an entry is checked against
 * the current context and the generation before each use). */
CUresult gs_place_current(struct gs_place *p)
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
    p->owner = (uint64_t)(uintptr_t)ctx;
    p->gpu = gs_slice_gpu_of_device(ctx_cache.dev);
    return CUDA_SUCCESS;
}

/* The slice GPU the current context runs on (-1: none), for the launch gate. */
int gs_current_gpu(void)
{
    struct gs_place p = {-1, 0};
    return gs_place_current(&p) == CUDA_SUCCESS ? p.gpu : -1;
}

CUresult cuStreamGetCtx(CUstream h, CUcontext *ctx);
CUresult cuCtxGetDevice_v2(CUdevice *dev, CUcontext ctx);

CUresult gs_place_stream(CUstream s, struct gs_place *p)
{
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        return gs_place_current(p);
    CUcontext ctx;
    CUdevice dev;
    CUresult r = REAL(cuStreamGetCtx)(s, &ctx);
    if (r == CUDA_SUCCESS)
        r = REAL(cuCtxGetDevice_v2)(&dev, ctx);
    if (r != CUDA_SUCCESS)
        return gs_place_current(p); /* older drivers: the stream's context is current */
    p->owner = (uint64_t)(uintptr_t)ctx;
    p->gpu = gs_slice_gpu_of_device(dev);
    return CUDA_SUCCESS;
}

/* ---- contexts -------------------------------------------------------------- */
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
    gs_table_drop_owner((uint64_t)(uintptr_t)ctx, gs_give_back);
    if (gs_forget((uint64_t)(uintptr_t)ctx, K_CTX, &e) == 0)
        gs_uncharge((int)e.gpu, e.bytes);
}

static CUresult ctx_created(CUcontext *pctx, CUdevice dev, CUresult (*create)(void *), void *args)
{
    int on = gs_enforcing();
    if (on < 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (on == 0 || !pctx)
        return create(args);
    int g = gs_slice_gpu_of_device(dev);
    uint64_t bytes = reserve_of(g);
    if (bytes && gs_charge(g, bytes) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = create(args);
    if (r != CUDA_SUCCESS) {
        if (bytes)
            gs_uncharge(g, bytes);
        return r;
    }
    gs_remember((uint64_t)(uintptr_t)*pctx, bytes, (struct gs_place){g, 0}, K_CTX);
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
    if (r == CUDA_SUCCESS && gs_enforcing() > 0)
        context_ended(ctx);
    return r;
}

WRAP_API CUresult cuCtxDestroy(CUcontext ctx)
{
    CUresult r = REAL(cuCtxDestroy)(ctx);
    if (r == CUDA_SUCCESS && gs_enforcing() > 0)
        context_ended(ctx);
    return r;
}

/* Primary contexts: charged at the first retain, ended by the last release
 * or a reset; their handle is the same for every retain of a device. */
static int primary_refs[MAX_DEVICES];
static CUcontext primary_ctx[MAX_DEVICES];

WRAP_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    int on = gs_enforcing();
    if (on <= 0 || !pctx || dev < 0 || dev >= MAX_DEVICES)
        return on < 0 ? CUDA_ERROR_NOT_INITIALIZED : REAL(cuDevicePrimaryCtxRetain)(pctx, dev);
    int g = gs_slice_gpu_of_device(dev);
    uint64_t bytes = reserve_of(g);
    int first = __atomic_fetch_add(&primary_refs[dev], 1, __ATOMIC_ACQ_REL) == 0;
    if (first && bytes && gs_charge(g, bytes) != 0) {
        __atomic_fetch_sub(&primary_refs[dev], 1, __ATOMIC_ACQ_REL);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = REAL(cuDevicePrimaryCtxRetain)(pctx, dev);
    if (r != CUDA_SUCCESS) {
        if (__atomic_sub_fetch(&primary_refs[dev], 1, __ATOMIC_ACQ_REL) == 0 && first && bytes)
            gs_uncharge(g, bytes);
        return r;
    }
    if (first) {
        __atomic_store_n(&primary_ctx[dev], *pctx, __ATOMIC_RELEASE);
        gs_remember((uint64_t)(uintptr_t)*pctx, bytes, (struct gs_place){g, 0}, K_CTX);
    }
    return r;
}

static CUresult primary_dropped(CUdevice dev, CUresult r, int reset)
{
    if (r != CUDA_SUCCESS || gs_enforcing() <= 0 || dev < 0 || dev >= MAX_DEVICES)
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
