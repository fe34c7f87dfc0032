/* Simulated NVML: reads the shared machine state that the simulated libcuda
 * of every process writes, so one process sees another's memory and kernels. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gpuslice_nvml.h"
#include "sim_nvml.h"
#include "sim_state.h"

#define NVAPI SIM_API nvmlReturn_t

static struct nvmlDevice_st {
    int index;
} devices[SIM_MAX_GPUS];
static int init_count;
static char own_cgroup[SIM_CG_PATH]; /* driver limits apply by cgroup; read once, by the first init */
static int cgroup_read;
static pthread_mutex_t nvml_mu = PTHREAD_MUTEX_INITIALIZER;

static const struct { nvmlReturn_t code; const char *text; } errors[] = {
    {NVML_SUCCESS, "Success"},
    {NVML_ERROR_UNINITIALIZED, "Uninitialized"},
    {NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument"},
    {NVML_ERROR_NOT_SUPPORTED, "Not Supported"},
    {NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"},
    {NVML_ERROR_ALREADY_INITIALIZED, "Already Initialized"},
    {NVML_ERROR_NOT_FOUND, "Not Found"},
    {NVML_ERROR_INSUFFICIENT_SIZE, "Insufficient Size"},
    {NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"},
    {NVML_ERROR_TIMEOUT, "Timeout"},
    {NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"},
    {NVML_ERROR_FUNCTION_NOT_FOUND, "Function Not Found"},
    {NVML_ERROR_GPU_IS_LOST, "GPU is lost"},
    {NVML_ERROR_OPERATING_SYSTEM, "The operating system has blocked the request."},
    {NVML_ERROR_IN_USE, "In use by another client"},
    {NVML_ERROR_MEMORY, "Insufficient Memory"},
    {NVML_ERROR_NO_DATA, "No data"},
    {NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "Argument version mismatch"},
    {NVML_ERROR_GPU_NOT_FOUND, "GPU not found"},
    {NVML_ERROR_INVALID_STATE, "Invalid state"},
    {NVML_ERROR_UNKNOWN, "Unknown Error"},
};

SIM_API const char *nvmlErrorString(nvmlReturn_t r)
{
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == r)
            return errors[i].text;
    return "Unknown Error";
}

NVAPI nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    char err[512] = "";
    if (sim_attach(err, sizeof err)) {
        sim_log("%s", err);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    pthread_mutex_lock(&nvml_mu);
    if (!cgroup_read) /* written before any thread's ready() can see an init, never after */
        sim_own_cgroup(own_cgroup, sizeof own_cgroup);
    cgroup_read = 1;
    for (int i = 0; i < SIM_MAX_GPUS; i++)
        devices[i].index = i;
    init_count++;
    pthread_mutex_unlock(&nvml_mu);
    return NVML_SUCCESS;
}

NVAPI nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
NVAPI nvmlInit(void) { return nvmlInitWithFlags(0); }

NVAPI nvmlShutdown(void)
{
    pthread_mutex_lock(&nvml_mu);
    nvmlReturn_t r = init_count > 0 ? (init_count--, NVML_SUCCESS) : NVML_ERROR_UNINITIALIZED;
    pthread_mutex_unlock(&nvml_mu);
    return r;
}

static int ready(void)
{
    pthread_mutex_lock(&nvml_mu);
    int ok = init_count > 0;
    pthread_mutex_unlock(&nvml_mu);
    return ok;
}

#define REQUIRE_INIT()                         \
    do {                                       \
        if (!ready())                          \
            return NVML_ERROR_UNINITIALIZED;   \
    } while (0)

static int dev_index(nvmlDevice_t d)
{
    if (d < devices || d >= devices + sim_machine()->gpu_count)
        return -1;
    return (int)(d - devices);
}

int sim_nvml_index(nvmlDevice_t d)
{
    return ready() ? dev_index(d) : -2;
}

static nvmlReturn_t copy_str(char *dst, unsigned int len, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

NVAPI nvmlSystemGetDriverVersion(char *v, unsigned int len)
{
    REQUIRE_INIT();
    return copy_str(v, len, sim_machine()->driver_string);
}

NVAPI nvmlSystemGetNVMLVersion(char *v, unsigned int len)
{
    REQUIRE_INIT();
    char buf[48];
    snprintf(buf, sizeof buf, "13.%s", sim_machine()->driver_string);
    return copy_str(v, len, buf);
}

NVAPI nvmlSystemGetCudaDriverVersion(int *v)
{
    REQUIRE_INIT();
    if (!v)
        return NVML_ERROR_INVALID_ARGUMENT;
    *v = sim_machine()->driver_version;
    return NVML_SUCCESS;
}

NVAPI nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

NVAPI nvmlDeviceGetCount_v2(unsigned int *n)
{
    REQUIRE_INIT();
    if (!n)
        return NVML_ERROR_INVALID_ARGUMENT;
    *n = (unsigned)sim_machine()->gpu_count;
    return NVML_SUCCESS;
}

NVAPI nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }

NVAPI nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
    REQUIRE_INIT();
    if (!d || i >= (unsigned)sim_machine()->gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *d = &devices[i];
    return NVML_SUCCESS;
}

NVAPI nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return nvmlDeviceGetHandleByIndex_v2(i, d); }

NVAPI nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d)
{
    REQUIRE_INIT();
    if (!uuid || !d)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < sim_machine()->gpu_count; i++)
        if (strcmp(sim_machine()->gpu[i].uuid, uuid) == 0)
            return *d = &devices[i], NVML_SUCCESS;
    return NVML_ERROR_NOT_FOUND;
}

