/* Simulated driver: every allocation path, copies and sets.
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

#define GRANULARITY (2ull << 20)

enum alloc_kind { K_DEVICE, K_MANAGED, K_HOST, K_REGISTERED, K_POOL, K_VMM };

struct vmm_handle {
    uint32_t magic;
    int dev;
    int fd;
    size_t size;
    int refs; /* the creation's, one per retain; each release ends one */
    int mappings;
};

struct alloc {
    uint64_t base;
    uint64_t size;
    enum alloc_kind kind;
    int dev;
    int accessible; /* VMM mappings need cuMemSetAccess first */
    struct sim_ctx *ctx;
    struct sim_pool *pool;
    struct vmm_handle *vmm;
};

/* sorted by base; guarded by sim_mu */
static struct alloc *allocs;
static size_t n_allocs, cap_allocs;

struct reservation {
    uint64_t base, size;
};
static struct reservation *resv;
static size_t n_resv, cap_resv;

static size_t find_index(uint64_t addr) /* first alloc with base > addr */
{
    size_t lo = 0, hi = n_allocs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (allocs[mid].base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static struct alloc *find_alloc(uint64_t addr)
{
    size_t i = find_index(addr);
    if (i == 0)
        return NULL;
    struct alloc *a = &allocs[i - 1];
    return addr < a->base + a->size ? a : NULL;
}

static int insert_alloc(const struct alloc *a)
{
    if (n_allocs == cap_allocs) {
        size_t nc = cap_allocs ? cap_allocs * 2 : 64;
        struct alloc *n = realloc(allocs, nc * sizeof *n);
        if (!n)
            return -1;
        allocs = n;
        cap_allocs = nc;
    }
    size_t i = find_index(a->base);
    memmove(&allocs[i + 1], &allocs[i], (n_allocs - i) * sizeof *allocs);
    allocs[i] = *a;
    n_allocs++;
    return 0;
}

static void remove_alloc(struct alloc *a)
{
    size_t i = (size_t)(a - allocs);
    memmove(&allocs[i], &allocs[i + 1], (n_allocs - i - 1) * sizeof *allocs);
    n_allocs--;
}

int sim_addr_is_device(uint64_t addr, size_t n)
{
    pthread_mutex_lock(&sim_mu);
    struct alloc *a = find_alloc(addr);
    int ok = a && a->accessible && addr + n <= a->base + a->size;
    pthread_mutex_unlock(&sim_mu);
    return ok;
}

static void *map_lazy(size_t size, int low32)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | (low32 ? MAP_32BIT : 0), -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* The driver frees a handle's memory once no reference (the creation's and
 * one per cuMemRetainAllocationHandle, each ended by a cuMemRelease) and no
 * mapping is left. */
static void vmm_maybe_free(struct vmm_handle *h)
{
    if (h->refs == 0 && h->mappings == 0) {
        sim_mem_uncharge(h->dev, h->size);
        close(h->fd);
        h->magic = MAGIC_DEAD;
        free(h);
    }
}

/* Free one allocation; caller holds sim_mu and passes a copy. */
static void release(struct alloc a)
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
        vmm_maybe_free(a.vmm);
        break;
    }
}

void sim_ctx_free_memory(struct sim_ctx *c)
{
    pthread_mutex_lock(&sim_mu);
    for (size_t i = n_allocs; i-- > 0;) {
        if (allocs[i].ctx == c && allocs[i].kind != K_VMM) {
            struct alloc a = allocs[i];
            remove_alloc(&allocs[i]);
            release(a);
        }
    }
    pthread_mutex_unlock(&sim_mu);
}

