/* The slice ledger's atomics under contention: 8 threads charge and give back
 * at random against one limit.  The total never passes the limit, never goes
 * negative, a dead row is released exactly, and everything ends at zero; each row's
 * `charged` is the sum of its charges that fitted, and a released row's is zero.
 * Then a launch gate: 6 threads take launch costs the way the interposer does
 * while the daemon's refills and opens run; what the refills say was used
 * equals, to the thread, what the takers took.
 * Built with TSan and with ASan/UBSan (make check-sanitizers). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <string.h>

#include "gpuslice_slice.h"


#define LIMIT (64ull << 20)
static struct gpuslice_limits limits;
static struct gpuslice_usage usage;
static int over;
static uint64_t ever[8]; /* what each worker's charges that fitted came to: its row's charged[] */

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
            if (gpuslice_usage_charge(&usage, &limits, slot, 0, b) == 0) {
                held[n++] = b;
                ever[slot] += b;
            }
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

static int refilling = 1;
static int64_t taken[6];

static void *taker(void *arg)
{
    uintptr_t me = (uintptr_t)arg;
    unsigned seed = (unsigned)me + 100;
    struct gpuslice_gate *g = &usage.gate[1];
    while (__atomic_load_n(&refilling, __ATOMIC_ACQUIRE)) {
        int64_t cost = 1 + rand_r(&seed) % 5000;
        if (__atomic_fetch_sub(&g->tokens, cost, __ATOMIC_RELAXED) > 0) {
            taken[me] += cost;
        } else { /* spent: give it back, as the interposer's slow path does */
            __atomic_add_fetch(&g->tokens, cost, __ATOMIC_RELAXED);
            __atomic_add_fetch(&g->waits, 1, __ATOMIC_RELAXED);
            sched_yield();
        }
    }
    return NULL;
}

static int gate_stress(void)
{
    struct gpuslice_gate *g = &usage.gate[1];
    pthread_t t[6];
    for (uintptr_t i = 0; i < 6; i++)
        pthread_create(&t[i], NULL, taker, (void *)i);
    int64_t used = 0, last_after = 0, before;
    for (int i = 0; i < 20000; i++) {
        if (i % 1000 == 999) {
            gpuslice_gate_open(g, 0, &before);
            used += last_after - before;
            last_after = (int64_t)GPUSLICE_GATE_OPEN * 2;
        } else {
            int64_t a = gpuslice_gate_refill(g, 20000, 40000, 0, &before);
            used += last_after - before;
            last_after = a;
        }
        sched_yield();
    }
    __atomic_store_n(&refilling, 0, __ATOMIC_RELEASE);
    for (int i = 0; i < 6; i++)
        pthread_join(t[i], NULL);
    used += last_after - __atomic_load_n(&g->tokens, __ATOMIC_ACQUIRE);
    int64_t sum = 0;
    for (int i = 0; i < 6; i++)
        sum += taken[i];
    if (used != sum || sum == 0) {
        fprintf(stderr, "ledger_stress: gate used %lld, taken %lld\n", (long long)used, (long long)sum);
        return 1;
    }
    return 0;
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
    for (int i = 0; i < 8; i++)
        if (usage.charged[i][0] != ever[i] || ever[i] == 0) {
            fprintf(stderr, "ledger_stress: row %d charged %llu, its charges %llu\n", i,
                    (unsigned long long)usage.charged[i][0], (unsigned long long)ever[i]);
            return 1;
        }
    uint64_t dead = usage.proc[7].used[0];
    uint64_t freed = gpuslice_usage_release_proc(&usage, 7);
    if (usage.charged[7][0] != 0) {
        fprintf(stderr, "ledger_stress: a released row still counts %llu charged\n",
                (unsigned long long)usage.charged[7][0]);
        return 1;
    }
    if (over || freed != dead || usage.used[0] != 0) {
        fprintf(stderr, "ledger_stress: over=%d freed=%llu dead=%llu left=%llu\n", over, (unsigned long long)freed,
                (unsigned long long)dead, (unsigned long long)usage.used[0]);
        return 1;
    }
    if (gate_stress() != 0)
        return 1;
    puts("ledger_stress: ok");
    return 0;
}