NVAPI nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *d)
{
    REQUIRE_INIT();
    if (!bus_id || !d)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned dom = 0, bus, dev, fn = 0;
    if (sscanf(bus_id, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) < 3 &&
        (dom = 0, sscanf(bus_id, "%x:%x.%x", &bus, &dev, &fn) < 2))
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < sim_machine()->gpu_count; i++) {
        const struct sim_gpu_info *g = &sim_machine()->gpu[i];
        if (g->pci_domain == dom && g->pci_bus == bus && g->pci_device == dev && g->pci_function == fn)
            return *d = &devices[i], NVML_SUCCESS;
    }
    return NVML_ERROR_NOT_FOUND;
}

NVAPI nvmlDeviceGetHandleByPciBusId(const char *b, nvmlDevice_t *d) { return nvmlDeviceGetHandleByPciBusId_v2(b, d); }

NVAPI nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i)
{
    SIM_NVML_DEVICE(d, idx);
    if (!i)
        return NVML_ERROR_INVALID_ARGUMENT;
    *i = (unsigned)idx;
    return NVML_SUCCESS;
}

NVAPI nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *m)
{
    return nvmlDeviceGetIndex(d, m);
}

NVAPI nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len)
{
    SIM_NVML_DEVICE(d, idx);
    return copy_str(name, len, sim_machine()->gpu[idx].name);
}

NVAPI nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len)
{
    SIM_NVML_DEVICE(d, idx);
    return copy_str(uuid, len, sim_machine()->gpu[idx].uuid);
}

static void pci_info(int idx, nvmlPciInfo_t *p)
{
    const struct sim_gpu_info *g = &sim_machine()->gpu[idx];
    memset(p, 0, sizeof *p);
    snprintf(p->busId, sizeof p->busId, "%s", g->pci_bus_id);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%04X:%02X:%02X.%X", g->pci_domain, g->pci_bus, g->pci_device,
             g->pci_function);
    p->domain = g->pci_domain;
    p->bus = g->pci_bus;
    p->device = g->pci_device;
    p->pciDeviceId = g->pci_device_id;
    p->pciSubSystemId = 0x145f10de;
}

NVAPI nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p)
{
    SIM_NVML_DEVICE(d, idx);
    if (!p)
        return NVML_ERROR_INVALID_ARGUMENT;
    pci_info(idx, p);
    return NVML_SUCCESS;
}

NVAPI nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(d, p); }
NVAPI nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(d, p); }

NVAPI nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor)
{
    SIM_NVML_DEVICE(d, idx);
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = sim_machine()->gpu[idx].cc_major;
    *minor = sim_machine()->gpu[idx].cc_minor;
    return NVML_SUCCESS;
}

