/* cuGetProcAddress: the real driver resolves first (versions and per-thread
 * flags stay its business); when it hands out the real twin of a function we
 * hook, the caller gets our hook for exactly that symbol, whose ABI is the
 * twin's by construction. */
#define _GNU_SOURCE
#include <stddef.h>

#include "gpuslice_cuda.h"
#include "wrap.h"

extern void *gs_real_cuGetProcAddress;
extern void *gs_real_cuGetProcAddress_v2;
void *gs_hook_for(void *real);

typedef CUresult (*get_proc_v2)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*get_proc_v1)(const char *, void **, int, cuuint64_t);

WRAP_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                      CUdriverProcAddressQueryResult *status)
{
    CUresult r = ((get_proc_v2)gs_real_cuGetProcAddress_v2)(symbol, pfn, version, flags, status);
    if (r == CUDA_SUCCESS && pfn && *pfn)
        *pfn = gs_hook_for(*pfn);
    return r;
}

WRAP_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    CUresult r = ((get_proc_v1)gs_real_cuGetProcAddress)(symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS && pfn && *pfn)
        *pfn = gs_hook_for(*pfn);
    return r;
}
