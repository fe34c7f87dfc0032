/*
 * The simulated machine: GPUs from a config file, and the state every process
 * on the node shares through one directory (memory in use, kernel time).
 *
 * Layout of <state dir>:
 *   machine     the shared state below, mmap'ed by every process
 *   procs.lock  one byte per process slot; a live process holds an OFD write
 *               lock on its byte, so a slot whose byte is unlocked belongs to a
 *               dead process (SIGKILL included) and is reclaimed.
 */
#ifndef GPUSLICE_SIM_STATE_H
#define GPUSLICE_SIM_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define SIM_API __attribute__((visibility("default")))

#define SIM_MAX_GPUS 8
#define SIM_MAX_PROCS 128
#define SIM_BUCKET_NS 10000000ull /* 10 ms utilisation buckets */
#define SIM_STAMPS_TOGETHER 0      /* each process its own use, every process stamped at the GPU's period ends */
#define SIM_STAMPS_PER_PROCESS 1   /* each process its own use, each on its own clock */
#define SIM_STAMPS_BUSIEST 2       /* one sample per period: the GPU's use, to the process that ran most in it */
#define SIM_NBUCKETS 256          /* ring of 2.56 s */
#define SIM_UTIL_WINDOW_BUCKETS 100 /* NVML reports over the last second */
#define SIM_LAYOUT_VERSION 6u
#define SIM_NSEGS 64          /* when each process's last stretches of work ran, per GPU */
#define SIM_MAX_CG_LIMITS 64
#define SIM_ACCT_RECORDS 64 /* terminated processes accounting keeps per GPU, the oldest overwritten */
#define SIM_CG_PATH 240
#define SIM_MAGIC 0x67707573696d3031ull /* "gpusim01" */

enum sim_pcie_level { /* NVML topology levels */
    SIM_TOPO_INTERNAL = 0,
    SIM_TOPO_SINGLE = 10,
    SIM_TOPO_MULTIPLE = 20,
    SIM_TOPO_HOSTBRIDGE = 30,
    SIM_TOPO_NODE = 40,
    SIM_TOPO_SYSTEM = 50
};

struct sim_gpu_info { /* static, from the config */
    char name[96];
    char uuid[80];       /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
    unsigned char uuid_bytes[16];
    char pci_bus_id[32]; /* "00000000:07:00.0" */
    unsigned pci_domain, pci_bus, pci_device, pci_function;
    unsigned pci_device_id; /* vendor | device << 16, as NVML reports */
    uint64_t memory;         /* bytes */
    uint64_t context_memory; /* bytes charged per CUDA context */
    uint64_t module_memory;  /* a module's code and constants, charged when loaded (lazy: at its first launch) */
    int local_memory;        /* the driver reserves local memory (stack) for every resident thread */
    uint64_t wave_ns;        /* modelled time of one wave of blocks */
    uint64_t util_sample_ns; /* per-process utilization sample period (a multiple of SIM_BUCKET_NS) */
    int util_zero_samples;   /* a period whose use rounds to 0 % still gets a sample (default; 0: none) */
    int util_stamps;         /* SIM_STAMPS_*: whose use a sample period's samples carry, on which clock */
    uint64_t timeslice_ns;   /* how long one context runs while others wait for the GPU */
    int sms;
    int cc_major, cc_minor;
    int clock_khz;
    int memory_limits; /* nvmlDeviceSetMemoryLimits_v1 supported (recent drivers) */
    unsigned long long ecc_uncorrected; /* volatile uncorrected ECC errors NVML reports (a failing GPU) */
    unsigned power_limit_mw;            /* the board's power limit */
};

struct sim_machine { /* what the config describes */
    int gpu_count;
    int driver_version;     /* CUDA driver API version, e.g. 13000 */
    char driver_string[32]; /* NVML driver version, e.g. "580.65.06" */
    struct sim_gpu_info gpu[SIM_MAX_GPUS];
    unsigned char pcie[SIM_MAX_GPUS][SIM_MAX_GPUS];   /* enum sim_pcie_level */
    unsigned char nvlinks[SIM_MAX_GPUS][SIM_MAX_GPUS]; /* link count */
};

struct sim_bucket {
    uint64_t epoch; /* absolute bucket number; stale when it differs */
    uint64_t busy_ns;
};

/* A driver-enforced memory limit on one cgroup (nvmlDeviceSetMemoryLimits_v1). */
struct sim_cg_limit {
    uint32_t active;
    uint32_t pad;
    char ns[SIM_CG_PATH]; /* the sysfs path it was set on */
    uint64_t soft, hard;
    uint64_t used; /* bytes held by processes of that cgroup */
};

/* A terminated process's accounting stats on one GPU (sim_nvml_accounting.c). */
struct sim_acct_record {
    int32_t pid;      /* as seen in its own pid namespace */
    uint32_t pad;
    uint64_t pidns;
    uint64_t start_us;  /* CLOCK_REALTIME, when its first context on the GPU was made */
    uint64_t active_ns; /* from then until its end was noticed */
    uint64_t busy_ns;   /* its kernels' time */
    uint64_t max_mem;   /* the most it held */
};