static void memory(int idx, unsigned long long *total, unsigned long long *used)
{
    sim_sweep_dead(); /* SIGKILLed processes stop counting now */
    *total = sim_machine()->gpu[idx].memory;
    sim_gpu_lock(idx);
    *used = sim_shm->gpu[idx].used;
    const struct sim_cg_limit *l = sim_cg_limit_of(idx, own_cgroup);
    if (l) { /* inside a limited cgroup NVML reports the limit */
        *total = l->hard < *total ? l->hard : *total;
        *used = l->used;
    }
    sim_gpu_unlock(idx);
    if (*used > *total)
        *used = *total;
}

NVAPI nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
    SIM_NVML_DEVICE(d, idx);
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory(idx, &m->total, &m->used);
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

NVAPI nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
    SIM_NVML_DEVICE(d, idx);
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory(idx, &m->total, &m->used);
    m->reserved = 0; /* the simulator reserves nothing for the driver */
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

/* Processes with a context or memory on the GPU; `write` fills one entry. */
static nvmlReturn_t list_procs(int idx, unsigned int *count, void *out, size_t stride,
                               void (*write)(void *, const struct sim_proc *, int))
{
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    sim_sweep_dead();
    unsigned n = 0, cap = *count;
    sim_gpu_lock(idx);
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        const struct sim_proc *p = &sim_shm->proc[i];
        if (!__atomic_load_n(&p->live, __ATOMIC_ACQUIRE) || (!p->contexts[idx] && !p->mem[idx]))
            continue;
        if (out && n < cap)
            write((char *)out + (size_t)n * stride, p, idx);
        n++;
    }
    sim_gpu_unlock(idx);
    *count = n;
    if (n > cap || (n && !out))
        return NVML_ERROR_INSUFFICIENT_SIZE;
    return NVML_SUCCESS;
}

static void write_v2(void *dst, const struct sim_proc *p, int idx)
{
    nvmlProcessInfo_t *e = dst;
    e->pid = (unsigned)sim_pid_for_reader((int)(p - sim_shm->proc));
    e->usedGpuMemory = p->mem[idx];
    e->gpuInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
    e->computeInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
}

static void write_v1(void *dst, const struct sim_proc *p, int idx)
{
    nvmlProcessInfo_v1_t *e = dst;
    e->pid = (unsigned)sim_pid_for_reader((int)(p - sim_shm->proc));
    e->usedGpuMemory = p->mem[idx];
}

NVAPI nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos)
{
    SIM_NVML_DEVICE(d, idx);
    return list_procs(idx, count, infos, sizeof *infos, write_v2);
}

NVAPI nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos)
{
    return nvmlDeviceGetComputeRunningProcesses_v3(d, count, infos);
}

NVAPI nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_v1_t *infos)
{
    SIM_NVML_DEVICE(d, idx);
    return list_procs(idx, count, infos, sizeof *infos, write_v1);
}

static nvmlReturn_t no_graphics(nvmlDevice_t d, unsigned int *count)
{
    SIM_NVML_DEVICE(d, idx);
    (void)idx;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0; /* the simulator runs compute work only */
    return NVML_SUCCESS;
}

NVAPI nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i) { (void)i; return no_graphics(d, c); }
NVAPI nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i) { (void)i; return no_graphics(d, c); }

static unsigned percent(uint64_t busy, uint64_t window)
{
    uint64_t p = window ? (busy * 100 + window / 2) / window : 0;
    return p > 100 ? 100 : (unsigned)p;
}

NVAPI nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
    SIM_NVML_DEVICE(d, idx);
    if (!u)
        return NVML_ERROR_INVALID_ARGUMENT;
    u->gpu = sim_nvml_busy_percent(idx);
    u->memory = 0; /* memory bandwidth is not modelled */
    return NVML_SUCCESS;
}

