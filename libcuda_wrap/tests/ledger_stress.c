/* The slice ledger's atomics under contention: 8 threads charge and give back
 * at random against one limit.  The total never passes the limit, never goes
 * negative, a dead row is released exactly, and everything ends at zero.
 * Built with TSan and with ASan/UBSan (make check-sanitizers). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpuslice_slice.h"

int gpuslice_usage_charge(struct gpuslice_usage *u, const struct gpuslice_limits *l, uint32_t slot, uint32_t gpu,
                          uint64_t bytes);
void gpuslice_usage_uncharge(struct gpuslice_usage *u, uint32_t slot, uint32_t gpu, uint64_t bytes);
uint64_t gpuslice_usage_release_proc(struct gpuslice_usage *u, uint32_t slot);

#define LIMIT (64ull << 20)
static struct gpuslice_limits limits;
static struct gpuslice_usage usage;
static int over;

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    uint32_t slot = (uint32_t)(uintptr_t)arg;
    uint64_t held[16];
    int n = 0;
    for (int i = 0; i < 200000; i++) {
        if (n && (n == 16 || rand_r(&seed) % 2)) {
            int k = rand_r(&seed) % n;
            gpuslice_usage_uncharge(&usage, slot, 0, held[k]);
            held[k] = held[--n];
        } else {
            uint64_t b = 1 + (uint64_t)(rand_r(&seed) % (1 << 20));
            if (gpuslice_usage_charge(&usage, &limits, slot, 0, b) == 0)
                held[n++] = b;
        }
        if (__atomic_load_n(&usage.used[0], __ATOMIC_RELAXED) > LIMIT)
            __atomic_store_n(&over, 1, __ATOMIC_RELAXED);
    }
    if (slot == 7) /* this one "dies" holding memory: the daemon's release returns it */
        return NULL;
    while (n)
        gpuslice_usage_uncharge(&usage, slot, 0, held[--n]);
    gpuslice_usage_uncharge(&usage, slot, 0, 1u << 30); /* a double free cannot underflow */
    return NULL;
}

int main(void)
{
    limits.gpu_count = 1;
    limits.gpu[0].memory_limit = LIMIT;
    pthread_t t[8];
    for (uintptr_t i = 0; i < 8; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    uint64_t dead = usage.proc[7].used[0];
    uint64_t freed = gpuslice_usage_release_proc(&usage, 7);
    if (over || freed != dead || usage.used[0] != 0) {
        fprintf(stderr, "ledger_stress: over=%d freed=%llu dead=%llu left=%llu\n", over, (unsigned long long)freed,
                (unsigned long long)dead, (unsigned long long)usage.used[0]);
        return 1;
    }
    puts("ledger_stress: ok");
    return 0;
}
