/* Atomic updates of a slice's shared usage ledger (gpuslice_slice.h).
 * One implementation for the interposer (linked in) and the daemon (through
 * cffi): charge against the limit with compare-and-swap, give back, and clear
 * a dead process's row. */
#include <stdint.h>

#include "gpuslice_slice.h"

#ifndef LEDGER_API /* the interposer links these in, hidden */
#define LEDGER_API __attribute__((visibility("default")))
#endif

LEDGER_API int gpuslice_usage_charge(struct gpuslice_usage *u, const struct gpuslice_limits *l, uint32_t slot,
                                     uint32_t gpu, uint64_t bytes)
{
    if (gpu >= GPUSLICE_SLICE_MAX_GPUS || slot >= GPUSLICE_SLICE_MAX_PROCS)
        return -1;
    uint64_t limit = __atomic_load_n(&l->gpu[gpu].memory_limit, __ATOMIC_ACQUIRE);
    uint64_t cur = __atomic_load_n(&u->used[gpu], __ATOMIC_ACQUIRE);
    do {
        if (bytes > limit || cur > limit - bytes) {
            /* counted for the metrics; a cold path, and one line the launches rarely touch */
            __atomic_add_fetch(&u->gate[gpu].refused, 1, __ATOMIC_RELAXED);
            return -1;
        }
    } while (!__atomic_compare_exchange_n(&u->used[gpu], &cur, cur + bytes, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    __atomic_add_fetch(&u->proc[slot].used[gpu], bytes, __ATOMIC_ACQ_REL);
    /* after used: a reader that sees this sees used raised too (driver_memory.py) */
    __atomic_add_fetch(&u->charged[slot][gpu], bytes, __ATOMIC_RELEASE);
    return 0;
}

/* Never below zero: a double free cannot corrupt the slice's total. */
LEDGER_API void gpuslice_usage_uncharge(struct gpuslice_usage *u, uint32_t slot, uint32_t gpu, uint64_t bytes)
{
    if (gpu >= GPUSLICE_SLICE_MAX_GPUS || slot >= GPUSLICE_SLICE_MAX_PROCS)
        return;
    uint64_t mine = __atomic_load_n(&u->proc[slot].used[gpu], __ATOMIC_ACQUIRE);
    do {
        if (bytes > mine)
            bytes = mine;
    } while (!__atomic_compare_exchange_n(&u->proc[slot].used[gpu], &mine, mine - bytes, 1, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
    __atomic_sub_fetch(&u->used[gpu], bytes, __ATOMIC_ACQ_REL);
}

/* The process of `slot` is gone: its bytes leave the slice's totals. */
LEDGER_API uint64_t gpuslice_usage_release_proc(struct gpuslice_usage *u, uint32_t slot)
{
    if (slot >= GPUSLICE_SLICE_MAX_PROCS)
        return 0;
    uint64_t freed = 0;
    for (int g = 0; g < GPUSLICE_SLICE_MAX_GPUS; g++) {
        uint64_t x = __atomic_exchange_n(&u->proc[slot].used[g], 0, __ATOMIC_ACQ_REL);
        __atomic_sub_fetch(&u->used[g], x, __ATOMIC_ACQ_REL);
        __atomic_store_n(&u->charged[slot][g], 0, __ATOMIC_RELEASE); /* the row's next process starts anew */
        freed += x;
    }
    __atomic_store_n(&u->proc[slot].ns_pid, 0, __ATOMIC_RELEASE); /* else the row's next process inherits it */
    __atomic_store_n(&u->proc[slot].pid, 0, __ATOMIC_RELEASE);
    return freed;
}

/* The daemon's reconciliation with the driver: what the driver holds beyond
 * the processes' charges becomes `bytes`, and the slice's total moves with
 * it (past the limit if the driver alone put it there: the next allocations
 * are refused until it is back under). Returns what it was. */
LEDGER_API uint64_t gpuslice_usage_driver_set(struct gpuslice_usage *u, uint32_t gpu, uint64_t bytes)
{
    if (gpu >= GPUSLICE_SLICE_MAX_GPUS)
        return 0;
    uint64_t was = __atomic_exchange_n(&u->gate[gpu].driver_side, bytes, __ATOMIC_ACQ_REL);
    if (bytes >= was)
        __atomic_add_fetch(&u->used[gpu], bytes - was, __ATOMIC_ACQ_REL);
    else
        __atomic_sub_fetch(&u->used[gpu], was - bytes, __ATOMIC_ACQ_REL);
    return was;
}

/* The daemon's side of a launch gate (the processes only take from it).
 * Adds `add` tokens, but never past `cap`, keeping what launches took beyond
 * the budget as debt; *before is what was left of the last period.  Returns
 * the new value. */
LEDGER_API int64_t gpuslice_gate_refill(struct gpuslice_gate *g, int64_t add, int64_t cap, uint64_t next_refill_ns,
                                        int64_t *before)
{
    int64_t cur = __atomic_load_n(&g->tokens, __ATOMIC_ACQUIRE), next;
    do {
        /* an open gate being closed starts from nothing */
        int64_t base = cur >= GPUSLICE_GATE_OPEN ? 0 : cur;
        next = base + add < cap ? base + add : cap;
    } while (!__atomic_compare_exchange_n(&g->tokens, &cur, next, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    __atomic_store_n(&g->next_refill_ns, next_refill_ns, __ATOMIC_RELEASE);
    *before = cur;
    return next;
}

/* Open the gate (no limit until the next refill); *before as above. */
LEDGER_API void gpuslice_gate_open(struct gpuslice_gate *g, uint64_t next_refill_ns, int64_t *before)
{
    *before = __atomic_exchange_n(&g->tokens, (int64_t)GPUSLICE_GATE_OPEN * 2, __ATOMIC_ACQ_REL);
    __atomic_store_n(&g->next_refill_ns, next_refill_ns, __ATOMIC_RELEASE);
}