unsigned sim_nvml_busy_percent(int idx)
{
    sim_sweep_dead();
    /* the last second of complete 10 ms buckets */
    uint64_t to = sim_now_ns() / SIM_BUCKET_NS * SIM_BUCKET_NS;
    uint64_t window = SIM_UTIL_WINDOW_BUCKETS * SIM_BUCKET_NS;
    return percent(sim_busy_between(idx, -1, to - window, to), window);
}

/* ECC is on (as on data-centre GPUs); the volatile uncorrected count is the
 * config's ecc_uncorrected, which makes a failing GPU; nothing else errs. */
NVAPI nvmlDeviceGetEccMode(nvmlDevice_t d, nvmlEnableState_t *current, nvmlEnableState_t *pending)
{
    SIM_NVML_DEVICE(d, idx);
    (void)idx;
    if (!current || !pending)
        return NVML_ERROR_INVALID_ARGUMENT;
    *current = *pending = NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
}

NVAPI nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, nvmlMemoryErrorType_t type, nvmlEccCounterType_t counter,
                                  unsigned long long *count)
{
    SIM_NVML_DEVICE(d, idx);
    if (!count || (type != NVML_MEMORY_ERROR_TYPE_CORRECTED && type != NVML_MEMORY_ERROR_TYPE_UNCORRECTED) ||
        (counter != NVML_VOLATILE_ECC && counter != NVML_AGGREGATE_ECC))
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED ? sim_machine()->gpu[idx].ecc_uncorrected : 0;
    return NVML_SUCCESS;
}

/* Per-process samples since last_seen (at most the last second), stamped on
 * the realtime clock.  With no util_sample_time configured: one sample per
 * process covering the 10 ms buckets completed since then (an ideal driver;
 * a caller that passes back the newest timestamp gets windows that tile
 * time).  With one: one sample per process per completed sample period in
 * which it ran, in integer percent of that period, as real drivers report. */
static int util_window(int idx, unsigned long long last_seen_us, uint64_t *from, uint64_t *to, unsigned long long *stamp)
{
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    uint64_t mono = sim_now_ns(), period = sim_machine()->gpu[idx].util_sample_ns;
    unsigned long long now_us = (unsigned long long)rt.tv_sec * 1000000ull + (unsigned long long)rt.tv_nsec / 1000;
    *to = mono / period * period;
    *from = *to - SIM_UTIL_WINDOW_BUCKETS * SIM_BUCKET_NS / period * period;
    *stamp = now_us - (mono - *to) / 1000; /* `to` on the realtime clock */
    if (last_seen_us) {
        if (last_seen_us >= *stamp)
            return 0;
        uint64_t seen = *to - (*stamp - last_seen_us) * 1000ull; /* back on the monotonic clock */
        seen = (seen + period / 2) / period * period;
        if (seen > *from)
            *from = seen;
    }
    return *to > *from;
}

/* The buckets by which process `slot`'s sample periods are offset from the
 * GPU's: spread over the period by the golden ratio, so that any two slots'
 * stamps differ (real drivers stamp each process on its own clock: NVIDIA/
 * go-nvml #51 and Syllo/nvtop #110 print stamps 0.3 to 1.2 s apart). */
static uint64_t own_phase(int slot, uint64_t period)
{
    uint64_t buckets = period / SIM_BUCKET_NS;
    return (uint64_t)((unsigned)slot * 2654435769u % 4294967296u * buckets / 4294967296u) * SIM_BUCKET_NS;
}

/* The clocks a sampled answer is made on: now on the monotonic and realtime
 * clocks, the oldest time kept (the last second), and last_seen on the
 * monotonic clock, on the bucket grid (the clocks' jitter is µs). 0: nothing
 * can be newer than last_seen. */
static int sample_clock(unsigned long long last_seen_us, uint64_t *mono, unsigned long long *now_us, uint64_t *floor,
                        uint64_t *seen)
{
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    *mono = sim_now_ns();
    *now_us = (unsigned long long)rt.tv_sec * 1000000ull + (unsigned long long)rt.tv_nsec / 1000;
    *floor = *mono > SIM_UTIL_WINDOW_BUCKETS * SIM_BUCKET_NS ? *mono - SIM_UTIL_WINDOW_BUCKETS * SIM_BUCKET_NS : 0;
    *seen = 0;
    if (!last_seen_us)
        return 1;
    if (last_seen_us >= *now_us)
        return 0;
    uint64_t back = (*now_us - last_seen_us) * 1000ull;
    *seen = back >= *mono ? 0 : (*mono - back + SIM_BUCKET_NS / 2) / SIM_BUCKET_NS * SIM_BUCKET_NS;
    return 1;
}

