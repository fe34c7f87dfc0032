/* The NVML wrapper: NVML's answers about memory and processes, as the slice
 * sees them; everything else forwards. */
#define _GNU_SOURCE
#include <string.h>

#include "gpuslice_nvml.h"
#include "wrap.h"

#define FWD(name) extern void *gs_real_##name;
#include "../symbols/nvml_exports.def"
#undef FWD
#define REAL(name) ((__typeof__(&name))gs_real_##name)

static nvmlReturn_t attach(void)
{
    if (!gs_real_loaded()) {
        gs_log(1, "cannot load the real NVML %s (set GPUSLICE_REAL_LIBNVML)", gs_real_path());
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    }
    return gs_attach() == 0 ? NVML_SUCCESS : NVML_ERROR_NO_PERMISSION;
}

WRAP_API nvmlReturn_t nvmlInit_v2(void)
{
    nvmlReturn_t r = attach();
    return r ? r : REAL(nvmlInit_v2)();
}

WRAP_API nvmlReturn_t nvmlInit(void)
{
    nvmlReturn_t r = attach();
    return r ? r : REAL(nvmlInit)();
}

WRAP_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    nvmlReturn_t r = attach();
    return r ? r : REAL(nvmlInitWithFlags)(flags);
}

/* nvmlErrorString returns a string, so its "not found" stub cannot stand in */
typedef const char *(*error_string_fn)(nvmlReturn_t);
WRAP_API const char *nvmlErrorString(nvmlReturn_t r)
{
    error_string_fn real = (error_string_fn)gs_real_lookup("nvmlErrorString");
    return real ? real(r) : "Unknown Error";
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len);

static int slice_gpu(nvmlDevice_t d)
{
    char uuid[96];
    if (gs.mode != GS_SLICE || REAL(nvmlDeviceGetUUID)(d, uuid, sizeof uuid) != NVML_SUCCESS)
        return -2; /* not ours to change */
    return gs_gpu_of_uuid_text(uuid);
}

static void view(int g, unsigned long long *total, unsigned long long *used, unsigned long long *free_b)
{
    if (g < 0) {
        *total = *used = *free_b = 0;
        return;
    }
    uint64_t limit = __atomic_load_n(&gs.limits->gpu[g].memory_limit, __ATOMIC_ACQUIRE);
    uint64_t u = __atomic_load_n(&gs.usage->used[g], __ATOMIC_ACQUIRE);
    /* the driver reports the container's cgroup when it enforces the slice
     * itself: then it also counts what bypassed the interposer */
    if (*total <= limit && *used > u)
        u = *used;
    *total = limit;
    *used = u > limit ? limit : u;
    *free_b = limit - *used;
}

WRAP_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
    nvmlReturn_t r = REAL(nvmlDeviceGetMemoryInfo)(d, m);
    int g = r == NVML_SUCCESS ? slice_gpu(d) : -2;
    if (g != -2)
        view(g, &m->total, &m->used, &m->free);
    return r;
}

WRAP_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
    nvmlReturn_t r = REAL(nvmlDeviceGetMemoryInfo_v2)(d, m);
    int g = r == NVML_SUCCESS ? slice_gpu(d) : -2;
    if (g != -2) {
        view(g, &m->total, &m->used, &m->free);
        m->reserved = 0;
    }
    return r;
}

/* A pid is ours when a row of the slice holds it, as the host or as the
 * container sees it. */
static int our_pid(unsigned pid)
{
    for (int i = 0; i < GPUSLICE_SLICE_MAX_PROCS; i++) {
        const struct gpuslice_proc_usage *p = &gs.usage->proc[i];
        int32_t host = __atomic_load_n(&p->pid, __ATOMIC_ACQUIRE);
        if (host && ((unsigned)host == pid || (unsigned)__atomic_load_n(&p->ns_pid, __ATOMIC_ACQUIRE) == pid))
            return 1;
    }
    return 0;
}

#define MAX_LISTED 512

/* Ask the driver with room for everyone, keep this slice's processes. */
static nvmlReturn_t filter(nvmlReturn_t (*fn)(nvmlDevice_t, unsigned *, void *), nvmlDevice_t d, unsigned *count,
                           void *out, size_t stride)
{
    if (gs.mode != GS_SLICE)
        return fn(d, count, out);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    static __thread unsigned char all[MAX_LISTED * sizeof(nvmlProcessInfo_t)];
    unsigned n = MAX_LISTED;
    nvmlReturn_t r = fn(d, &n, all);
    if (r != NVML_SUCCESS)
        return r;
    unsigned kept = 0;
    for (unsigned i = 0; i < n; i++) {
        unsigned pid;
        memcpy(&pid, all + i * stride, sizeof pid); /* pid leads every version of the struct */
        if (!our_pid(pid))
            continue;
        if (out && kept < *count)
            memcpy((char *)out + kept * stride, all + i * stride, stride);
        kept++;
    }
    nvmlReturn_t result = kept > *count || (kept && !out) ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    *count = kept;
    return result;
}

typedef nvmlReturn_t (*list_fn)(nvmlDevice_t, unsigned *, void *);

WRAP_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned *c, nvmlProcessInfo_t *p)
{
    return filter((list_fn)gs_real_nvmlDeviceGetComputeRunningProcesses_v3, d, c, p, sizeof *p);
}

WRAP_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned *c, nvmlProcessInfo_t *p)
{
    return filter((list_fn)gs_real_nvmlDeviceGetComputeRunningProcesses_v2, d, c, p, sizeof *p);
}

WRAP_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned *c, nvmlProcessInfo_v1_t *p)
{
    return filter((list_fn)gs_real_nvmlDeviceGetComputeRunningProcesses, d, c, p, sizeof *p);
}
