/* Linear memory and the memory queries: every allocation path (cuMemAlloc*,
 * pitch, stream-ordered and pool, arrays, external and IPC imports) reserves
 * in the slice's ledger before the driver sees it and gives it back when the
 * driver fails or the memory is freed; the queries show the slice.  Paths it
 * cannot account are refused, never escaped.  VMM is vmm.c, contexts context.c. */
#define _GNU_SOURCE
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "alloc.h"
#include "gpuslice_array_format.h"

#include "real.h"

/* ---- the table of what this process holds ------------------------------------ */

void gs_remember(uint64_t key, uint64_t bytes, struct gs_place at, enum gs_alloc_kind k)
{
    struct gs_entry e = {.key = key, .bytes = bytes, .owner = at.owner, .gpu = (uint32_t)at.gpu, .kind = k};
    if (gs_table_put(&e) != 0)
        gs_log(1, "allocation table full: %llu bytes stay charged until the process exits",
               (unsigned long long)bytes);
}

int gs_forget(uint64_t key, enum gs_alloc_kind k, struct gs_entry *e)
{
    e->kind = k;
    return gs_table_take(key, e);
}

void gs_give_back(const struct gs_entry *e)
{
    gs_uncharge((int)e->gpu, e->bytes);
}

static CUresult release(uint64_t key, enum gs_alloc_kind k, CUresult r)
{
    struct gs_entry e;
    if (r == CUDA_SUCCESS && gs_enforcing() > 0 && gs_forget(key, k, &e) == 0)
        gs_uncharge((int)e.gpu, e.bytes);
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
    struct gs_place at;
    if (r != CUDA_SUCCESS || gs_enforcing() <= 0 || gs_place_current(&at) != CUDA_SUCCESS)
        return r;
    size_t driver_free = *free_b;
    if (at.gpu < 0)
        *free_b = *total = 0;
    else
        slice_view(at.gpu, free_b, total);
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
    if (r == CUDA_SUCCESS && gs_enforcing() > 0) {
        int g = gs_slice_gpu_of_device(dev);
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
    GS_PLACE(at, gs_place_current(&at));
    GS_ALLOCATE(at, bytes, REAL(cuMemAlloc_v2)(dptr, bytes), *dptr, K_MEM);
}

WRAP_API CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytes)
{
    if (!dptr || bytes == 0)
        return REAL(cuMemAlloc)(dptr, bytes);
    GS_PLACE(at, gs_place_current(&at));
    GS_ALLOCATE(at, bytes, REAL(cuMemAlloc)(dptr, bytes), *dptr, K_MEM);
}

WRAP_API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags)
{
    if (!dptr || bytes == 0)
        return REAL(cuMemAllocManaged)(dptr, bytes, flags);
    GS_PLACE(at, gs_place_current(&at));
    GS_ALLOCATE(at, bytes, REAL(cuMemAllocManaged)(dptr, bytes, flags), *dptr, K_MEM);
}

CUresult cuMemFree_v2(CUdeviceptr dptr);

#define PITCH_ALIGN 512u

WRAP_API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                     unsigned int elem)
{
    int on = gs_enforcing();
    if (on < 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (on == 0 || !dptr || !pitch || width == 0 || height == 0)
        return REAL(cuMemAllocPitch_v2)(dptr, pitch, width, height, elem);
    GS_PLACE(at, gs_place_current(&at));
    int g = at.gpu;
    /* the driver chooses the pitch: reserve for the usual alignment, then settle */
    size_t guess_row = (width + PITCH_ALIGN - 1) / PITCH_ALIGN * PITCH_ALIGN;
    if (height > SIZE_MAX / guess_row)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t guess = (uint64_t)guess_row * height;
    if (gs_charge(g, guess) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = REAL(cuMemAllocPitch_v2)(dptr, pitch, width, height, elem);
    if (r != CUDA_SUCCESS) {
        gs_uncharge(g, guess);
        return r;
    }
    uint64_t actual = (uint64_t)*pitch * height;
    if (actual > guess && gs_charge(g, actual - guess) != 0) {
        gs_uncharge(g, guess);
        REAL(cuMemFree_v2)(*dptr);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (actual < guess)
        gs_uncharge(g, guess - actual);
    gs_remember(*dptr, actual, at, K_MEM);
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

WRAP_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s)
{
    if (!dptr || bytes == 0)
        return REAL(cuMemAllocAsync)(dptr, bytes, s);
    GS_PLACE(at, gs_place_stream(s, &at));
    GS_ALLOCATE(at, bytes, REAL(cuMemAllocAsync)(dptr, bytes, s), *dptr, K_MEM);
}

WRAP_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s)
{
    if (!dptr || bytes == 0)
        return REAL(cuMemAllocAsync_ptsz)(dptr, bytes, s);
    GS_PLACE(at, gs_place_stream(s, &at));
    GS_ALLOCATE(at, bytes, REAL(cuMemAllocAsync_ptsz)(dptr, bytes, s), *dptr, K_MEM);
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
    if (r == CUDA_SUCCESS && gs_enforcing() > 0 && props && props->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        gs_remember((uint64_t)(uintptr_t)*pool, 0, (struct gs_place){gs_slice_gpu_of_device(props->location.id), 0},
                    K_POOL);
    return r;
}

/* Destroying a pool frees what was still allocated from it. */
WRAP_API CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    struct gs_entry e;
    CUresult r = REAL(cuMemPoolDestroy)(pool);
    if (r == CUDA_SUCCESS && gs_enforcing() > 0) {
        gs_forget((uint64_t)(uintptr_t)pool, K_POOL, &e);
        gs_table_drop_owner((uint64_t)(uintptr_t)pool, gs_give_back);
    }
    return r;
}

/* A pool made here is its allocations' place (and their owner: its
 * destruction frees them); a device's own pool is the stream's context's. */
static CUresult place_pool(CUmemoryPool pool, CUstream s, struct gs_place *p)
{
    struct gs_entry e = {.kind = K_POOL};
    if (gs_table_get((uint64_t)(uintptr_t)pool, &e) == 0) {
        *p = (struct gs_place){(int)e.gpu, (uint64_t)(uintptr_t)pool};
        return CUDA_SUCCESS;
    }
    return gs_place_stream(s, p);
}

WRAP_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s)
{
    if (!dptr || bytes == 0)
        return REAL(cuMemAllocFromPoolAsync)(dptr, bytes, pool, s);
    GS_PLACE(at, place_pool(pool, s, &at));
    GS_ALLOCATE(at, bytes, REAL(cuMemAllocFromPoolAsync)(dptr, bytes, pool, s), *dptr, K_MEM);
}

WRAP_API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s)
{
    if (!dptr || bytes == 0)
        return REAL(cuMemAllocFromPoolAsync_ptsz)(dptr, bytes, pool, s);
    GS_PLACE(at, place_pool(pool, s, &at));
    GS_ALLOCATE(at, bytes, REAL(cuMemAllocFromPoolAsync_ptsz)(dptr, bytes, pool, s), *dptr, K_MEM);
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
    GS_PLACE(at, gs_place_current(&at));
    uint64_t bytes = array3d_bytes(d);
    GS_ALLOCATE(at, bytes, REAL(cuArray3DCreate_v2)(a, d), *a, K_ARRAY);
}

