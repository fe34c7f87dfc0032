/* cuGetProcAddress: the driver API table as data (symbols/sim_driver_api.def).
 * For a name, the newest variant whose version is <= the caller's wins; the
 * PTDS flag picks the per-thread-default-stream variant where one exists. */
#define _GNU_SOURCE
#include <string.h>

#include "sim_cuda.h"

enum { DEFAULT = 0, PTDS = 1 };

void *sim_unmodelled(const char *symbol); /* sim_cuda_unsupported.c */

/* Only addresses are taken here; the definitions live in the other files. */
#define SYM(name, ver, kind, sym) void sym(void);
#include "sim_driver_api.def"
#undef SYM

static const struct entry {
    const char *name;
    int version;
    int kind;
    void (*fn)(void);
} table[] = {
#define SYM(name, ver, kind, sym) {#name, ver, kind, sym},
#include "sim_driver_api.def"
#undef SYM
};

CUresult sim_proc_lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status)
{
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (!symbol || !pfn || (flags & ~(cuuint64_t)3)) {
        if (pfn)
            *pfn = NULL;
        return CUDA_ERROR_INVALID_VALUE;
    }
    int want_ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct entry *best = NULL;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        const struct entry *e = &table[i];
        if (strcmp(e->name, symbol) != 0)
            continue;
        if (e->version > version) {
            st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
            continue;
        }
        if (e->kind == PTDS && !want_ptds)
            continue;
        /* newer wins; at one version the PTDS variant wins when asked for */
        if (!best || e->version > best->version || (e->version == best->version && e->kind == PTDS))
            best = e;
    }
    void *fn = best ? (void *)best->fn : NULL;
    if (!fn && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)
        fn = sim_unmodelled(symbol); /* a cuda.h function not modelled: it answers NOT_SUPPORTED */
    if (fn)
        st = CU_GET_PROC_ADDRESS_SUCCESS;
    *pfn = fn;
    if (status)
        *status = st;
    return fn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

