/* The NVML wrapper: NVML's answers about memory, processes and utilization, as the slice
 * sees them; everything else forwards. */
#define _GNU_SOURCE
#include <string.h>
#include <time.h>

#include "gpuslice_nvml.h"
#include "wrap.h"

#include "real.h"

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

/* A driver older than nvml.h lacks nvmlDeviceGetTemperatureV, but the
 * interposer exports every name of the header, and clients take the V form
 * because the name exists (nvitop): answer it through the unversioned call
 * such a driver has, so the interposer is never worse than the driver. */
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, nvmlTemperatureSensors_t sensor, unsigned int *temp);
nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t d, nvmlTemperature_t *t);

WRAP_API nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t d, nvmlTemperature_t *t)
{
    if (gs_real_lookup("nvmlDeviceGetTemperatureV") || !gs_real_lookup("nvmlDeviceGetTemperature"))
        return REAL(nvmlDeviceGetTemperatureV)(d, t);
    if (!t)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (t->version != nvmlTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned int temp;
    nvmlReturn_t r = REAL(nvmlDeviceGetTemperature)(d, t->sensorType, &temp);
    if (r == NVML_SUCCESS)
        t->temperature = (int)temp;
    return r;
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

/* ---- utilization: the slice's own processes, not the GPU's other tenants ---- */

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *s, unsigned int *n,
                                             unsigned long long last_seen);

WRAP_API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *samples,
                                                      unsigned int *count, unsigned long long last_seen)
{
    if (slice_gpu(d) == -2)
        return REAL(nvmlDeviceGetProcessUtilization)(d, samples, count, last_seen);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    static __thread nvmlProcessUtilizationSample_t all[MAX_LISTED];
    unsigned n = MAX_LISTED;
    nvmlReturn_t r = REAL(nvmlDeviceGetProcessUtilization)(d, all, &n, last_seen);
    if (r != NVML_SUCCESS && r != NVML_ERROR_NOT_FOUND)
        return r;
    unsigned kept = 0;
    for (unsigned i = 0; r == NVML_SUCCESS && i < n; i++) {
        if (!our_pid(all[i].pid))
            continue;
        if (samples && kept < *count)
            samples[kept] = all[i];
        kept++;
    }
    unsigned room = *count;
    *count = kept;
    if (!kept)
        return NVML_ERROR_NOT_FOUND; /* as NVML says when no process of its own ran */
    return !samples || kept > room ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

/* In a slice, the GPU is as busy as the slice's own processes made it over
 * the last second (each process's samples averaged, the processes summed);
 * memory bandwidth is the driver's, which no process split exists for. */
WRAP_API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
    nvmlReturn_t r = REAL(nvmlDeviceGetUtilizationRates)(d, u);
    if (r != NVML_SUCCESS || slice_gpu(d) == -2)
        return r;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    unsigned long long since = (unsigned long long)now.tv_sec * 1000000ull + (unsigned long long)now.tv_nsec / 1000 -
                               1000000ull;
    static __thread nvmlProcessUtilizationSample_t all[MAX_LISTED];
    unsigned n = MAX_LISTED;
    unsigned busy = 0;
    if (REAL(nvmlDeviceGetProcessUtilization)(d, all, &n, since) == NVML_SUCCESS) {
        for (unsigned i = 0; i < n; i++) {
            if (!our_pid(all[i].pid))
                continue;
            unsigned sum = 0, samples = 0; /* this pid's samples in the window, once each */
            int first = 1;
            for (unsigned j = 0; j < n; j++)
                if (all[j].pid == all[i].pid) {
                    first &= j >= i;
                    sum += all[j].smUtil;
                    samples++;
                }
            if (first)
                busy += sum / samples;
        }
    }
    u->gpu = busy > 100 ? 100 : busy;
    return r;
}
