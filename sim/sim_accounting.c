/* Per-process accounting, as drivers keep it where nvmlDeviceSetAccountingMode
 * turned it on: a record for each process that made a context on the GPU
 * while it was on, read while the process runs and, from a ring of the last
 * SIM_ACCT_RECORDS, after it ended (sim_nvml_accounting.c answers from them).
 * Both calls hold the GPU's lock. */
#include <time.h>

#include "sim_state.h"

void sim_acct_record_start(int g, int slot)
{
    struct sim_proc *p = &sim_shm->proc[slot];
    if (!sim_shm->gpu[g].accounting || p->acct_start_ns[g])
        return;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    p->acct_start_ns[g] = sim_now_ns();
    p->acct_start_us[g] = (uint64_t)now.tv_sec * 1000000ull + (uint64_t)now.tv_nsec / 1000;
}

/* The process of `slot` has ended (its end noticed now): its record is kept. */
void sim_acct_record_end(int g, int slot)
{
    const struct sim_proc *p = &sim_shm->proc[slot];
    struct sim_gpu_shared *gs = &sim_shm->gpu[g];
    if (!p->acct_start_ns[g])
        return;
    sim_gpu_advance(g, sim_now_ns()); /* what it ran until now counts */
    gs->acct[gs->acct_written % SIM_ACCT_RECORDS] = (struct sim_acct_record){
        .pid = p->pid, .pidns = p->pidns, .start_us = p->acct_start_us[g],
        .active_ns = sim_now_ns() - p->acct_start_ns[g], .busy_ns = p->queue[g].done, .max_mem = p->max_mem[g]};
    gs->acct_written++;
}
