/* The allocation paths' shared pieces (memory.c, vmm.c, context.c): where an
 * allocation goes, the slice's ledger, and what this process holds.  Every
 * path reserves in the ledger before the driver sees it, gives it back when
 * the driver fails or the memory is freed.  No lock, syscall or scan here: an
 * atomic compare-and-swap on the ledger and the lock-free table (table.c). */
#ifndef GPUSLICE_WRAP_ALLOC_H
#define GPUSLICE_WRAP_ALLOC_H

#include "gpuslice_cuda.h"
#include "wrap.h"

enum gs_alloc_kind { K_MEM = 1, K_ARRAY, K_MIPMAP, K_VMM_HANDLE, K_VMM_MAP, K_IPC, K_EXT, K_POOL, K_CTX };

/* Where an allocation goes: its slice GPU (-1: not in the slice) and whose end
 * frees it (a context or a pool; 0: the process's).  Found once per call and
 * passed along, never kept between calls. */
struct gs_place {
    int gpu;
    uint64_t owner;
};

/* Is the slice in force?  1: account; 0: pass through (unsliced); <0: no GPU. */
static inline int gs_enforcing(void)
{
    int mode = __atomic_load_n(&gs.mode, __ATOMIC_ACQUIRE);
    return mode == GS_SLICE ? 1 : mode == GS_UNSLICED ? 0 : -1;
}

static inline int gs_charge(int g, uint64_t bytes)
{
    if (g < 0) /* a GPU outside the slice has no memory for us */
        return -1;
    return gpuslice_usage_charge(gs.usage, gs.limits, gs.slot, (uint32_t)g, bytes);
}

static inline void gs_uncharge(int g, uint64_t bytes)
{
    if (g >= 0)
        gpuslice_usage_uncharge(gs.usage, gs.slot, (uint32_t)g, bytes);
}

/* context.c: devices and contexts to slice GPUs */
int gs_slice_gpu_of_device(CUdevice dev);
CUresult gs_place_current(struct gs_place *p);             /* the current context's */
CUresult gs_place_stream(CUstream s, struct gs_place *p);  /* the stream's context's */

/* memory.c: the table of what this process holds */
void gs_remember(uint64_t key, uint64_t bytes, struct gs_place at, enum gs_alloc_kind k);
int gs_forget(uint64_t key, enum gs_alloc_kind k, struct gs_entry *e);
void gs_give_back(const struct gs_entry *e); /* for gs_table_drop_owner */

/* Reserve, call, record or undo: the shape of every allocation path. */
#define GS_ALLOCATE(at, bytes, call, key_expr, kind)                       \
    do {                                                                   \
        int on_ = gs_enforcing();                                          \
        if (on_ < 0)                                                       \
            return CUDA_ERROR_NOT_INITIALIZED;                             \
        if (on_ == 0)                                                      \
            return (call);                                                 \
        if (gs_charge((at).gpu, (bytes)) != 0)                             \
            return CUDA_ERROR_OUT_OF_MEMORY;                               \
        CUresult r_ = (call);                                              \
        if (r_ != CUDA_SUCCESS)                                            \
            gs_uncharge((at).gpu, (bytes));                                \
        else                                                               \
            gs_remember((uint64_t)(key_expr), (bytes), (at), (kind));      \
        return r_;                                                         \
    } while (0)

/* `at` found by `find` (a gs_place_* call) when the slice is in force; the
 * driver's error when it fails (no current context, a bad stream). */
#define GS_PLACE(at, find)                                                 \
    struct gs_place at = {-1, 0};                                          \
    if (gs_enforcing() > 0) {                                              \
        CUresult rg_ = (find);                                             \
        if (rg_ != CUDA_SUCCESS)                                           \
            return rg_;                                                    \
    }

#endif
