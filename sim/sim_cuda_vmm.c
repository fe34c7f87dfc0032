/* Simulated driver: virtual memory management (cuMemCreate, reserve, map,
 * access, retain/release with the driver's reference rules). */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/stat.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "sim_cuda.h"
#include "sim_memory.h"

struct reservation {
    uint64_t base, size;
};
static struct reservation *resv;
static size_t n_resv, cap_resv;

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

static struct vmm_handle *live; /* guarded by sim_mu */

/* Frees a handle no reference or mapping holds; caller holds sim_mu.  The
 * driver frees a handle's memory once no reference (the creation's and one
 * per cuMemRetainAllocationHandle, each ended by a cuMemRelease) and no
 * mapping is left. */
void sim_vmm_maybe_free(struct vmm_handle *h)
{
    if (h->refs || h->mappings)
        return;
    for (struct vmm_handle **p = &live; *p; p = &(*p)->next)
        if (*p == h) {
            *p = h->next;
            break;
        }
    sim_mem_uncharge(h->dev, h->size);
    close(h->fd);
    h->magic = MAGIC_DEAD;
    free(h);
}

static struct vmm_handle *vmm_new(int dev, int fd, size_t size, unsigned handle_types)
{
    struct vmm_handle *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    *h = (struct vmm_handle){.magic = MAGIC_VMM, .dev = dev, .fd = fd, .size = size, .refs = 1,
                             .handle_types = handle_types};
    pthread_mutex_lock(&sim_mu);
    h->next = live;
    live = h;
    pthread_mutex_unlock(&sim_mu);
    return h;
}

static struct vmm_handle *vmm_of(CUmemGenericAllocationHandle handle)
{
    struct vmm_handle *h = (struct vmm_handle *)(uintptr_t)handle;
    return h && h->magic == MAGIC_VMM && h->refs > 0 ? h : NULL;
}

#define MEMFD_NAME "gpuslice-sim-vmm-" /* + the device: an imported fd tells its GPU */

CUAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                  unsigned long long flags)
{
    SIM_ENTER();
    if (!handle || !valid_prop(prop) || size == 0 || size % GRANULARITY || flags ||
        (prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return CUDA_ERROR_INVALID_VALUE;
    int dev = prop->location.id;
    if (sim_mem_charge(dev, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    char name[32];
    snprintf(name, sizeof name, MEMFD_NAME "%d", dev);
    int fd = memfd_create(name, MFD_CLOEXEC);
    struct vmm_handle *h = NULL;
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0 ||
        !(h = vmm_new(dev, fd, size, (unsigned)prop->requestedHandleTypes))) {
        if (fd >= 0)
            close(fd);
        sim_mem_uncharge(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}

CUAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_mu);
    struct vmm_handle *h = vmm_of(handle);
    if (h) {
        h->refs--; /* memory goes back once no reference and no mapping is left */
        sim_vmm_maybe_free(h);
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
    struct alloc *a = sim_alloc_find((uint64_t)(uintptr_t)addr);
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
    size_t k = sim_alloc_index(ptr);
    int mapped = k < sim_n_allocs && sim_allocs[k].base < ptr + size; /* after ptr */
    if (!mapped && k > 0)
        mapped = sim_allocs[k - 1].base + sim_allocs[k - 1].size > ptr;
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
    else if (sim_alloc_find(ptr) ||
             (sim_alloc_index(ptr) < sim_n_allocs && sim_allocs[sim_alloc_index(ptr)].base < ptr + size))
        r = CUDA_ERROR_ALREADY_MAPPED;
    if (r == CUDA_SUCCESS) {
        void *p = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, (off_t)offset);
        struct alloc a = {.base = ptr, .size = size, .kind = K_VMM, .dev = h->dev, .vmm = h,
                          .ctx = sim_current_ctx()};
        if (p == MAP_FAILED || sim_alloc_insert(&a))
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
    struct alloc *a = sim_alloc_find(ptr);
    int ok = a && a->kind == K_VMM && a->base == ptr && a->size == size;
    if (ok)
        sim_alloc_drop(a);
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
        struct alloc *a = sim_alloc_find(p);
        if (!a || a->kind != K_VMM) {
            r = CUDA_ERROR_INVALID_VALUE;
            break;
        }
        p = a->base + a->size;
    }
    for (p = ptr; r == CUDA_SUCCESS && p < end;) {
        struct alloc *a = sim_alloc_find(p);
        mprotect((void *)(uintptr_t)a->base, a->size, prot);
        a->accessible = prot != PROT_NONE;
        p = a->base + a->size;
    }
    pthread_mutex_unlock(&sim_mu);
    return r;
}

/* ---- sharing: a POSIX file descriptor (the handle's memfd, duplicated) -- */

CUAPI cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type,
                                   unsigned long long flags)
{
    SIM_ENTER();
    if (!out || flags || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_mu);
    struct vmm_handle *h = vmm_of(handle);
    int fd = h && (h->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ? fcntl(h->fd, F_DUPFD_CLOEXEC, 0)
                                                                                : -1;
    pthread_mutex_unlock(&sim_mu);
    if (!h || !(h->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return CUDA_ERROR_INVALID_VALUE; /* not created exportable as a file descriptor */
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *(int *)out = fd;
    return CUDA_SUCCESS;
}

/* The device an exported memfd belongs to, from its name; -1 if it is not one. */
static int exported_dev(int fd)
{
    char link[64], target[128];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0)
        return -1;
    target[n] = 0;
    const char *name = strstr(target, MEMFD_NAME);
    return name ? atoi(name + strlen(MEMFD_NAME)) : -1;
}

/* This process's own export comes back as its handle with one more
 * reference (one more cuMemRelease before the memory goes). Another
 * process's becomes a handle of this process, charged here too while it
 * lives: the simulator keeps no cross-process references, so both holders
 * count it (never too little). */
CUAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle,
                                     CUmemAllocationHandleType type)
{
    SIM_ENTER();
    int fd = (int)(intptr_t)os_handle;
    struct stat st;
    int dev = exported_dev(fd);
    if (!handle || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || dev < 0 || dev >= sim_machine()->gpu_count ||
        fstat(fd, &st) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_mu);
    struct vmm_handle *h = live;
    for (struct stat mine; h; h = h->next)
        if (fstat(h->fd, &mine) == 0 && mine.st_dev == st.st_dev && mine.st_ino == st.st_ino)
            break;
    if (h)
        h->refs++;
    pthread_mutex_unlock(&sim_mu);
    if (h) {
        *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
        return CUDA_SUCCESS;
    }
    size_t size = (size_t)st.st_size;
    if (sim_mem_charge(dev, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0 || !(h = vmm_new(dev, own, size, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))) {
        if (own >= 0)
            close(own);
        sim_mem_uncharge(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}