static CUresult device_alloc(CUdeviceptr *dptr, size_t size, enum alloc_kind kind, int dev, struct sim_pool *pool,
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
    void *p = map_lazy(size, low32);
    if (!p) {
        sim_mem_uncharge(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct alloc a = {.base = (uint64_t)(uintptr_t)p, .size = size, .kind = kind, .dev = dev, .accessible = 1,
                      .ctx = c, .pool = pool};
    pthread_mutex_lock(&sim_mu);
    int bad = insert_alloc(&a);
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
    return device_alloc(dptr, size, K_DEVICE, -1, NULL, 0);
}

CUAPI cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int size)
{
    CUdeviceptr p;
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = device_alloc(&p, size, K_DEVICE, -1, NULL, 1);
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
    CUresult r = device_alloc(dptr, p * height, K_DEVICE, -1, NULL, 0);
    if (r == CUDA_SUCCESS)
        *pitch = p;
    return r;
}

CUAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return sim_check_init() ? sim_check_init() : CUDA_ERROR_INVALID_VALUE;
    return device_alloc(dptr, size, K_MANAGED, -1, NULL, 0);
}

static CUresult free_kind(CUdeviceptr dptr, int want_pool_ok)
{
    SIM_ENTER();
    if (dptr == 0)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&sim_mu);
    struct alloc *a = find_alloc(dptr);
    if (!a || a->base != dptr || a->kind == K_HOST || a->kind == K_REGISTERED || a->kind == K_VMM ||
        (!want_pool_ok && a->kind == K_POOL)) {
        pthread_mutex_unlock(&sim_mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct alloc copy = *a;
    remove_alloc(a);
    release(copy);
    pthread_mutex_unlock(&sim_mu);
    return CUDA_SUCCESS;
}

CUAPI cuMemFree_v2(CUdeviceptr dptr)
{
    return free_kind(dptr, 1);
}

CUAPI cuMemFree(CUdeviceptr_v1 dptr)
{
    return free_kind(dptr, 1);
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
    void *p = map_lazy(size, 0);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct alloc a = {.base = (uint64_t)(uintptr_t)p, .size = size, .kind = K_HOST, .dev = c->dev, .accessible = 1, .ctx = c};
    pthread_mutex_lock(&sim_mu);
    int bad = insert_alloc(&a);
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
    struct alloc *a = find_alloc((uint64_t)(uintptr_t)p);
    if (!a || a->base != (uint64_t)(uintptr_t)p || a->kind != K_HOST) {
        pthread_mutex_unlock(&sim_mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct alloc copy = *a;
    remove_alloc(a);
    release(copy);
    pthread_mutex_unlock(&sim_mu);
    return CUDA_SUCCESS;
}

CUAPI cuMemHostGetDevicePointer_v2(CUdeviceptr *dptr, void *p, unsigned int flags)
{
    SIM_ENTER();
    if (!dptr || flags)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_mu);
    struct alloc *a = find_alloc((uint64_t)(uintptr_t)p);
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
    size_t i = find_index(a.base);
    int overlap = (i > 0 && allocs[i - 1].base + allocs[i - 1].size > a.base) ||
                  (i < n_allocs && allocs[i].base < a.base + size);
    int bad = overlap ? 1 : insert_alloc(&a) ? 2 : 0;
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
    struct alloc *a = find_alloc((uint64_t)(uintptr_t)p);
    int ok = a && a->base == (uint64_t)(uintptr_t)p && a->kind == K_REGISTERED;
    if (ok)
        remove_alloc(a);
    pthread_mutex_unlock(&sim_mu);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

CUAPI cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_mu);
    struct alloc *a = find_alloc(dptr);
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
    struct alloc *a = find_alloc(ptr);
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

/* ---- copies and sets ------------------------------------------------- */

enum side { HOST_SIDE, DEVICE_SIDE, ANY_SIDE };

/* A pointer claimed to be device memory must lie inside one accessible
 * allocation; with unified addressing (ANY_SIDE) unknown pointers are host. */
static int check_side(uint64_t p, size_t n, enum side s)
{
    if (s == HOST_SIDE)
        return p != 0 || n == 0;
    pthread_mutex_lock(&sim_mu);
    struct alloc *a = find_alloc(p);
    int ok = a ? (a->accessible && p + n <= a->base + a->size) : (s == ANY_SIDE && p != 0);
    pthread_mutex_unlock(&sim_mu);
    return ok;
}

static CUresult do_copy(uint64_t dst, enum side ds, uint64_t src, enum side ss, size_t n, CUstream hs, int async,
                        int ptds)
{
    SIM_ENTER();
    struct sim_stream *s = sim_stream_resolve(hs, ptds, &r);
    if (!s)
        return r;
    if (n == 0)
        return CUDA_SUCCESS;
    if (!check_side(dst, n, ds) || !check_side(src, n, ss))
        return CUDA_ERROR_INVALID_VALUE;
    if (s->capture)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (!async) /* synchronous copies are ordered after queued work */
        sim_sleep_until(sim_stream_not_before(s));
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

#define H(p) ((uint64_t)(uintptr_t)(p))
CUAPI cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { return do_copy(d, ANY_SIDE, s, ANY_SIDE, n, NULL, 0, 0); }
CUAPI cuMemcpy_ptds(CUdeviceptr d, CUdeviceptr s, size_t n) { return do_copy(d, ANY_SIDE, s, ANY_SIDE, n, NULL, 0, 1); }
CUAPI cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return do_copy(d, ANY_SIDE, s, ANY_SIDE, n, st, 1, 0); }
CUAPI cuMemcpyAsync_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return do_copy(d, ANY_SIDE, s, ANY_SIDE, n, st, 1, 1); }
CUAPI cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { return do_copy(d, DEVICE_SIDE, H(s), HOST_SIDE, n, NULL, 0, 0); }
CUAPI cuMemcpyHtoD_v2_ptds(CUdeviceptr d, const void *s, size_t n) { return do_copy(d, DEVICE_SIDE, H(s), HOST_SIDE, n, NULL, 0, 1); }
CUAPI cuMemcpyHtoD(CUdeviceptr_v1 d, const void *s, unsigned n) { return do_copy(d, DEVICE_SIDE, H(s), HOST_SIDE, n, NULL, 0, 0); }
CUAPI cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { return do_copy(H(d), HOST_SIDE, s, DEVICE_SIDE, n, NULL, 0, 0); }
CUAPI cuMemcpyDtoH_v2_ptds(void *d, CUdeviceptr s, size_t n) { return do_copy(H(d), HOST_SIDE, s, DEVICE_SIDE, n, NULL, 0, 1); }
CUAPI cuMemcpyDtoH(void *d, CUdeviceptr_v1 s, unsigned n) { return do_copy(H(d), HOST_SIDE, s, DEVICE_SIDE, n, NULL, 0, 0); }
CUAPI cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { return do_copy(d, DEVICE_SIDE, s, DEVICE_SIDE, n, NULL, 0, 0); }
CUAPI cuMemcpyDtoD_v2_ptds(CUdeviceptr d, CUdeviceptr s, size_t n) { return do_copy(d, DEVICE_SIDE, s, DEVICE_SIDE, n, NULL, 0, 1); }
CUAPI cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream st) { return do_copy(d, DEVICE_SIDE, H(s), HOST_SIDE, n, st, 1, 0); }
CUAPI cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d, const void *s, size_t n, CUstream st) { return do_copy(d, DEVICE_SIDE, H(s), HOST_SIDE, n, st, 1, 1); }
CUAPI cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUstream st) { return do_copy(H(d), HOST_SIDE, s, DEVICE_SIDE, n, st, 1, 0); }
CUAPI cuMemcpyDtoHAsync_v2_ptsz(void *d, CUdeviceptr s, size_t n, CUstream st) { return do_copy(H(d), HOST_SIDE, s, DEVICE_SIDE, n, st, 1, 1); }
CUAPI cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return do_copy(d, DEVICE_SIDE, s, DEVICE_SIDE, n, st, 1, 0); }
CUAPI cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return do_copy(d, DEVICE_SIDE, s, DEVICE_SIDE, n, st, 1, 1); }

