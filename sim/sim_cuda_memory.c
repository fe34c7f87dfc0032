/* Simulated driver: the allocation table, device, managed and host memory,
 * what a pointer is (cuPointerGetAttribute), and module globals.
 *
 * Device memory is an anonymous MAP_NORESERVE mapping (or a memfd for VMM
 * handles, which may be mapped more than once), so an 80 GiB GPU costs no
 * host memory until bytes are written.  Device pointers are host addresses:
 * unified addressing, as on a real 64-bit system.  Every device allocation is
 * charged to the shared machine state before it succeeds. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "sim_cuda.h"
#include "sim_memory.h"

/* sorted by base; guarded by sim_mu */
struct alloc *sim_allocs;
size_t sim_n_allocs;
static size_t cap_allocs;

size_t sim_alloc_index(uint64_t addr) /* first alloc with base > addr */
{
    size_t lo = 0, hi = sim_n_allocs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (sim_allocs[mid].base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

struct alloc *sim_alloc_find(uint64_t addr)
{
    size_t i = sim_alloc_index(addr);
    if (i == 0)
        return NULL;
    struct alloc *a = &sim_allocs[i - 1];
    return addr < a->base + a->size ? a : NULL;
}

int sim_alloc_insert(const struct alloc *a)
{
    if (sim_n_allocs == cap_allocs) {
        size_t nc = cap_allocs ? cap_allocs * 2 : 64;
        struct alloc *n = realloc(sim_allocs, nc * sizeof *n);
        if (!n)
            return -1;
        sim_allocs = n;
        cap_allocs = nc;
    }
    size_t i = sim_alloc_index(a->base);
    memmove(&sim_allocs[i + 1], &sim_allocs[i], (sim_n_allocs - i) * sizeof *sim_allocs);
    sim_allocs[i] = *a;
    sim_n_allocs++;
    return 0;
}

static void alloc_remove(struct alloc *a)
{
    size_t i = (size_t)(a - sim_allocs);
    memmove(&sim_allocs[i], &sim_allocs[i + 1], (sim_n_allocs - i - 1) * sizeof *sim_allocs);
    sim_n_allocs--;
}

int sim_addr_is_device(uint64_t addr, size_t n)
{
    pthread_mutex_lock(&sim_mu);
    struct alloc *a = sim_alloc_find(addr);
    int ok = a && a->accessible && addr + n <= a->base + a->size;
    pthread_mutex_unlock(&sim_mu);
    return ok;
}

void *sim_map_lazy(size_t size, int low32)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | (low32 ? MAP_32BIT : 0), -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Its memory and its charge given back; the table's entry is gone already. */
static void alloc_release(struct alloc a)
{
    switch (a.kind) {
    case K_DEVICE:
    case K_MANAGED:
    case K_POOL:
        munmap((void *)(uintptr_t)a.base, a.size);
        sim_mem_uncharge(a.dev, a.size);
        if (a.pool && a.pool->used >= a.size)
            a.pool->used -= a.size;
        break;
    case K_HOST:
        munmap((void *)(uintptr_t)a.base, a.size);
        break;
    case K_REGISTERED:
        break;
    case K_VMM:
        mmap((void *)(uintptr_t)a.base, a.size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        a.vmm->mappings--;
        sim_vmm_maybe_free(a.vmm);
        break;
    }
}

void sim_alloc_drop(struct alloc *a)
{
    struct alloc copy = *a; /* the entry's slot is reused by the removal */
    alloc_remove(a);
    alloc_release(copy);
}

void sim_ctx_free_memory(struct sim_ctx *c)
{
    pthread_mutex_lock(&sim_mu);
    for (size_t i = sim_n_allocs; i-- > 0;) {
        if (sim_allocs[i].ctx == c && sim_allocs[i].kind != K_VMM)
            sim_alloc_drop(&sim_allocs[i]);
    }
    pthread_mutex_unlock(&sim_mu);
}

CUresult sim_device_alloc(CUdeviceptr *dptr, size_t size, enum alloc_kind kind, int dev, struct sim_pool *pool,
                             int low32)
{
    struct sim_ctx *c;
    CUresult r = sim_ctx_or_error(&c);
    if (r)
        return r;
    if (!dptr || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0)
        dev = c->dev;
    if (sim_mem_charge(dev, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = sim_map_lazy(size, low32);
    if (!p) {
        sim_mem_uncharge(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct alloc a = {.base = (uint64_t)(uintptr_t)p, .size = size, .kind = kind, .dev = dev, .accessible = 1,
                      .ctx = c, .pool = pool};
    pthread_mutex_lock(&sim_mu);
    int bad = sim_alloc_insert(&a);
    if (!bad && pool) {
        pool->used += size;
        if (pool->used > pool->used_high)
            pool->used_high = pool->used;
    }
    pthread_mutex_unlock(&sim_mu);
    if (bad) {
        munmap(p, size);
        sim_mem_uncharge(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = a.base;
    return CUDA_SUCCESS;
}

CUAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    return sim_device_alloc(dptr, size, K_DEVICE, -1, NULL, 0);
}

CUAPI cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int size)
{
    CUdeviceptr p;
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_device_alloc(&p, size, K_DEVICE, -1, NULL, 1);
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr_v1)p; /* MAP_32BIT keeps it below 4 GiB */
    return r;
}

CUAPI cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int elem)
{
    if (!pitch || width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16))
        return sim_check_init() ? sim_check_init() : CUDA_ERROR_INVALID_VALUE;
    size_t p = (width + 511) & ~(size_t)511;
    if (height > SIZE_MAX / p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = sim_device_alloc(dptr, p * height, K_DEVICE, -1, NULL, 0);
    if (r == CUDA_SUCCESS)
        *pitch = p;
    return r;
}

CUAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return sim_check_init() ? sim_check_init() : CUDA_ERROR_INVALID_VALUE;
    return sim_device_alloc(dptr, size, K_MANAGED, -1, NULL, 0);
}

CUresult sim_free_kind(CUdeviceptr dptr, int want_pool_ok)
{
    SIM_ENTER();
    if (dptr == 0)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&sim_mu);
    struct alloc *a = sim_alloc_find(dptr);
    if (!a || a->base != dptr || a->kind == K_HOST || a->kind == K_REGISTERED || a->kind == K_VMM ||
        (!want_pool_ok && a->kind == K_POOL)) {
        pthread_mutex_unlock(&sim_mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_alloc_drop(a);
    pthread_mutex_unlock(&sim_mu);
    return CUDA_SUCCESS;
}

CUAPI cuMemFree_v2(CUdeviceptr dptr)
{
    return sim_free_kind(dptr, 1);
}

CUAPI cuMemFree(CUdeviceptr_v1 dptr)
{
    return sim_free_kind(dptr, 1);
}

CUAPI cuMemGetInfo_v2(size_t *free_b, size_t *total)
{
    struct sim_ctx *c;
    CUresult r = sim_ctx_or_error(&c);
    if (r)
        return r;
    if (!free_b || !total)
        return CUDA_ERROR_INVALID_VALUE;
    sim_sweep_dead();
    uint64_t cap = sim_machine()->gpu[c->dev].memory;
    sim_gpu_lock(c->dev);
    uint64_t used = sim_shm->gpu[c->dev].used;
    uint64_t free_dev = used >= cap ? 0 : cap - used;
    int slot = sim_self_slot();
    const struct sim_cg_limit *l = slot >= 0 ? sim_cg_limit_of(c->dev, sim_shm->proc[slot].cgroup) : NULL;
    if (l) { /* inside a limited cgroup the driver shows the limit */
        uint64_t hard = l->hard < cap ? l->hard : cap;
        uint64_t free_cg = l->used >= hard ? 0 : hard - l->used;
        cap = hard;
        free_dev = free_cg < free_dev ? free_cg : free_dev;
    }
    sim_gpu_unlock(c->dev);
    *total = cap;
    *free_b = free_dev;
    return CUDA_SUCCESS;
}

CUAPI cuMemGetInfo(unsigned int *free_b, unsigned int *total)
{
    size_t f, t;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    if (r == CUDA_SUCCESS) {
        *free_b = f > 0xffffffffu ? 0xffffffffu : (unsigned)f;
        *total = t > 0xffffffffu ? 0xffffffffu : (unsigned)t;
    }
    return r;
}

/* ---- host memory ----------------------------------------------------- */

CUAPI cuMemHostAlloc(void **pp, size_t size, unsigned int flags)
{
    struct sim_ctx *c;
    CUresult r = sim_ctx_or_error(&c);
    if (r)
        return r;
    if (!pp || size == 0 || (flags & ~0x7u))
        return CUDA_ERROR_INVALID_VALUE;
    void *p = sim_map_lazy(size, 0);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct alloc a = {.base = (uint64_t)(uintptr_t)p, .size = size, .kind = K_HOST, .dev = c->dev, .accessible = 1, .ctx = c};
    pthread_mutex_lock(&sim_mu);
    int bad = sim_alloc_insert(&a);
    pthread_mutex_unlock(&sim_mu);
    if (bad) {
        munmap(p, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

CUAPI cuMemAllocHost_v2(void **pp, size_t size)
{
    return cuMemHostAlloc(pp, size, 0);
}

CUAPI cuMemFreeHost(void *p)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_mu);
    struct alloc *a = sim_alloc_find((uint64_t)(uintptr_t)p);
    if (!a || a->base != (uint64_t)(uintptr_t)p || a->kind != K_HOST) {
        pthread_mutex_unlock(&sim_mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim_alloc_drop(a);
    pthread_mutex_unlock(&sim_mu);
    return CUDA_SUCCESS;
}

CUAPI cuMemHostGetDevicePointer_v2(CUdeviceptr *dptr, void *p, unsigned int flags)
{
    SIM_ENTER();
    if (!dptr || flags)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_mu);
    struct alloc *a = sim_alloc_find((uint64_t)(uintptr_t)p);
    int ok = a && (a->kind == K_HOST || a->kind == K_REGISTERED);
    pthread_mutex_unlock(&sim_mu);
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUAPI cuMemHostRegister_v2(void *p, size_t size, unsigned int flags)
{
    struct sim_ctx *c;
    CUresult r = sim_ctx_or_error(&c);
    if (r)
        return r;
    (void)flags;
    if (!p || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct alloc a = {.base = (uint64_t)(uintptr_t)p, .size = size, .kind = K_REGISTERED, .dev = c->dev, .accessible = 1, .ctx = c};
    pthread_mutex_lock(&sim_mu);
    size_t i = sim_alloc_index(a.base);
    int overlap = (i > 0 && sim_allocs[i - 1].base + sim_allocs[i - 1].size > a.base) ||
                  (i < sim_n_allocs && sim_allocs[i].base < a.base + size);
    int bad = overlap ? 1 : sim_alloc_insert(&a) ? 2 : 0;
    pthread_mutex_unlock(&sim_mu);
    return bad == 1 ? CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED : bad ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

CUAPI cuMemHostRegister(void *p, size_t size, unsigned int flags)
{
    return cuMemHostRegister_v2(p, size, flags);
}

CUAPI cuMemHostUnregister(void *p)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_mu);
    struct alloc *a = sim_alloc_find((uint64_t)(uintptr_t)p);
    int ok = a && a->base == (uint64_t)(uintptr_t)p && a->kind == K_REGISTERED;
    if (ok)
        sim_alloc_drop(a);
    pthread_mutex_unlock(&sim_mu);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

CUAPI cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_mu);
    struct alloc *a = sim_alloc_find(dptr);
    struct alloc copy = a ? *a : (struct alloc){0};
    pthread_mutex_unlock(&sim_mu);
    if (!a)
        return CUDA_ERROR_NOT_FOUND;
    if (base)
        *base = copy.base;
    if (size)
        *size = copy.size;
    return CUDA_SUCCESS;
}

CUAPI cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr)
{
    SIM_ENTER();
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_mu);
    struct alloc *a = sim_alloc_find(ptr);
    struct alloc c = a ? *a : (struct alloc){0};
    pthread_mutex_unlock(&sim_mu);
    if (!a)
        return CUDA_ERROR_INVALID_VALUE; /* not memory the driver knows */
    int host = c.kind == K_HOST || c.kind == K_REGISTERED;
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = (CUcontext)c.ctx; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned *)data = host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = ptr; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (!host && c.kind != K_MANAGED)
            return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)(uintptr_t)ptr;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data = c.kind == K_MANAGED; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = c.dev; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = c.base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = c.size; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data = c.accessible; break;
    /* the rest as cuda.h documents them; what is not modelled reads as a driver without it would */
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: *(int *)data = 0; break; /* cuPointerSetAttribute is not modelled */
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:                           /* unique while the allocation lives */
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
        *(unsigned long long *)data = c.vmm ? (unsigned long long)(uintptr_t)c.vmm : c.base;
        break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *(int *)data = c.kind == K_DEVICE; break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: *(unsigned long long *)data = 0; break; /* none exportable */
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
        *(int *)data = c.kind == K_DEVICE || c.kind == K_POOL;
        break;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
        *(unsigned *)data = c.accessible || host ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE
                                                 : CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE;
        break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: *(CUmemoryPool *)data = (CUmemoryPool)c.pool; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: *(size_t *)data = c.size; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: *(void **)data = (void *)(uintptr_t)c.base; break;
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE: *(int *)data = 0; break;
    case CU_POINTER_ATTRIBUTE_LOCALITY_DOMAIN_ORDINAL: *(int *)data = -1; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult sim_global_alloc(CUdeviceptr *dptr, size_t size)
{
    return cuMemAlloc_v2(dptr, size);
}

CUresult sim_global_free(CUdeviceptr dptr)
{
    return cuMemFree_v2(dptr);
}