struct sim_gpu_shared {
    pthread_mutex_t lock; /* robust, process-shared: memory, schedule, limits, accounting */
    uint64_t used;        /* bytes held by live processes */
    uint64_t sched_t;     /* CLOCK_MONOTONIC ns up to which the schedule has been run */
    uint64_t slice_left;  /* ns left of the running process's time slice */
    int32_t running;      /* its slot, -1: none */
    uint32_t pad;
    struct sim_cg_limit limits[SIM_MAX_CG_LIMITS];
    uint32_t accounting;   /* per-process accounting mode (nvmlDeviceSetAccountingMode) */
    uint32_t acct_pad;
    uint64_t acct_written; /* records ever written; the last SIM_ACCT_RECORDS are kept */
    struct sim_acct_record acct[SIM_ACCT_RECORDS];
};

/* A stretch of time in which one process's queue ran: from t, work
 * done..done+len of it. */
struct sim_seg {
    uint64_t t, done, len;
};

/* One process's work on one GPU, in ns: its marks count `submitted`. */
struct sim_queue {
    uint64_t submitted; /* queued since the slot was taken */
    uint64_t done;      /* ... of which the GPU has run this much */
    uint64_t segs;      /* stretches recorded; the last SIM_NSEGS are kept */
    struct sim_seg seg[SIM_NSEGS];
};

struct sim_proc {
    uint32_t live; /* 1 while the slot belongs to a process */
    int32_t pid;   /* as seen in its own pid namespace */
    uint64_t pidns;
    char comm[16];
    char cgroup[SIM_CG_PATH];        /* its cgroup, as /proc/self/cgroup names it */
    uint64_t mem[SIM_MAX_GPUS];      /* under gpu lock */
    uint32_t contexts[SIM_MAX_GPUS]; /* under gpu lock */
    uint64_t busy_total[SIM_MAX_GPUS];
    uint64_t max_mem[SIM_MAX_GPUS];       /* under gpu lock: the most it held */
    uint64_t acct_start_ns[SIM_MAX_GPUS]; /* under gpu lock: its first context made while accounting was on (0: none) */
    uint64_t acct_start_us[SIM_MAX_GPUS]; /* ... the same moment, CLOCK_REALTIME */
    struct sim_bucket util[SIM_MAX_GPUS][SIM_NBUCKETS];
    struct sim_queue queue[SIM_MAX_GPUS]; /* under gpu lock */
};

struct sim_shared {
    uint64_t magic;
    uint32_t layout_version;
    uint32_t pad;
    uint64_t config_digest;
    struct sim_machine machine;
    pthread_mutex_t lock; /* slot registration and reclaim */
    struct sim_gpu_shared gpu[SIM_MAX_GPUS];
    struct sim_proc proc[SIM_MAX_PROCS];
};

/* Config (sim_config.c) */
int sim_config_load(const char *path, struct sim_machine *out, char *err, size_t errlen);
const char *sim_config_path(void);

/* Shared state (sim_state.c).  sim_attach is idempotent and thread-safe. */
int sim_attach(char *err, size_t errlen);
extern struct sim_shared *sim_shm;
const struct sim_machine *sim_machine(void);
int sim_register_self(void); /* take a process slot; -1 if none free */
int sim_self_slot(void);
void sim_sweep_dead(void);   /* reclaim the slots of dead processes */
int sim_slot_alive(int slot);
uint64_t sim_own_pidns(void); /* the pid namespace of this process (its inode) */
int32_t sim_pid_for_reader(int slot); /* its pid in the caller's pid namespace, where visible */
void sim_gpu_lock(int gpu);
void sim_gpu_unlock(int gpu);
int sim_mem_charge(int gpu, uint64_t bytes);   /* 0 or -1 if it does not fit */
void sim_mem_uncharge(int gpu, uint64_t bytes);
void sim_context_count(int gpu, int delta);
/* The GPU's scheduler (sim_schedule.c): each process queues its work in its
 * own queue, and the GPU runs the queues with work in turn, a time slice
 * each (time slicing between contexts, as without MPS).  A mark names the
 * end of some of the calling process's work on a GPU (0: none). */
uint64_t sim_gpu_submit(int gpu, uint64_t ns, uint64_t *pending); /* its mark; pending: ns queued and not run */
int sim_gpu_done(int gpu, uint64_t mark);
void sim_gpu_wait(int gpu, uint64_t mark);        /* sleeps until the GPU has run it */
uint64_t sim_gpu_mark_time(int gpu, uint64_t mark); /* when a done mark's work ended */
/* Accounting (sim_accounting.c), caller holds the GPU lock: a process's record begins with its first context
 * made while accounting is on, and is kept once the process has ended. */
void sim_acct_record_start(int gpu, int slot);
void sim_acct_record_end(int gpu, int slot);
void sim_gpu_advance(int gpu, uint64_t now);      /* run the schedule up to now; caller holds the GPU lock */
uint64_t sim_now_ns(void);
void sim_sleep_until(uint64_t t_ns);
/* Busy ns of one slot (or all live slots with slot < 0) in [from, to). */
uint64_t sim_busy_between(int gpu, int slot, uint64_t from_ns, uint64_t to_ns);
void sim_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void sim_reset_after_fork(void);

/* Driver-enforced limits (sim_limits.c).  Callers hold the GPU's lock. */
void sim_own_cgroup(char *out, size_t len);
int sim_cg_match(const char *ns, const char *cgroup);
struct sim_cg_limit *sim_cg_limit_of(int gpu, const char *cgroup); /* the limit in force, or NULL */
int sim_cg_charge(int gpu, const char *cgroup, uint64_t bytes);      /* 0, or -1 past the hard limit */
void sim_cg_uncharge(int gpu, const char *cgroup, uint64_t bytes);
void sim_cg_drop_removed(int gpu);                                     /* cgroups that are gone lose their limit */

#endif