static CUresult do_set(CUdeviceptr d, unsigned value, unsigned width, size_t count, CUstream hs, int async, int ptds)
{
    SIM_ENTER();
    struct sim_stream *s = sim_stream_resolve(hs, ptds, &r);
    if (!s)
        return r;
    if (count == 0)
        return CUDA_SUCCESS;
    if (count > SIZE_MAX / width || (d % width) || !check_side(d, count * width, DEVICE_SIDE))
        return CUDA_ERROR_INVALID_VALUE;
    if (s->capture)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (!async)
        sim_sleep_until(sim_stream_not_before(s));
    unsigned char *p = (unsigned char *)(uintptr_t)d;
    if (width == 1) {
        memset(p, (int)(value & 0xff), count);
    } else {
        for (size_t i = 0; i < count; i++)
            memcpy(p + i * width, width == 2 ? (void *)&(uint16_t){(uint16_t)value} : (void *)&(uint32_t){value}, width);
    }
    return CUDA_SUCCESS;
}

CUAPI cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { return do_set(d, v, 1, n, NULL, 0, 0); }
CUAPI cuMemsetD8_v2_ptds(CUdeviceptr d, unsigned char v, size_t n) { return do_set(d, v, 1, n, NULL, 0, 1); }
CUAPI cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) { return do_set(d, v, 2, n, NULL, 0, 0); }
CUAPI cuMemsetD16_v2_ptds(CUdeviceptr d, unsigned short v, size_t n) { return do_set(d, v, 2, n, NULL, 0, 1); }
CUAPI cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) { return do_set(d, v, 4, n, NULL, 0, 0); }
CUAPI cuMemsetD32_v2_ptds(CUdeviceptr d, unsigned int v, size_t n) { return do_set(d, v, 4, n, NULL, 0, 1); }
CUAPI cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { return do_set(d, v, 1, n, s, 1, 0); }
CUAPI cuMemsetD8Async_ptsz(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { return do_set(d, v, 1, n, s, 1, 1); }
CUAPI cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) { return do_set(d, v, 2, n, s, 1, 0); }
CUAPI cuMemsetD16Async_ptsz(CUdeviceptr d, unsigned short v, size_t n, CUstream s) { return do_set(d, v, 2, n, s, 1, 1); }
CUAPI cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s) { return do_set(d, v, 4, n, s, 1, 0); }
CUAPI cuMemsetD32Async_ptsz(CUdeviceptr d, unsigned int v, size_t n, CUstream s) { return do_set(d, v, 4, n, s, 1, 1); }

