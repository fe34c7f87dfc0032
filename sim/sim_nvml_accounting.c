/* Simulated NVML, per-process accounting (nvml.h's nvmlAccountingStats group):
 * the mode, set by root only; the pids of the processes with a record, running
 * or ended; each one's stats. Answers NOT_SUPPORTED while the mode is off, as
 * a driver does. The records are sim_accounting.c's. */
#include <string.h>
#include <unistd.h>

#include "gpuslice_nvml.h"
#include "sim_nvml.h"
#include "sim_state.h"

#define NVAPI SIM_API nvmlReturn_t

NVAPI nvmlDeviceGetAccountingMode(nvmlDevice_t d, nvmlEnableState_t *mode)
{
    SIM_NVML_DEVICE(d, idx);
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mode = __atomic_load_n(&sim_shm->gpu[idx].accounting, __ATOMIC_ACQUIRE) ? NVML_FEATURE_ENABLED
                                                                            : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

NVAPI nvmlDeviceSetAccountingMode(nvmlDevice_t d, nvmlEnableState_t mode)
{
    SIM_NVML_DEVICE(d, idx);
    if (mode != NVML_FEATURE_ENABLED && mode != NVML_FEATURE_DISABLED)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (geteuid() != 0)
        return NVML_ERROR_NO_PERMISSION;
    sim_gpu_lock(idx);
    __atomic_store_n(&sim_shm->gpu[idx].accounting, mode == NVML_FEATURE_ENABLED, __ATOMIC_RELEASE);
    sim_gpu_unlock(idx);
    return NVML_SUCCESS;
}

static int accounting(int idx)
{
    return __atomic_load_n(&sim_shm->gpu[idx].accounting, __ATOMIC_ACQUIRE);
}

NVAPI nvmlDeviceGetAccountingBufferSize(nvmlDevice_t d, unsigned int *size)
{
    SIM_NVML_DEVICE(d, idx);
    if (!size)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!accounting(idx))
        return NVML_ERROR_NOT_SUPPORTED;
    *size = SIM_ACCT_RECORDS;
    return NVML_SUCCESS;
}

/* Forgets the ended processes' records (root only); running ones stay. */
NVAPI nvmlDeviceClearAccountingPids(nvmlDevice_t d)
{
    SIM_NVML_DEVICE(d, idx);
    if (!accounting(idx))
        return NVML_ERROR_NOT_SUPPORTED;
    if (geteuid() != 0)
        return NVML_ERROR_NO_PERMISSION;
    sim_gpu_lock(idx);
    sim_shm->gpu[idx].acct_written = 0;
    sim_gpu_unlock(idx);
    return NVML_SUCCESS;
}

/* A pid as the reader sees it: an ended process of another pid namespace has none (0). */
static unsigned ended_pid(const struct sim_acct_record *r)
{
    return r->pidns == 0 || r->pidns == sim_own_pidns() ? (unsigned)r->pid : 0;
}

static unsigned kept_records(int idx)
{
    uint64_t n = sim_shm->gpu[idx].acct_written;
    return n < SIM_ACCT_RECORDS ? (unsigned)n : SIM_ACCT_RECORDS;
}

/* Running processes first, then the ended ones, newest first. */
NVAPI nvmlDeviceGetAccountingPids(nvmlDevice_t d, unsigned int *count, unsigned int *pids)
{
    SIM_NVML_DEVICE(d, idx);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!accounting(idx))
        return NVML_ERROR_NOT_SUPPORTED;
    sim_sweep_dead();
    unsigned n = 0, cap = pids ? *count : 0;
    sim_gpu_lock(idx);
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        if (!__atomic_load_n(&sim_shm->proc[i].live, __ATOMIC_ACQUIRE) || !sim_shm->proc[i].acct_start_ns[idx])
            continue;
        if (n < cap)
            pids[n] = (unsigned)sim_pid_for_reader(i);
        n++;
    }
    const struct sim_gpu_shared *gs = &sim_shm->gpu[idx];
    for (unsigned k = 0; k < kept_records(idx); k++) {
        if (n < cap)
            pids[n] = ended_pid(&gs->acct[(gs->acct_written - 1 - k) % SIM_ACCT_RECORDS]);
        n++;
    }
    sim_gpu_unlock(idx);
    *count = n;
    return n > cap ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

static unsigned percent_of(uint64_t part, uint64_t whole)
{
    uint64_t p = whole ? (part * 100 + whole / 2) / whole : 0;
    return p > 100 ? 100 : (unsigned)p;
}

/* A running process's stats, else the newest ended one's of that pid (as nvml.h
 * says of a pid reused); memory bandwidth is not modelled (0). */
NVAPI nvmlDeviceGetAccountingStats(nvmlDevice_t d, unsigned int pid, nvmlAccountingStats_t *stats)
{
    SIM_NVML_DEVICE(d, idx);
    if (!stats)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!accounting(idx))
        return NVML_ERROR_NOT_SUPPORTED;
    if (!pid)
        return NVML_ERROR_NOT_FOUND;
    sim_sweep_dead();
    nvmlReturn_t r = NVML_ERROR_NOT_FOUND;
    memset(stats, 0, sizeof *stats);
    sim_gpu_lock(idx);
    uint64_t now = sim_now_ns();
    sim_gpu_advance(idx, now);
    for (int i = 0; i < SIM_MAX_PROCS && r; i++) {
        const struct sim_proc *p = &sim_shm->proc[i];
        if (!__atomic_load_n(&p->live, __ATOMIC_ACQUIRE) || !p->acct_start_ns[idx] ||
            (unsigned)sim_pid_for_reader(i) != pid)
            continue;
        stats->gpuUtilization = percent_of(p->queue[idx].done, now - p->acct_start_ns[idx]);
        stats->maxMemoryUsage = p->max_mem[idx];
        stats->startTime = p->acct_start_us[idx];
        stats->isRunning = 1; /* and time 0 until it ends */
        r = NVML_SUCCESS;
    }
    const struct sim_gpu_shared *gs = &sim_shm->gpu[idx];
    for (unsigned k = 0; k < kept_records(idx) && r; k++) {
        const struct sim_acct_record *e = &gs->acct[(gs->acct_written - 1 - k) % SIM_ACCT_RECORDS];
        if (ended_pid(e) != pid)
            continue;
        stats->gpuUtilization = percent_of(e->busy_ns, e->active_ns);
        stats->maxMemoryUsage = e->max_mem;
        stats->time = e->active_ns / 1000000;
        stats->startTime = e->start_us;
        r = NVML_SUCCESS;
    }
    sim_gpu_unlock(idx);
    return r;
}
