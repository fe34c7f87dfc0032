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
 * container sees it. Never 0: that is how a driver lists a process it cannot
 * name in the caller's pid namespace (another container's), and how a row
 * reads between the daemon's claim and its process's own word. */
static int our_pid(unsigned pid)
{
    if (!pid)
        return 0;
    for (int i = 0; i < GPUSLICE_SLICE_MAX_PROCS; i++) {
        const struct gpuslice_proc_usage *p = &gs.usage->proc[i];
        int32_t host = __atomic_load_n(&p->pid, __ATOMIC_ACQUIRE);
        if (host && ((unsigned)host == pid || (unsigned)__atomic_load_n(&p->ns_pid, __ATOMIC_ACQUIRE) == pid))
            return 1;
    }
    return 0;
}

/* Room for the GPU's whole list when the caller's array is too small for it:
 * on the stack, as no answer outlives its call. */
#define MAX_LISTED 512

/* One question to the driver for a list of per-process rows: the process
 * lists ignore `since`, the utilization samples take it. */
typedef nvmlReturn_t (*ask_fn)(nvmlDevice_t, unsigned *, void *, unsigned long long since);

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t, unsigned *, nvmlProcessInfo_v1_t *);
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *s, unsigned int *n,
                                             unsigned long long last_seen);

static nvmlReturn_t ask_v3(nvmlDevice_t d, unsigned *n, void *out, unsigned long long since)
{
    (void)since;
    return REAL(nvmlDeviceGetComputeRunningProcesses_v3)(d, n, out);
}

static nvmlReturn_t ask_v2(nvmlDevice_t d, unsigned *n, void *out, unsigned long long since)
{
    (void)since;
    return REAL(nvmlDeviceGetComputeRunningProcesses_v2)(d, n, out);
}

static nvmlReturn_t ask_v1(nvmlDevice_t d, unsigned *n, void *out, unsigned long long since)
{
    (void)since;
    return REAL(nvmlDeviceGetComputeRunningProcesses)(d, n, out);
}

static nvmlReturn_t ask_samples(nvmlDevice_t d, unsigned *n, void *out, unsigned long long since)
{
    return REAL(nvmlDeviceGetProcessUtilization)(d, out, n, since);
}

/* Keeps the rows of `all` (n of `stride` bytes, the pid first in each) that
 * are this slice's processes, into `out` (room for `room`; NULL for a count
 * only), which may be `all` itself; returns how many there are. Filtered in
 * place, the driver's rows past them are zeroed: no other tenant's row stays
 * in the caller's memory. */
static unsigned keep_ours(const unsigned char *all, unsigned n, size_t stride, unsigned char *out, unsigned room)
{
    unsigned kept = 0;
    for (unsigned i = 0; i < n; i++) {
        unsigned pid;
        memcpy(&pid, all + i * stride, sizeof pid);
        if (!our_pid(pid))
            continue;
        if (out && kept < room)
            memmove(out + kept * stride, all + i * stride, stride); /* in place: never ahead of the row read */
        kept++;
    }
    if (all == out && kept < n)
        memset(out + kept * stride, 0, (n - kept) * stride);
    return kept;
}

/* The driver's rows for a slice, with NVML's answers: the caller's array is
 * asked first and filtered in place when it holds the GPU's whole list, else
 * the room on the stack. A driver with more rows than that answers
 * INSUFFICIENT_SIZE with its own count: room enough for the slice's rows on
 * the caller's next try. NOT_FOUND (no samples) passes through as an answer. */
static nvmlReturn_t listed_for_slice(ask_fn ask, nvmlDevice_t d, unsigned *count, void *out, size_t stride,
                                     unsigned long long since, unsigned *kept)
{
    nvmlProcessUtilizationSample_t room[MAX_LISTED]; /* the widest row */
    unsigned char *all = out;
    unsigned n = *count;
    nvmlReturn_t r = out && n ? ask(d, &n, out, since) : NVML_ERROR_INSUFFICIENT_SIZE;
    if (r == NVML_ERROR_INSUFFICIENT_SIZE) {
        if (out)
            memset(out, 0, *count * stride); /* the driver may have filled it before saying so */
        all = (unsigned char *)room;
        n = (unsigned)(sizeof room / stride);
        r = ask(d, &n, room, since);
        if (r == NVML_ERROR_INSUFFICIENT_SIZE)
            *count = n;
    }
    *kept = 0;
    if (r != NVML_SUCCESS)
        return r;
    *kept = keep_ours(all, n, stride, out, *count);
    nvmlReturn_t result = *kept > *count || (*kept && !out) ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    *count = *kept;
    return result;
}

/* Outside a slice the driver answers as it is; in one, only the slice's processes. */
static nvmlReturn_t filter(ask_fn ask, nvmlDevice_t d, unsigned *count, void *out, size_t stride)
{
    if (gs.mode != GS_SLICE)
        return ask(d, count, out, 0);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned kept;
    return listed_for_slice(ask, d, count, out, stride, 0, &kept);
}

WRAP_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned *c, nvmlProcessInfo_t *p)
{
    return filter(ask_v3, d, c, p, sizeof *p);
}

WRAP_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned *c, nvmlProcessInfo_t *p)
{
    return filter(ask_v2, d, c, p, sizeof *p);
}

WRAP_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned *c, nvmlProcessInfo_v1_t *p)
{
    return filter(ask_v1, d, c, p, sizeof *p);
}

/* ---- utilization: the slice's own processes, not the GPU's other tenants ---- */

WRAP_API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *samples,
                                                      unsigned int *count, unsigned long long last_seen)
{
    if (slice_gpu(d) == -2)
        return REAL(nvmlDeviceGetProcessUtilization)(d, samples, count, last_seen);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned kept;
    nvmlReturn_t r = listed_for_slice(ask_samples, d, count, samples, sizeof *samples, last_seen, &kept);
    if (r == NVML_ERROR_NOT_FOUND || (r == NVML_SUCCESS && !kept)) {
        *count = 0;
        return NVML_ERROR_NOT_FOUND; /* as NVML says when no process of its own ran */
    }
    return r;
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
    nvmlProcessUtilizationSample_t ours[MAX_LISTED];
    unsigned n = MAX_LISTED, kept;
    unsigned busy = 0;
    if (listed_for_slice(ask_samples, d, &n, ours, sizeof *ours, since, &kept) == NVML_SUCCESS) {
        for (unsigned i = 0; i < n; i++) {
            unsigned sum = 0, samples = 0; /* this pid's samples in the window, once each */
            int first = 1;
            for (unsigned j = 0; j < n; j++)
                if (ours[j].pid == ours[i].pid) {
                    first &= j >= i;
                    sum += ours[j].smUtil;
                    samples++;
                }
            if (first)
                busy += sum / samples;
        }
    }
    u->gpu = busy > 100 ? 100 : busy;
    return r;
}
