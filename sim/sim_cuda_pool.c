/* Simulated driver: stream-ordered allocation and memory pools. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include "sim_cuda.h"
#include "sim_memory.h"

/* ---- stream-ordered allocation and pools ------------------------------ */

static struct sim_pool default_pool[SIM_MAX_GPUS];
static struct sim_pool *current_pool[SIM_MAX_GPUS];

static struct sim_pool *pool_of(CUmemoryPool h)
{
    struct sim_pool *p = (struct sim_pool *)h;
    return p && p->magic == MAGIC_POOL ? p : NULL;
}

struct sim_pool *sim_device_pool(int dev)
{
    pthread_mutex_lock(&sim_mu);
    if (!default_pool[dev].magic)
        default_pool[dev] = (struct sim_pool){.magic = MAGIC_POOL, .dev = dev};
    struct sim_pool *p = current_pool[dev] ? current_pool[dev] : &default_pool[dev];
    pthread_mutex_unlock(&sim_mu);
    return p;
}

CUAPI cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    SIM_ENTER();
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= sim_machine()->gpu_count)
        return CUDA_ERROR_INVALID_DEVICE;
    sim_device_pool(dev);
    *pool = (CUmemoryPool)&default_pool[dev];
    return CUDA_SUCCESS;
}

CUAPI cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    SIM_ENTER();
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= sim_machine()->gpu_count)
        return CUDA_ERROR_INVALID_DEVICE;
    *pool = (CUmemoryPool)sim_device_pool(dev);
    return CUDA_SUCCESS;
}

CUAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    SIM_ENTER();
    struct sim_pool *p = pool_of(pool);
    if (dev < 0 || dev >= sim_machine()->gpu_count)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!p || p->dev != dev)
        return CUDA_ERROR_INVALID_VALUE;
    current_pool[dev] = p;
    return CUDA_SUCCESS;
}

CUAPI cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    SIM_ENTER();
    if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || props->location.id < 0 ||
        props->location.id >= sim_machine()->gpu_count)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_pool *p = calloc(1, sizeof *p);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (struct sim_pool){.magic = MAGIC_POOL, .dev = props->location.id, .max_size = props->maxSize};
    *pool = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

CUAPI cuMemPoolDestroy(CUmemoryPool pool)
{
    SIM_ENTER();
    struct sim_pool *p = pool_of(pool);
    if (!p || p == &default_pool[p->dev])
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_mu);
    /* outstanding allocations are freed with the pool */
    for (size_t i = sim_n_allocs; i-- > 0;)
        if (sim_allocs[i].pool == p)
            sim_alloc_drop(&sim_allocs[i]);
    if (current_pool[p->dev] == p)
        current_pool[p->dev] = NULL;
    pthread_mutex_unlock(&sim_mu);
    p->magic = MAGIC_DEAD;
    free(p);
    return CUDA_SUCCESS;
}

static CUresult pool_alloc(CUdeviceptr *dptr, size_t size, struct sim_pool *p, CUstream hs, int ptds)
{
    CUresult r;
    struct sim_stream *s = sim_stream_resolve(hs, ptds, &r);
    if (!s)
        return r;
    if (!p)
        p = sim_device_pool(s->ctx->dev);
    if (p->max_size && p->used + size > p->max_size)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return sim_device_alloc(dptr, size, K_POOL, p->dev, p, 0);
}

CUAPI cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s) { return pool_alloc(d, n, NULL, s, 0); }
CUAPI cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t n, CUstream s) { return pool_alloc(d, n, NULL, s, 1); }

static CUresult from_pool(CUdeviceptr *d, size_t n, CUmemoryPool pool, CUstream s, int ptds)
{
    SIM_ENTER();
    struct sim_pool *p = pool_of(pool);
    return p ? pool_alloc(d, n, p, s, ptds) : CUDA_ERROR_INVALID_VALUE;
}

CUAPI cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s) { return from_pool(d, n, p, s, 0); }
CUAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s) { return from_pool(d, n, p, s, 1); }

static CUresult free_async(CUdeviceptr d, CUstream hs, int ptds)
{
    CUresult r;
    struct sim_stream *s = sim_stream_resolve(hs, ptds, &r);
    if (!s)
        return r;
    /* The simulator returns pool memory at once (release threshold 0 and
     * no reuse across streams to model). */
    return sim_free_kind(d, 1);
}

CUAPI cuMemFreeAsync(CUdeviceptr d, CUstream s) { return free_async(d, s, 0); }
CUAPI cuMemFreeAsync_ptsz(CUdeviceptr d, CUstream s) { return free_async(d, s, 1); }

CUAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    (void)keep;
    CUresult r = sim_check_init();
    return r ? r : pool_of(pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    SIM_ENTER();
    struct sim_pool *p = pool_of(pool);
    if (!p || !value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_mu);
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: *(int *)value = !(p->reuse_off & (1u << attr)); break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = p->threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = p->used; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = p->used_high; break;
    default: r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&sim_mu);
    return r;
}

CUAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    SIM_ENTER();
    struct sim_pool *p = pool_of(pool);
    if (!p || !value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_mu);
    if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
        p->threshold = *(cuuint64_t *)value;
    else if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH || attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH)
        p->used_high = p->used; /* only reset to 0 is allowed; the driver resets to current */
    else if (attr >= CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES &&
             attr <= CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES)
        p->reuse_off = *(int *)value ? p->reuse_off & ~(1u << attr) : p->reuse_off | (1u << attr);
    else
        r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&sim_mu);
    return r;
}