/* ---- virtual memory management --------------------------------------- */

static int valid_prop(const CUmemAllocationProp *p)
{
    return p && p->type == CU_MEM_ALLOCATION_TYPE_PINNED && p->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
           p->location.id >= 0 && p->location.id < sim_machine()->gpu_count;
}

CUAPI cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option)
{
    SIM_ENTER();
    if (!g || !valid_prop(prop) || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    *g = GRANULARITY;
    return CUDA_SUCCESS;
}

CUAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                  unsigned long long flags)
{
    SIM_ENTER();
    if (!handle || !valid_prop(prop) || size == 0 || size % GRANULARITY || flags)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = prop->location.id;
    if (sim_mem_charge(dev, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct vmm_handle *h = calloc(1, sizeof *h);
    int fd = h ? memfd_create("gpuslice-sim-vmm", MFD_CLOEXEC) : -1;
    if (!h || fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0)
            close(fd);
        free(h);
        sim_mem_uncharge(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *h = (struct vmm_handle){.magic = MAGIC_VMM, .dev = dev, .fd = fd, .size = size, .refs = 1};
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}

static struct vmm_handle *vmm_of(CUmemGenericAllocationHandle handle)
{
    struct vmm_handle *h = (struct vmm_handle *)(uintptr_t)handle;
    return h && h->magic == MAGIC_VMM && h->refs > 0 ? h : NULL;
}

CUAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_mu);
    struct vmm_handle *h = vmm_of(handle);
    if (h) {
        h->refs--; /* memory goes back once no reference and no mapping is left */
        vmm_maybe_free(h);
    }
    pthread_mutex_unlock(&sim_mu);
    return h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* The handle of the memory mapped at addr, with one more reference on it (a
 * released handle whose memory is still mapped comes back to life). */
CUAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    SIM_ENTER();
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_mu);
    struct alloc *a = find_alloc((uint64_t)(uintptr_t)addr);
    struct vmm_handle *h = a && a->kind == K_VMM ? a->vmm : NULL;
    if (h) {
        h->refs++;
        *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    }
    pthread_mutex_unlock(&sim_mu);
    return h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags)
{
    SIM_ENTER();
    if (!ptr || size == 0 || size % GRANULARITY || flags || (align & (align - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    if (align < GRANULARITY)
        align = GRANULARITY;
    /* over-reserve to honour the alignment, then trim */
    size_t span = size + align;
    char *p = mmap((void *)(uintptr_t)addr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t start = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
    if (start > (uintptr_t)p)
        munmap(p, start - (uintptr_t)p);
    if ((uintptr_t)p + span > start + size)
        munmap((void *)(start + size), (uintptr_t)p + span - (start + size));
    pthread_mutex_lock(&sim_mu);
    if (n_resv == cap_resv) {
        size_t nc = cap_resv ? cap_resv * 2 : 16;
        struct reservation *n = realloc(resv, nc * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&sim_mu);
            munmap((void *)start, size);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        resv = n;
        cap_resv = nc;
    }
    resv[n_resv++] = (struct reservation){start, size};
    pthread_mutex_unlock(&sim_mu);
    *ptr = start;
    return CUDA_SUCCESS;
}

static int in_reservation(uint64_t p, size_t n)
{
    for (size_t i = 0; i < n_resv; i++)
        if (p >= resv[i].base && p + n <= resv[i].base + resv[i].size)
            return 1;
    return 0;
}

CUAPI cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_mu);
    size_t i = 0;
    while (i < n_resv && !(resv[i].base == ptr && resv[i].size == size))
        i++;
    int found = i < n_resv;
    size_t k = find_index(ptr);
    int mapped = k < n_allocs && allocs[k].base < ptr + size; /* after ptr */
    if (!mapped && k > 0)
        mapped = allocs[k - 1].base + allocs[k - 1].size > ptr;
    if (found && !mapped) {
        resv[i] = resv[--n_resv];
        munmap((void *)(uintptr_t)ptr, size);
    }
    pthread_mutex_unlock(&sim_mu);
    return !found ? CUDA_ERROR_INVALID_VALUE : mapped ? CUDA_ERROR_ILLEGAL_STATE : CUDA_SUCCESS;
}

CUAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
               unsigned long long flags)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_mu);
    struct vmm_handle *h = vmm_of(handle);
    r = CUDA_SUCCESS;
    if (!h || flags || size == 0 || size % GRANULARITY || offset % GRANULARITY || offset + size > h->size ||
        !in_reservation(ptr, size))
        r = CUDA_ERROR_INVALID_VALUE;
    else if (find_alloc(ptr) || (find_index(ptr) < n_allocs && allocs[find_index(ptr)].base < ptr + size))
        r = CUDA_ERROR_ALREADY_MAPPED;
    if (r == CUDA_SUCCESS) {
        void *p = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, (off_t)offset);
        struct alloc a = {.base = ptr, .size = size, .kind = K_VMM, .dev = h->dev, .vmm = h,
                          .ctx = sim_current_ctx()};
        if (p == MAP_FAILED || insert_alloc(&a))
            r = CUDA_ERROR_OUT_OF_MEMORY;
        else
            h->mappings++;
    }
    pthread_mutex_unlock(&sim_mu);
    return r;
}

CUAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_mu);
    struct alloc *a = find_alloc(ptr);
    int ok = a && a->kind == K_VMM && a->base == ptr && a->size == size;
    if (ok) {
        struct alloc copy = *a;
        remove_alloc(a);
        release(copy);
    }
    pthread_mutex_unlock(&sim_mu);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    SIM_ENTER();
    if (!desc || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int prot = PROT_NONE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
            desc[i].location.id >= sim_machine()->gpu_count)
            return CUDA_ERROR_INVALID_DEVICE;
        if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            prot = PROT_READ | PROT_WRITE;
        else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ && prot == PROT_NONE)
            prot = PROT_READ;
    }
    pthread_mutex_lock(&sim_mu);
    /* every byte of the range must be mapped */
    uint64_t p = ptr, end = ptr + size;
    r = CUDA_SUCCESS;
    while (p < end && r == CUDA_SUCCESS) {
        struct alloc *a = find_alloc(p);
        if (!a || a->kind != K_VMM) {
            r = CUDA_ERROR_INVALID_VALUE;
            break;
        }
        p = a->base + a->size;
    }
    for (p = ptr; r == CUDA_SUCCESS && p < end;) {
        struct alloc *a = find_alloc(p);
        mprotect((void *)(uintptr_t)a->base, a->size, prot);
        a->accessible = prot != PROT_NONE;
        p = a->base + a->size;
    }
    pthread_mutex_unlock(&sim_mu);
    return r;
}

