/* The simulator's allocation table, shared by its memory files (memory,
 * copy, vmm, pool, array): every device, managed, host, pool and VMM range
 * a process holds, sorted by base and guarded by sim_mu. */
#ifndef GPUSLICE_SIM_MEMORY_H
#define GPUSLICE_SIM_MEMORY_H

#include "sim_cuda.h"

#define GRANULARITY (2ull << 20)

enum alloc_kind { K_DEVICE, K_MANAGED, K_HOST, K_REGISTERED, K_POOL, K_VMM };

struct vmm_handle {
    uint32_t magic;
    int dev;
    int fd;
    size_t size;
    int refs; /* the creation's (or import's), one per retain or import; each cuMemRelease ends one */
    int mappings;
    unsigned handle_types; /* requested at creation: what it may be exported as */
    struct vmm_handle *next; /* the process's live handles, for imports of its own exports */
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

extern struct alloc *sim_allocs;
extern size_t sim_n_allocs;

size_t sim_alloc_index(uint64_t addr);          /* the first allocation with base > addr */
struct alloc *sim_alloc_find(uint64_t addr);     /* the allocation holding addr, or NULL */
int sim_alloc_insert(const struct alloc *a);     /* 0 if out of memory */
void sim_alloc_drop(struct alloc *a);            /* out of the table, its memory and charge given back */
void *sim_map_lazy(size_t size, int low32);      /* address space that costs nothing until written */
void sim_vmm_maybe_free(struct vmm_handle *h);   /* frees a handle no reference or mapping holds */
CUresult sim_device_alloc(CUdeviceptr *dptr, size_t size, enum alloc_kind kind, int dev, struct sim_pool *pool,
                          int low32);
CUresult sim_free_kind(CUdeviceptr dptr, int want_pool_ok);
struct sim_pool *sim_device_pool(int dev);       /* the device's current pool */

#endif
