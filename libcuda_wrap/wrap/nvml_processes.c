/* The NVML wrapper's lists of processes, as the slice sees them: every way a
 * driver lists processes (compute, graphics and MPS lists, the detail list,
 * both forms of per-process utilization samples, accounting) keeps only the slice's, and
 * the GPU's utilization is what the slice's own processes made it. */
#define _GNU_SOURCE
#include <stddef.h>
#include <string.h>
#include <time.h>

#include "gpuslice_nvml.h"
#include "wrap.h"

#include "real.h"

int gs_nvml_slice_gpu(nvmlDevice_t d); /* nvml.c */

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
 * MAX_LISTED rows of the widest kind, on the stack, as no answer outlives its call. */
#define MAX_LISTED 512
#define WIDEST_ROW sizeof(nvmlProcessUtilizationInfo_v1_t)

/* The kind of row a list holds: its size, and where its pid is. */
struct rows {
    size_t stride;
    size_t pid_at;
};

/* One question to the driver for `*n` rows into `out`; `how` is what else
 * the call takes (the caller's struct, a timestamp), NULL for the plain lists. */
typedef nvmlReturn_t (*ask_fn)(nvmlDevice_t, unsigned *n, void *out, const void *how);

/* Keeps the rows of `all` (n of them) that are this slice's processes, into
 * `out` (room for `room`; NULL for a count only), which may be `all` itself;
 * returns how many there are. Filtered in place, the driver's rows past them
 * are zeroed: no other tenant's row stays in the caller's memory. */
static unsigned keep_ours(const unsigned char *all, unsigned n, struct rows k, unsigned char *out, unsigned room)
{
    unsigned kept = 0;
    for (unsigned i = 0; i < n; i++) {
        unsigned pid;
        memcpy(&pid, all + i * k.stride + k.pid_at, sizeof pid);
        if (!our_pid(pid))
            continue;
        if (out && kept < room)
            memmove(out + kept * k.stride, all + i * k.stride, k.stride); /* in place: never ahead of the row read */
        kept++;
    }
    if (all == out && kept < n)
        memset(out + kept * k.stride, 0, (n - kept) * k.stride);
    return kept;
}

/* The driver's rows for a slice, with NVML's answers: the caller's array is
 * asked first and filtered in place when it holds the GPU's whole list, else
 * the room on the stack. A driver with more rows than that answers
 * INSUFFICIENT_SIZE with its own count: room enough for the slice's rows on
 * the caller's next try. NOT_FOUND (no samples) passes through as an answer. */
static nvmlReturn_t listed_for_slice(ask_fn ask, const void *how, nvmlDevice_t d, unsigned *count, void *out,
                                     struct rows k, unsigned *kept)
{
    unsigned long long room[MAX_LISTED * WIDEST_ROW / sizeof(unsigned long long)];
    unsigned char *all = out;
    unsigned n = *count;
    nvmlReturn_t r = out && n ? ask(d, &n, out, how) : NVML_ERROR_INSUFFICIENT_SIZE;
    if (r == NVML_ERROR_INSUFFICIENT_SIZE) {
        if (out)
            memset(out, 0, *count * k.stride); /* the driver may have filled it before saying so */
        all = (unsigned char *)room;
        n = (unsigned)(sizeof room / k.stride);
        r = ask(d, &n, room, how);
        if (r == NVML_ERROR_INSUFFICIENT_SIZE)
            *count = n;
    }
    *kept = 0;
    if (r != NVML_SUCCESS)
        return r;
    *kept = keep_ours(all, n, k, out, *count);
    nvmlReturn_t result = *kept > *count || (*kept && !out) ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    *count = *kept;
    return result;
}

/* ---- the process lists: the slice's processes only ---- */

/* nvmlProcessInfo_t, v1 and v2+, with the pid first */
#define INFO_ROWS(type) ((struct rows){sizeof(type), 0})

#define PROCESS_LIST(name, type)                                                             \
    nvmlReturn_t name(nvmlDevice_t, unsigned *, type *);                                     \
    static nvmlReturn_t ask_##name(nvmlDevice_t d, unsigned *n, void *out, const void *how) \
    {                                                                                        \
        (void)how;                                                                           \
        return REAL(name)(d, n, out);                                                        \
    }                                                                                        \
    WRAP_API nvmlReturn_t name(nvmlDevice_t d, unsigned *count, type *infos)                \
    {                                                                                        \
        if (gs.mode != GS_SLICE)                                                             \
            return REAL(name)(d, count, infos);                                              \
        if (!count)                                                                          \
            return NVML_ERROR_INVALID_ARGUMENT;                                              \
        unsigned kept;                                                                       \
        return listed_for_slice(ask_##name, NULL, d, count, infos, INFO_ROWS(type), &kept); \
    }

PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t)
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_t)
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t)
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t)
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_t)
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t)
PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_t)
PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlProcessInfo_t)
PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses, nvmlProcessInfo_v1_t)

/* accounting's records: of the processes the slice holds now (its ended ones'
 * rows are released, so they leave its view) */
PROCESS_LIST(nvmlDeviceGetAccountingPids, unsigned int)

nvmlReturn_t nvmlDeviceGetAccountingStats(nvmlDevice_t d, unsigned int pid, nvmlAccountingStats_t *stats);

