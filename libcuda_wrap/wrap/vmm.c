/* Virtual memory management: physical memory is charged at cuMemCreate and
 * given back only when the driver frees it: no reference to the handle is
 * left (the creation's, and one per cuMemRetainAllocationHandle, each ended
 * by a cuMemRelease) and no mapping of it is left (cuMemMap, cuMemUnmap).  A
 * release does not say which reference it ends, so only their number counts
 * (the handle's table entry, struct gs_vmm_refs). */
#define _GNU_SOURCE
#include <stdint.h>

#include "alloc.h"
#include "real.h"

WRAP_API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                              unsigned long long flags)
{
    if (!h || !prop || size == 0)
        return REAL(cuMemCreate)(h, size, prop, flags);
    struct gs_place at = {-1, 0}; /* VMM handles belong to the process, not to a context */
    if (gs_enforcing() > 0 && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        at.gpu = gs_slice_gpu_of_device(prop->location.id);
    GS_ALLOCATE(at, size, REAL(cuMemCreate)(h, size, prop, flags), *h, K_VMM_HANDLE);
}

/* One more (+1) or one fewer (-1); -1 when the count cannot hold it (full, or
 * already 0). */
static int count_add(uint16_t *count, int delta)
{
    if ((delta > 0 && *count == UINT16_MAX) || (delta < 0 && *count == 0))
        return -1;
    *count = (uint16_t)(*count + delta);
    return 0;
}

/* One reference more (+1) or less (-1), one mapping more or less; the charge
 * goes back when neither is left. -1: not a handle this process created. */
static int vmm_adjust(uint64_t handle, int ref_delta, int map_delta)
{
    struct gs_entry e;
    if (gs_forget(handle, K_VMM_HANDLE, &e) != 0)
        return -1;
    struct gs_vmm_refs *v = &e.as.vmm;
    if (map_delta && count_add(&v->maps, map_delta) != 0)
        v->pinned = 1;
    if (ref_delta > 0 && count_add(&v->retains, +1) != 0)
        v->pinned = 1;
    if (ref_delta < 0 && count_add(&v->retains, -1) != 0)
        v->released = 1; /* no retained reference left: this ends the creation's */
    int refs = !v->released + v->retains;
    if (refs == 0 && v->maps == 0) { /* the driver frees it, and may hand its value out again */
        if (!v->pinned)
            gs_uncharge((int)e.gpu, e.bytes);
        return 0; /* pinned: the charge stays until the process ends */
    }
    e.key = handle;
    gs_table_put(&e);
    return 0;
}

WRAP_API CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    CUresult r = REAL(cuMemRelease)(h);
    if (r == CUDA_SUCCESS && gs_enforcing() > 0)
        vmm_adjust(h, -1, 0);
    return r;
}

WRAP_API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr)
{
    CUresult r = REAL(cuMemRetainAllocationHandle)(h, addr);
    if (r == CUDA_SUCCESS && h && gs_enforcing() > 0)
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
    if (r == CUDA_SUCCESS && gs_enforcing() > 0 && gs_forget(h, K_VMM_HANDLE, &e) == 0) {
        e.key = h;
        e.as.vmm.pinned = 1;
        gs_table_put(&e);
    }
    return r;
}

/* This process's own export imported back is one more reference to a handle
 * it counts. Memory another process exported is refused in a slice: holding
 * its handle keeps it alive, and its size is not known until it is mapped. */
WRAP_API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle,
                                                 CUmemAllocationHandleType type)
{
    if (gs_enforcing() < 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = REAL(cuMemImportFromShareableHandle)(h, os_handle, type);
    if (r != CUDA_SUCCESS || !h || gs_enforcing() == 0 || vmm_adjust(*h, +1, 0) == 0)
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
    if (r == CUDA_SUCCESS && gs_enforcing() > 0 && vmm_adjust(h, 0, +1) == 0) {
        struct gs_entry m = {.key = ptr, .kind = K_VMM_MAP, .as.handle = h}; /* the mapping remembers its handle */
        gs_table_put(&m);
    }
    return r;
}

WRAP_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CUresult r = REAL(cuMemUnmap)(ptr, size);
    struct gs_entry e;
    if (r == CUDA_SUCCESS && gs_enforcing() > 0 && gs_forget(ptr, K_VMM_MAP, &e) == 0)
        vmm_adjust(e.as.handle, 0, -1);
    return r;
}
