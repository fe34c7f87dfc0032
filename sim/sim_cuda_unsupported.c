/* Every function cuda.h declares that the simulator does not model, exported
 * anyway and answering CUDA_ERROR_NOT_SUPPORTED, as a driver does for a
 * feature it lacks: a program that probes for an entry point finds it, and a
 * program that calls one gets an error it handles, never "symbol not found".
 * Weak: a file that models a function defines it, and that definition wins
 * when the library is linked. Only cuda.h's types are seen here, not the
 * other files' prototypes: the stubs take no arguments and read none. */
#include <string.h>

#include "gpuslice_cuda.h"

#define FWD(name)                                                                    \
    __attribute__((weak, visibility("default"))) CUresult name(void);                \
    __attribute__((weak, visibility("default"))) CUresult name(void)                 \
    {                                                                                \
        return CUDA_ERROR_NOT_SUPPORTED;                                             \
    }
#include "cuda_exports.def"
#undef FWD

static const struct {
    const char *name;
    void *fn;
} exported[] = {
#define FWD(name) {#name, (void *)name},
#include "cuda_exports.def"
#undef FWD
};

/* For cuGetProcAddress, a name its table lacks: the export of that name, or
 * of its newest versioned variant (name_v2, _v3, ...). */
void *sim_unmodelled(const char *symbol)
{
    void *found = NULL;
    size_t n = strlen(symbol);
    for (size_t i = 0; i < sizeof exported / sizeof exported[0]; i++) {
        const char *e = exported[i].name;
        if (strcmp(e, symbol) == 0 && !found)
            found = exported[i].fn;
        else if (strncmp(e, symbol, n) == 0 && strncmp(e + n, "_v", 2) == 0 && e[n + 2] &&
                 strspn(e + n + 2, "0123456789") == strlen(e + n + 2))
            found = exported[i].fn; /* name_vN, not _ptsz/_ptds ones; the .def lists them oldest first */
    }
    return found;
}