WRAP_API nvmlReturn_t nvmlDeviceGetAccountingStats(nvmlDevice_t d, unsigned int pid, nvmlAccountingStats_t *stats)
{
    nvmlReturn_t r = REAL(nvmlDeviceGetAccountingStats)(d, pid, stats);
    if (r != NVML_SUCCESS || gs.mode != GS_SLICE || our_pid(pid))
        return r;
    memset(stats, 0, sizeof *stats);
    return NVML_ERROR_NOT_FOUND; /* another tenant's: as for a pid without a record */
}

nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t d, nvmlProcessDetailList_t *plist);

static nvmlReturn_t ask_details(nvmlDevice_t d, unsigned *n, void *out, const void *how)
{
    nvmlProcessDetailList_t q = *(const nvmlProcessDetailList_t *)how; /* the caller's version and mode */
    q.numProcArrayEntries = *n;
    q.procArray = out;
    nvmlReturn_t r = REAL(nvmlDeviceGetRunningProcessDetailList)(d, &q);
    *n = q.numProcArrayEntries;
    return r;
}

/* A struct version this interposer does not know is refused in a slice (its
 * rows could not be filtered), as the driver refuses one it does not know. */
WRAP_API nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t d, nvmlProcessDetailList_t *plist)
{
    if (gs.mode != GS_SLICE || !plist)
        return REAL(nvmlDeviceGetRunningProcessDetailList)(d, plist);
    if (plist->version != nvmlProcessDetailList_v1)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned count = plist->numProcArrayEntries, kept;
    nvmlReturn_t r = listed_for_slice(ask_details, plist, d, &count, plist->procArray,
                                      INFO_ROWS(nvmlProcessDetail_v1_t), &kept);
    plist->numProcArrayEntries = count;
    return r;
}

/* ---- utilization: the slice's own processes, not the GPU's other tenants ---- */

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *s, unsigned int *n,
                                             unsigned long long last_seen);
nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t d, nvmlProcessesUtilizationInfo_t *info);

static nvmlReturn_t ask_samples(nvmlDevice_t d, unsigned *n, void *out, const void *how)
{
    return REAL(nvmlDeviceGetProcessUtilization)(d, out, n, *(const unsigned long long *)how);
}

static nvmlReturn_t ask_util_info(nvmlDevice_t d, unsigned *n, void *out, const void *how)
{
    nvmlProcessesUtilizationInfo_t q = *(const nvmlProcessesUtilizationInfo_t *)how; /* version, last seen */
    q.processSamplesCount = *n;
    q.procUtilArray = out;
    nvmlReturn_t r = REAL(nvmlDeviceGetProcessesUtilizationInfo)(d, &q);
    *n = q.processSamplesCount;
    return r;
}

/* NOT_FOUND when none of the slice's processes has a sample, as NVML says when none ran. */
static nvmlReturn_t samples_for_slice(nvmlReturn_t r, unsigned kept, unsigned *count)
{
    if (r == NVML_ERROR_NOT_FOUND || (r == NVML_SUCCESS && !kept)) {
        *count = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    return r;
}

WRAP_API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *samples,
                                                      unsigned int *count, unsigned long long last_seen)
{
    if (gs_nvml_slice_gpu(d) == -2)
        return REAL(nvmlDeviceGetProcessUtilization)(d, samples, count, last_seen);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned kept;
    nvmlReturn_t r = listed_for_slice(ask_samples, &last_seen, d, count, samples,
                                      (struct rows){sizeof *samples, offsetof(nvmlProcessUtilizationSample_t, pid)},
                                      &kept);
    return samples_for_slice(r, kept, count);
}

WRAP_API nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t d, nvmlProcessesUtilizationInfo_t *info)
{
    if (!info || gs_nvml_slice_gpu(d) == -2)
        return REAL(nvmlDeviceGetProcessesUtilizationInfo)(d, info);
    if (info->version != nvmlProcessesUtilizationInfo_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned count = info->processSamplesCount, kept;
    nvmlReturn_t r = listed_for_slice(
        ask_util_info, info, d, &count, info->procUtilArray,
        (struct rows){sizeof *info->procUtilArray, offsetof(nvmlProcessUtilizationInfo_v1_t, pid)}, &kept);
    r = samples_for_slice(r, kept, &count);
    info->processSamplesCount = count;
    return r;
}

/* In a slice, the GPU is as busy as the slice's own processes made it over
 * the last second (each process's samples averaged, the processes summed);
 * memory bandwidth is the driver's, which no process split exists for. */
WRAP_API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
    nvmlReturn_t r = REAL(nvmlDeviceGetUtilizationRates)(d, u);
    if (r != NVML_SUCCESS || gs_nvml_slice_gpu(d) == -2)
        return r;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    unsigned long long since = (unsigned long long)now.tv_sec * 1000000ull + (unsigned long long)now.tv_nsec / 1000 -
                               1000000ull;
    nvmlProcessUtilizationSample_t ours[MAX_LISTED];
    unsigned n = MAX_LISTED, kept;
    unsigned busy = 0;
    if (listed_for_slice(ask_samples, &since, d, &n, ours,
                         (struct rows){sizeof *ours, offsetof(nvmlProcessUtilizationSample_t, pid)},
                         &kept) == NVML_SUCCESS) {
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