/* Has process slot i a context or memory on GPU idx? Read under the GPU's
 * lock, which its writers hold (a sweep may be reclaiming it meanwhile). */
static int on_gpu(int i, int idx)
{
    const struct sim_proc *p = &sim_shm->proc[i];
    if (!__atomic_load_n(&p->live, __ATOMIC_ACQUIRE))
        return 0;
    sim_gpu_lock(idx);
    int on = p->contexts[idx] || p->mem[idx];
    sim_gpu_unlock(idx);
    return on;
}

/* util_stamps: per_process.  Each process gets a sample for each of its own
 * periods that ended within the last second, after last_seen, and in which
 * it ran (or ran less than 1 % where util_zero_samples is on). */
static unsigned own_stamp_samples(int idx, nvmlProcessUtilizationSample_t *samples, unsigned cap,
                                  unsigned long long last_seen_us)
{
    uint64_t mono, floor, seen, period = sim_machine()->gpu[idx].util_sample_ns;
    unsigned long long now_us;
    if (!sample_clock(last_seen_us, &mono, &now_us, &floor, &seen))
        return 0;
    unsigned n = 0;
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        if (!on_gpu(i, idx))
            continue;
        uint64_t phase = own_phase(i, period);
        if (mono < phase + period)
            continue;
        /* newest first: each period of its own that ended by now, after last_seen, within the second kept */
        for (uint64_t end = phase + (mono - phase) / period * period;; end -= period) {
            if (end <= seen || end < floor + period)
                break;
            uint64_t busy = sim_busy_between(idx, i, end - period, end);
            if (busy && (sim_machine()->gpu[idx].util_zero_samples || percent(busy, period) > 0)) {
                if (samples && n < cap)
                    samples[n] = (nvmlProcessUtilizationSample_t){.pid = (unsigned)sim_pid_for_reader(i),
                                                                  .timeStamp = now_us - (mono - end) / 1000,
                                                                  .smUtil = percent(busy, period)};
                n++;
            }
            if (end < phase + 2 * period)
                break;
        }
    }
    return n;
}

/* util_stamps: busiest.  What an H100 with driver 580 answered
 * (tests/data/real-gpu/h100-2026-11-26/trace.json): periods on the GPU's
 * clock, and for each at most one sample, carrying the GPU's use over the
 * period, to the process that ran most in it; two tenants time-slicing never
 * got a sample for the same period.  An answer spanning several periods gives
 * each process that was given any one sample: its newest stamp, and the mean
 * over every period since last_seen of what it was given (0 for the others). */
static unsigned busiest_samples(int idx, nvmlProcessUtilizationSample_t *samples, unsigned cap,
                                unsigned long long last_seen_us)
{
    uint64_t mono, floor, seen, period = sim_machine()->gpu[idx].util_sample_ns;
    unsigned long long now_us;
    if (!sample_clock(last_seen_us, &mono, &now_us, &floor, &seen))
        return 0;
    unsigned given[SIM_MAX_PROCS] = {0}, periods = 0;
    uint64_t newest[SIM_MAX_PROCS] = {0};
    for (uint64_t end = mono / period * period; end > seen && end >= floor + period && end >= period; end -= period) {
        periods++;
        uint64_t all = sim_busy_between(idx, -1, end - period, end), most = 0;
        int who = -1;
        for (int i = 0; i < SIM_MAX_PROCS; i++) {
            if (!on_gpu(i, idx))
                continue;
            uint64_t busy = sim_busy_between(idx, i, end - period, end);
            if (busy > most)
                most = busy, who = i;
        }
        if (who < 0 || (!sim_machine()->gpu[idx].util_zero_samples && percent(all, period) == 0))
            continue;
        given[who] += percent(all, period);
        if (!newest[who])
            newest[who] = end;
    }
    unsigned n = 0;
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        if (!newest[i])
            continue;
        if (samples && n < cap)
            samples[n] = (nvmlProcessUtilizationSample_t){.pid = (unsigned)sim_pid_for_reader(i),
                                                          .timeStamp = now_us - (mono - newest[i]) / 1000,
                                                          .smUtil = (given[i] + periods / 2) / periods};
        n++;
    }
    return n;
}