WRAP_API CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d)
{
    if (!a || !d)
        return REAL(cuArrayCreate_v2)(a, d);
    GS_PLACE(at, gs_place_current(&at));
    CUDA_ARRAY3D_DESCRIPTOR d3 = {.Width = d->Width, .Height = d->Height, .Format = d->Format,
                                  .NumChannels = d->NumChannels};
    uint64_t bytes = array3d_bytes(&d3);
    GS_ALLOCATE(at, bytes, REAL(cuArrayCreate_v2)(a, d), *a, K_ARRAY);
}

WRAP_API CUresult cuArrayDestroy(CUarray a)
{
    return release((uint64_t)(uintptr_t)a, K_ARRAY, REAL(cuArrayDestroy)(a));
}

WRAP_API CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    if (!m || !d || levels == 0 || levels > 32)
        return REAL(cuMipmappedArrayCreate)(m, d, levels);
    GS_PLACE(at, gs_place_current(&at));
    uint64_t bytes = 0;
    CUDA_ARRAY3D_DESCRIPTOR l = *d;
    for (unsigned i = 0; i < levels; i++) {
        bytes += array3d_bytes(&l);
        l.Width = l.Width > 1 ? l.Width / 2 : 1;
        l.Height = l.Height > 1 ? l.Height / 2 : l.Height;
        l.Depth = l.Depth > 1 ? l.Depth / 2 : l.Depth;
    }
    GS_ALLOCATE(at, bytes, REAL(cuMipmappedArrayCreate)(m, d, levels), *m, K_MIPMAP);
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
    GS_PLACE(at, gs_place_current(&at));
    GS_ALLOCATE(at, desc->size, REAL(cuImportExternalMemory)(ext, desc), *ext, K_EXT);
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
    if (r != CUDA_SUCCESS || gs_enforcing() <= 0)
        return r;
    struct gs_place at;
    CUdeviceptr base;
    size_t size;
    if (gs_place_current(&at) != CUDA_SUCCESS ||
        REAL(cuMemGetAddressRange_v2)(&base, &size, *dptr) != CUDA_SUCCESS || gs_charge(at.gpu, size) != 0) {
        close_fn(*dptr);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    gs_remember(*dptr, size, at, K_IPC);
    return CUDA_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);

WRAP_API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *dptr, CUipcMemHandle h, unsigned int flags)
{
    if (gs_enforcing() < 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    return ipc_opened(dptr, REAL(cuIpcOpenMemHandle_v2)(dptr, h, flags), REAL(cuIpcCloseMemHandle));
}

WRAP_API CUresult cuIpcOpenMemHandle(CUdeviceptr *dptr, CUipcMemHandle h, unsigned int flags)
{
    if (gs_enforcing() < 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    return ipc_opened(dptr, REAL(cuIpcOpenMemHandle)(dptr, h, flags), REAL(cuIpcCloseMemHandle));
}

WRAP_API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    return release(dptr, K_IPC, REAL(cuIpcCloseMemHandle)(dptr));
}

/* ---- paths gpuslice cannot account yet: refused, never escaped -------------- */

#define REFUSE(name, params, why)                                                        \
    WRAP_API CUresult name params                                                        \
    {                                                                                    \
        if (gs_enforcing() == 0)                                                            \
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