/* ---- stream-ordered allocation and pools ------------------------------ */

static struct sim_pool default_pool[SIM_MAX_GPUS];
static struct sim_pool *current_pool[SIM_MAX_GPUS];

static struct sim_pool *pool_of(CUmemoryPool h)
{
    struct sim_pool *p = (struct sim_pool *)h;
    return p && p->magic == MAGIC_POOL ? p : NULL;
}

static struct sim_pool *device_pool(int dev)
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
    device_pool(dev);
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
    *pool = (CUmemoryPool)device_pool(dev);
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
    for (size_t i = n_allocs; i-- > 0;)
        if (allocs[i].pool == p) {
            struct alloc a = allocs[i];
            remove_alloc(&allocs[i]);
            release(a);
        }
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
        p = device_pool(s->ctx->dev);
    if (p->max_size && p->used + size > p->max_size)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return device_alloc(dptr, size, K_POOL, p->dev, p, 0);
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
    return free_kind(d, 1);
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

/* ---- arrays ---------------------------------------------------------- */

struct sim_array {
    uint32_t magic;
    int dev;
    CUDA_ARRAY3D_DESCRIPTOR desc;
    size_t bytes;
    void *data;
};

struct sim_mipmap {
    uint32_t magic;
    unsigned levels;
    struct sim_array *level[32];
};

static size_t format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
    }
}

static size_t array_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    size_t e = format_bytes(d->Format);
    if (!e || d->Width == 0 || (d->NumChannels != 1 && d->NumChannels != 2 && d->NumChannels != 4))
        return 0;
    size_t h = d->Height ? d->Height : 1, z = d->Depth ? d->Depth : 1;
    size_t row = d->Width * e * d->NumChannels;
    if (row / d->Width != e * d->NumChannels || h > SIZE_MAX / row || z > SIZE_MAX / (row * h))
        return 0;
    return row * h * z;
}