NVAPI nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *samples, unsigned int *count,
                                      unsigned long long last_seen_us)
{
    SIM_NVML_DEVICE(d, idx);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    sim_sweep_dead();
    int stamps = sim_machine()->gpu[idx].util_stamps;
    if (stamps != SIM_STAMPS_TOGETHER && sim_machine()->gpu[idx].util_sample_ns > SIM_BUCKET_NS) {
        unsigned cap = *count, n = stamps == SIM_STAMPS_BUSIEST ? busiest_samples(idx, samples, cap, last_seen_us)
                                                                : own_stamp_samples(idx, samples, cap, last_seen_us);
        *count = n;
        if (n == 0)
            return NVML_ERROR_NOT_FOUND;
        return (!samples || n > cap) ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    uint64_t from, to;
    unsigned long long stamp;
    int any = util_window(idx, last_seen_us, &from, &to, &stamp);
    uint64_t period = sim_machine()->gpu[idx].util_sample_ns;
    if (period == SIM_BUCKET_NS) /* the ideal driver: one sample for the whole window */
        period = to - from;
    unsigned n = 0, cap = *count;
    for (uint64_t a = from; any && a < to; a += period) {
        unsigned long long at = stamp - (to - a - period) / 1000;
        for (int i = 0; i < SIM_MAX_PROCS; i++) {
            if (!on_gpu(i, idx))
                continue;
            uint64_t busy = sim_busy_between(idx, i, a, a + period);
            if (!busy || (!sim_machine()->gpu[idx].util_zero_samples && percent(busy, period) == 0))
                continue;
            if (samples && n < cap)
                samples[n] = (nvmlProcessUtilizationSample_t){.pid = (unsigned)sim_pid_for_reader(i), .timeStamp = at,
                                                              .smUtil = percent(busy, period)};
            n++;
        }
    }
    *count = n;
    if (n == 0)
        return NVML_ERROR_NOT_FOUND;
    return (!samples || n > cap) ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

NVAPI nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, nvmlGpuTopologyLevel_t *level)
{
    SIM_NVML_DEVICE(a, ia);
    int ib = dev_index(b);
    if (ib < 0 || !level)
        return NVML_ERROR_INVALID_ARGUMENT;
    *level = (nvmlGpuTopologyLevel_t)sim_machine()->pcie[ia][ib];
    return NVML_SUCCESS;
}

NVAPI nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, nvmlGpuP2PCapsIndex_t cap, nvmlGpuP2PStatus_t *st)
{
    SIM_NVML_DEVICE(a, ia);
    int ib = dev_index(b);
    if (ib < 0 || !st)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct sim_machine *m = sim_machine();
    int ok = ia != ib && (cap == NVML_P2P_CAPS_INDEX_NVLINK ? m->nvlinks[ia][ib] > 0
                                                            : m->nvlinks[ia][ib] > 0 || m->pcie[ia][ib] <= SIM_TOPO_HOSTBRIDGE);
    *st = ok ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

/* NVLink link k of GPU a leads to the k-th peer link in index order. */
static int link_peer(int a, unsigned link)
{
    const struct sim_machine *m = sim_machine();
    unsigned k = 0;
    for (int b = 0; b < m->gpu_count; b++)
        for (unsigned l = 0; l < m->nvlinks[a][b]; l++, k++)
            if (k == link)
                return b;
    return -1;
}

NVAPI nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, nvmlEnableState_t *active)
{
    SIM_NVML_DEVICE(d, idx);
    if (!active || link >= NVML_NVLINK_MAX_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    int peer = link_peer(idx, link);
    if (peer < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *active = NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
}

NVAPI nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *pci)
{
    SIM_NVML_DEVICE(d, idx);
    if (!pci || link >= NVML_NVLINK_MAX_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    int peer = link_peer(idx, link);
    if (peer < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    pci_info(peer, pci);
    return NVML_SUCCESS;
}

/* ---- driver-enforced memory limits per cgroup ---------------------------- */

NVAPI nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t d, nvmlSetMemoryLimits_v1_t *limits)
{
    SIM_NVML_DEVICE(d, idx);
    if (!sim_machine()->gpu[idx].memory_limits)
        return NVML_ERROR_NOT_SUPPORTED;
    if (geteuid() != 0)
        return NVML_ERROR_NO_PERMISSION;
    if (!limits || !limits->nameSpace || strlen(limits->nameSpace) >= SIM_CG_PATH ||
        limits->softLimit > limits->hardLimit ||
        (limits->hardLimit != NVML_DEVICE_MEMORY_LIMIT_MAX && limits->hardLimit > sim_machine()->gpu[idx].memory))
        return NVML_ERROR_INVALID_ARGUMENT;
    struct stat st;
    if (stat(limits->nameSpace, &st) != 0)
        return NVML_ERROR_OPERATING_SYSTEM;
    int clear = limits->softLimit == 0 && limits->hardLimit == NVML_DEVICE_MEMORY_LIMIT_MAX;
    nvmlReturn_t r = NVML_SUCCESS;
    sim_gpu_lock(idx);
    sim_cg_drop_removed(idx);
    struct sim_cg_limit *l = sim_shm->gpu[idx].limits, *slot = NULL, *free_slot = NULL;
    for (int i = 0; i < SIM_MAX_CG_LIMITS; i++) {
        if (l[i].active && strcmp(l[i].ns, limits->nameSpace) == 0)
            slot = &l[i];
        else if (!l[i].active && !free_slot)
            free_slot = &l[i];
    }
    if (clear) {
        if (slot)
            slot->active = 0;
    } else if (!slot && !free_slot) {
        r = NVML_ERROR_INSUFFICIENT_RESOURCES;
    } else {
        if (!slot) { /* what the cgroup's processes hold already counts */
            slot = free_slot;
            memset(slot, 0, sizeof *slot);
            snprintf(slot->ns, sizeof slot->ns, "%s", limits->nameSpace);
            for (int i = 0; i < SIM_MAX_PROCS; i++)
                if (__atomic_load_n(&sim_shm->proc[i].live, __ATOMIC_ACQUIRE) && sim_cg_match(slot->ns, sim_shm->proc[i].cgroup))
                    slot->used += sim_shm->proc[i].mem[idx];
        }
        slot->soft = limits->softLimit;
        slot->hard = limits->hardLimit;
        slot->active = 1;
    }
    sim_gpu_unlock(idx);
    return r;
}

NVAPI nvmlDeviceGetMemoryLimits_v1(nvmlDevice_t d, nvmlGetMemoryLimits_v1_t *limits)
{
    SIM_NVML_DEVICE(d, idx);
    if (!sim_machine()->gpu[idx].memory_limits)
        return NVML_ERROR_NOT_SUPPORTED;
    if (!limits || !limits->nameSpace)
        return NVML_ERROR_INVALID_ARGUMENT;
    sim_gpu_lock(idx);
    sim_cg_drop_removed(idx); /* a removed cgroup's limit is gone, even if the path comes back */
    sim_gpu_unlock(idx);
    struct stat st;
    if (stat(limits->nameSpace, &st) != 0)
        return NVML_ERROR_OPERATING_SYSTEM;
    nvmlReturn_t r = NVML_ERROR_NOT_FOUND;
    sim_gpu_lock(idx);
    const struct sim_cg_limit *l = sim_shm->gpu[idx].limits;
    for (int i = 0; i < SIM_MAX_CG_LIMITS; i++)
        if (l[i].active && strcmp(l[i].ns, limits->nameSpace) == 0) {
            limits->softLimit = l[i].soft;
            limits->hardLimit = l[i].hard;
            limits->currentUsed = l[i].used;
            r = NVML_SUCCESS;
        }
    sim_gpu_unlock(idx);
    return r;
}
