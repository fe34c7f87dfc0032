/* The real library: loaded by path at load time, every exported name
 * resolved once into the pointer its trampoline jumps through.  A name the
 * real library lacks keeps a stub that answers "not found" (500 for CUDA,
 * 13 for NVML) whatever its arguments: the caller cleans up its own stack. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>

#include "wrap.h"

#ifndef GS_REAL_DEFAULT
#error "GS_REAL_DEFAULT (the real library's path) must be set at build time"
#endif

static int not_found(void)
{
    return GS_NOT_FOUND;
}

#define FWD(name) __attribute__((visibility("hidden"))) void *gs_real_##name = (void *)not_found;
#include EXPORTS
#undef FWD

static const struct {
    const char *name;
    void **slot;
} names[] = {
#define FWD(name) {#name, &gs_real_##name},
#include EXPORTS
#undef FWD
};

static void *handle;
static const char *path;

const char *gs_real_path(void)
{
    return path;
}

int gs_real_loaded(void)
{
    return handle != NULL;
}

void *gs_real_lookup(const char *name)
{
    return handle ? dlsym(handle, name) : NULL;
}

__attribute__((constructor)) void gs_load_real(void)
{
    if (handle)
        return;
    const char *env = getenv(GS_REAL_ENV);
    path = env && *env ? env : GS_REAL_DEFAULT;
    /* RTLD_LOCAL: the real library's names must never interpose on ours */
    handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle)
        return; /* reported on first use, where the user sees it */
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *p = dlsym(handle, names[i].name);
        if (p)
            *names[i].slot = p;
    }
}
