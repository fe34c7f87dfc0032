/*
 * The slice socket protocol and a slice's shared ledger: the contract between
 * the daemon (Python, which reads this very file through cffi) and the
 * interposer (C).  Only plain structs and integer #defines between the cdef
 * markers, so both sides use one definition.  Described in docs/slice-protocol.md.
 */
#ifndef GPUSLICE_SLICE_H
#define GPUSLICE_SLICE_H
#include <stdint.h>

/* cdef-begin */
#define GPUSLICE_SLICE_VERSION 4
/* the oldest version the daemon still serves: each version only appends to the
 * usage file, so an older process maps a prefix of it and keeps working */
#define GPUSLICE_SLICE_OLDEST_VERSION 3
#define GPUSLICE_SLICE_MAX_GPUS 8
#define GPUSLICE_SLICE_MAX_PROCS 64
#define GPUSLICE_LIMITS_MAGIC 0x534c4d54
#define GPUSLICE_USAGE_MAGIC 0x53555347
#define GPUSLICE_REQUEST_MAGIC 0x47534c51
#define GPUSLICE_REPLY_MAGIC 0x47534c52

/* status in a reply */
#define GPUSLICE_OK 0
#define GPUSLICE_NO_SLICE 1
#define GPUSLICE_BAD_REQUEST 2
#define GPUSLICE_SLICE_FULL 3

/* ops in a request */
#define GPUSLICE_OP_ATTACH 1

/* policy of a slice GPU */
#define GPUSLICE_POLICY_ELASTIC 0
#define GPUSLICE_POLICY_HARD 1

/* priority of a slice GPU */
#define GPUSLICE_PRIORITY_LOW 0
#define GPUSLICE_PRIORITY_NORMAL 1
#define GPUSLICE_PRIORITY_HIGH 2

/* gate.tokens at or above this: the daemon has opened the gate (no limit) */
#define GPUSLICE_GATE_OPEN 1152921504606846976

struct gpuslice_request {
    uint32_t magic;   /* GPUSLICE_REQUEST_MAGIC */
    uint16_t version; /* GPUSLICE_SLICE_VERSION */
    uint16_t op;      /* GPUSLICE_OP_ATTACH */
};

/* An OK reply to ATTACH carries two fds (SCM_RIGHTS): limits (read-only),
 * then usage (read-write). */
struct gpuslice_reply {
    uint32_t magic;   /* GPUSLICE_REPLY_MAGIC */
    uint16_t version;
    uint16_t status;  /* GPUSLICE_OK, ... */
    uint32_t proc_slot; /* this process's row in usage.proc */
    uint32_t gpu_count;
    char message[240];  /* one line, NUL-terminated, for errors */
};

struct gpuslice_slice_gpu {
    char uuid[48];
    uint64_t memory_limit;    /* bytes */
    uint64_t context_reserve; /* bytes charged per CUDA context (the driver's own use) */
    uint32_t cores;           /* compute share, 1-100; 0 = no guaranteed share */
    uint32_t policy;          /* GPUSLICE_POLICY_* */
    uint32_t priority;        /* GPUSLICE_PRIORITY_* */
    uint32_t pad;
};

/* Written by the daemon only; processes map it read-only. */
struct gpuslice_limits {
    uint32_t magic;
    uint32_t version;
    uint64_t generation; /* bumped by every change (Resize) */
    char slice_id[40];
    uint32_t gpu_count;
    uint32_t pad;
    struct gpuslice_slice_gpu gpu[GPUSLICE_SLICE_MAX_GPUS];
};

struct gpuslice_proc_usage {
    int32_t pid;    /* in the daemon's pid namespace; 0 = free row */
    int32_t ns_pid; /* the same process in its own pid namespace (it writes this) */
    uint64_t used[GPUSLICE_SLICE_MAX_GPUS]; /* bytes this process holds */
};

/* The launch gate of one slice GPU (docs/compute.md), one cache line.  Every
 * launch of the slice's processes takes its cost (the threads it starts)
 * from tokens and waits while they are spent; the daemon adds the next
 * period's budget, or opens the gate. */
struct gpuslice_gate {
    int64_t tokens;          /* budget left, in threads; a launch waits while <= 0 */
    uint64_t next_refill_ns; /* CLOCK_MONOTONIC of the daemon's next refill */
    uint64_t waits;          /* launches that found the budget spent: the slice wants more */
    uint64_t refused;        /* allocations refused at the memory limit (this GPU's out-of-memory answers) */
    /* what the driver holds for the slice's processes beyond what they charged
     * (module code, local memory, its own allocations), set by the daemon
     * from the driver's per-process counts and part of used[g] */
    uint64_t driver_side;
    uint64_t pad[3];
};

/* Shared read-write by every process of the slice; updated with atomics:
 * used[g] is the slice's total and is raised with compare-and-swap against
 * the limit before an allocation reaches the driver. */
struct gpuslice_usage {
    uint32_t magic;
    uint32_t version;
    uint64_t used[GPUSLICE_SLICE_MAX_GPUS];
    struct gpuslice_proc_usage proc[GPUSLICE_SLICE_MAX_PROCS];
    uint8_t pad_to_line[56]; /* gates start on a cache line */
    struct gpuslice_gate gate[GPUSLICE_SLICE_MAX_GPUS];
    /* version 4: all each row's process ever charged per GPU, only growing while
     * it lives (raised after its used[g]); read before and after the driver's
     * count, it bounds what the process held in between (allocator/driver_memory.py).
     * A version 3 process never raises it. */
    uint64_t charged[GPUSLICE_SLICE_MAX_PROCS][GPUSLICE_SLICE_MAX_GPUS];
};
/* The ledger atomics (ledger/slice_ledger.c): linked into the interposer,
 * loaded by the daemon through cffi (which reads these lines too). */
int gpuslice_usage_charge(struct gpuslice_usage *u, const struct gpuslice_limits *l, uint32_t slot, uint32_t gpu,
                          uint64_t bytes);
void gpuslice_usage_uncharge(struct gpuslice_usage *u, uint32_t slot, uint32_t gpu, uint64_t bytes);
uint64_t gpuslice_usage_release_proc(struct gpuslice_usage *u, uint32_t slot);
uint64_t gpuslice_usage_driver_set(struct gpuslice_usage *u, uint32_t gpu, uint64_t bytes);
int64_t gpuslice_gate_refill(struct gpuslice_gate *g, int64_t add, int64_t cap, uint64_t next_refill_ns,
                             int64_t *before);
void gpuslice_gate_open(struct gpuslice_gate *g, uint64_t next_refill_ns, int64_t *before);
/* cdef-end */

_Static_assert(__builtin_offsetof(struct gpuslice_usage, gate) % 64 == 0, "gates start on a cache line");
_Static_assert(sizeof(struct gpuslice_gate) == 64, "a gate is one cache line");

#endif