static CUresult array_new(const CUDA_ARRAY3D_DESCRIPTOR *d, struct sim_array **out)
{
    struct sim_ctx *c;
    CUresult r = sim_ctx_or_error(&c);
    if (r)
        return r;
    size_t bytes = d ? array_bytes(d) : 0;
    if (!bytes || (d->Depth && !d->Height))
        return CUDA_ERROR_INVALID_VALUE;
    if (sim_mem_charge(c->dev, bytes))
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim_array *a = calloc(1, sizeof *a);
    void *data = a ? map_lazy(bytes, 0) : NULL;
    if (!data) {
        free(a);
        sim_mem_uncharge(c->dev, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *a = (struct sim_array){.magic = MAGIC_ARRAY, .dev = c->dev, .desc = *d, .bytes = bytes, .data = data};
    *out = a;
    return CUDA_SUCCESS;
}

static void array_free(struct sim_array *a)
{
    munmap(a->data, a->bytes);
    sim_mem_uncharge(a->dev, a->bytes);
    a->magic = MAGIC_DEAD;
    free(a);
}

CUAPI cuArray3DCreate_v2(CUarray *h, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    if (!h)
        return sim_check_init() ? sim_check_init() : CUDA_ERROR_INVALID_VALUE;
    struct sim_array *a;
    CUresult r = array_new(d, &a);
    if (r == CUDA_SUCCESS)
        *h = (CUarray)a;
    return r;
}

CUAPI cuArrayCreate_v2(CUarray *h, const CUDA_ARRAY_DESCRIPTOR *d)
{
    if (!d)
        return sim_check_init() ? sim_check_init() : CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d3 = {.Width = d->Width, .Height = d->Height, .Format = d->Format,
                                  .NumChannels = d->NumChannels};
    return cuArray3DCreate_v2(h, &d3);
}

static struct sim_array *array_of(CUarray h)
{
    struct sim_array *a = (struct sim_array *)h;
    return a && a->magic == MAGIC_ARRAY ? a : NULL;
}

CUAPI cuArrayDestroy(CUarray h)
{
    SIM_ENTER();
    struct sim_array *a = array_of(h);
    if (!a)
        return CUDA_ERROR_INVALID_HANDLE;
    array_free(a);
    return CUDA_SUCCESS;
}

CUAPI cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR *d, CUarray h)
{
    SIM_ENTER();
    struct sim_array *a = array_of(h);
    if (!a)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    *d = a->desc;
    return CUDA_SUCCESS;
}

CUAPI cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR *d, CUarray h)
{
    CUDA_ARRAY3D_DESCRIPTOR d3;
    CUresult r = cuArray3DGetDescriptor_v2(d ? &d3 : NULL, h);
    if (r == CUDA_SUCCESS) {
        if (d3.Depth)
            return CUDA_ERROR_INVALID_VALUE;
        *d = (CUDA_ARRAY_DESCRIPTOR){d3.Width, d3.Height, d3.Format, d3.NumChannels};
    }
    return r;
}

CUAPI cuMipmappedArrayCreate(CUmipmappedArray *h, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    SIM_ENTER();
    if (!h || !d || levels == 0 || levels > 32)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_mipmap *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->magic = MAGIC_MIPMAP;
    CUDA_ARRAY3D_DESCRIPTOR ld = *d;
    for (unsigned i = 0; i < levels; i++) {
        r = array_new(&ld, &m->level[i]);
        if (r) { /* all or nothing */
            for (unsigned j = 0; j < i; j++)
                array_free(m->level[j]);
            free(m);
            return r;
        }
        m->levels = i + 1;
        ld.Width = ld.Width > 1 ? ld.Width / 2 : 1;
        ld.Height = ld.Height > 1 ? ld.Height / 2 : ld.Height;
        ld.Depth = ld.Depth > 1 ? ld.Depth / 2 : ld.Depth;
    }
    *h = (CUmipmappedArray)m;
    return CUDA_SUCCESS;
}

static struct sim_mipmap *mipmap_of(CUmipmappedArray h)
{
    struct sim_mipmap *m = (struct sim_mipmap *)h;
    return m && m->magic == MAGIC_MIPMAP ? m : NULL;
}

CUAPI cuMipmappedArrayDestroy(CUmipmappedArray h)
{
    SIM_ENTER();
    struct sim_mipmap *m = mipmap_of(h);
    if (!m)
        return CUDA_ERROR_INVALID_HANDLE;
    for (unsigned i = 0; i < m->levels; i++)
        array_free(m->level[i]);
    m->magic = MAGIC_DEAD;
    free(m);
    return CUDA_SUCCESS;
}

CUAPI cuMipmappedArrayGetLevel(CUarray *out, CUmipmappedArray h, unsigned int level)
{
    SIM_ENTER();
    struct sim_mipmap *m = mipmap_of(h);
    if (!m)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!out || level >= m->levels)
        return CUDA_ERROR_INVALID_VALUE;
    *out = (CUarray)m->level[level];
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
