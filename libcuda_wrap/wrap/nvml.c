/* The NVML wrapper: init, and NVML's answers about memory as the slice sees
 * them (processes and utilization: nvml_processes.c); everything else forwards. */
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

/* The slice's index of the GPU, -1 for a GPU not the slice's, -2 where the
 * driver's answer stands (no slice, or the GPU unknown). */
int gs_nvml_slice_gpu(nvmlDevice_t d)
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
    int g = r == NVML_SUCCESS ? gs_nvml_slice_gpu(d) : -2;
    if (g != -2)
        view(g, &m->total, &m->used, &m->free);
    return r;
}

WRAP_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
    nvmlReturn_t r = REAL(nvmlDeviceGetMemoryInfo_v2)(d, m);
    int g = r == NVML_SUCCESS ? gs_nvml_slice_gpu(d) : -2;
    if (g != -2) {
        view(g, &m->total, &m->used, &m->free);
        m->reserved = 0;
    }
    return r;
}
