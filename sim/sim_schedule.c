/* Simulated driver: the GPU's scheduler.  Each process queues its work in
 * its own queue (its context's channel); the GPU runs the queues that have
 * work in turn, one time slice each, and a queue that runs dry hands the
 * GPU on at once: time slicing between contexts, as a GPU without MPS does.
 * Nothing runs eagerly: whoever touches a GPU's state (a launch, a wait, a
 * utilisation read) first runs its schedule up to now, which is exact
 * because what ran depends only on what was queued before.
 *
 * A process names its work by marks: the running count of ns it has queued
 * on a GPU.  Work up to a mark is done once the queue's `done` reaches it. */
#define _GNU_SOURCE
#include <string.h>

#include "sim_state.h"

#define PREDICT_STEPS 100000 /* a wait re-checks at least this often (in slices run ahead) */

static void add_busy(struct sim_proc *p, int g, uint64_t start, uint64_t end)
{
    while (start < end) {
        uint64_t b = start / SIM_BUCKET_NS;
        uint64_t b_end = (b + 1) * SIM_BUCKET_NS;
        uint64_t chunk = (end < b_end ? end : b_end) - start;
        struct sim_bucket *k = &p->util[g][b % SIM_NBUCKETS];
        if (k->epoch != b) {
            k->epoch = b;
            k->busy_ns = 0;
        }
        k->busy_ns += chunk;
        start += chunk;
    }
}

static uint64_t pending_of(int slot, int g)
{
    const struct sim_proc *p = &sim_shm->proc[slot];
    if (!__atomic_load_n(&p->live, __ATOMIC_ACQUIRE))
        return 0;
    return p->queue[g].submitted - p->queue[g].done;
}

/* The next slot after `from` (round robin) whose queue has work; -1: none. */
static int next_queue(int g, int from, const uint64_t *pending)
{
    for (int k = 1; k <= SIM_MAX_PROCS; k++) {
        int i = (from + k + SIM_MAX_PROCS) % SIM_MAX_PROCS;
        if (pending ? pending[i] : pending_of(i, g))
            return i;
    }
    return -1;
}

static void ran(struct sim_proc *p, int g, uint64_t t, uint64_t len)
{
    struct sim_queue *q = &p->queue[g];
    struct sim_seg *last = &q->seg[(q->segs + SIM_NSEGS - 1) % SIM_NSEGS];
    if (q->segs && last->t + last->len == t && last->done + last->len == q->done) {
        last->len += len;
    } else {
        q->seg[q->segs % SIM_NSEGS] = (struct sim_seg){.t = t, .done = q->done, .len = len};
        q->segs++;
    }
    q->done += len;
    add_busy(p, g, t, t + len);
}

void sim_gpu_advance(int g, uint64_t now)
{
    struct sim_gpu_shared *gs = &sim_shm->gpu[g];
    uint64_t slice = sim_shm->machine.gpu[g].timeslice_ns;
    uint64_t t = gs->sched_t ? gs->sched_t : now;
    while (t < now) {
        int cur = gs->running;
        if (cur < 0 || gs->slice_left == 0 || !pending_of(cur, g)) {
            cur = next_queue(g, cur < 0 ? SIM_MAX_PROCS - 1 : cur, NULL);
            gs->running = cur;
            gs->slice_left = slice;
            if (cur < 0) { /* idle until now */
                t = now;
                break;
            }
        }
        uint64_t run = pending_of(cur, g);
        if (run > gs->slice_left)
            run = gs->slice_left;
        if (run > now - t)
            run = now - t;
        ran(&sim_shm->proc[cur], g, t, run);
        gs->slice_left -= run;
        t += run;
    }
    if (t > gs->sched_t)
        gs->sched_t = t;
}

uint64_t sim_gpu_submit(int g, uint64_t ns, uint64_t *pending)
{
    int slot = sim_register_self();
    *pending = 0;
    if (slot < 0) /* no slot: the work is not modelled */
        return 0;
    sim_gpu_lock(g);
    sim_gpu_advance(g, sim_now_ns());
    struct sim_queue *q = &sim_shm->proc[slot].queue[g];
    q->submitted += ns;
    sim_shm->proc[slot].busy_total[g] += ns;
    uint64_t mark = q->submitted;
    *pending = q->submitted - q->done;
    sim_gpu_unlock(g);
    return mark;
}

/* Caller holds the GPU lock, the schedule run up to now.  A mark beyond what
 * the queue holds was made by another process (a fork's parent): done. */
static int done_locked(int g, int slot, uint64_t mark)
{
    const struct sim_queue *q = &sim_shm->proc[slot].queue[g];
    return mark <= q->done || mark > q->submitted;
}

int sim_gpu_done(int g, uint64_t mark)
{
    int slot = sim_self_slot();
    if (!mark || slot < 0)
        return 1;
    sim_gpu_lock(g);
    sim_gpu_advance(g, sim_now_ns());
    int done = done_locked(g, slot, mark);
    sim_gpu_unlock(g);
    return done;
}

/* When the queue of `slot` reaches `mark` if nothing more is queued: the
 * schedule run ahead on a copy (a later launch of another process can only
 * make it later). */
static uint64_t predict(int g, int slot, uint64_t mark)
{
    const struct sim_gpu_shared *gs = &sim_shm->gpu[g];
    uint64_t slice = sim_shm->machine.gpu[g].timeslice_ns;
    uint64_t pending[SIM_MAX_PROCS];
    for (int i = 0; i < SIM_MAX_PROCS; i++)
        pending[i] = pending_of(i, g);
    uint64_t need = mark - sim_shm->proc[slot].queue[g].done, t = gs->sched_t, left = gs->slice_left;
    int cur = gs->running;
    for (int step = 0; step < PREDICT_STEPS; step++) {
        if (cur < 0 || left == 0 || !pending[cur]) {
            cur = next_queue(g, cur < 0 ? SIM_MAX_PROCS - 1 : cur, pending);
            left = slice;
            if (cur < 0)
                break;
        }
        uint64_t run = pending[cur] < left ? pending[cur] : left;
        if (cur == slot && run >= need)
            return t + need;
        if (cur == slot)
            need -= run;
        pending[cur] -= run;
        left -= run;
        t += run;
    }
    return t;
}

void sim_gpu_wait(int g, uint64_t mark)
{
    int slot = sim_self_slot();
    if (!mark || slot < 0)
        return;
    for (;;) {
        sim_gpu_lock(g);
        sim_gpu_advance(g, sim_now_ns());
        if (done_locked(g, slot, mark)) {
            sim_gpu_unlock(g);
            return;
        }
        uint64_t until = predict(g, slot, mark);
        sim_gpu_unlock(g);
        sim_sleep_until(until);
    }
}

uint64_t sim_gpu_mark_time(int g, uint64_t mark)
{
    int slot = sim_self_slot();
    uint64_t now = sim_now_ns();
    if (!mark || slot < 0)
        return now;
    sim_gpu_lock(g);
    sim_gpu_advance(g, now);
    const struct sim_queue *q = &sim_shm->proc[slot].queue[g];
    uint64_t t = now, kept = q->segs < SIM_NSEGS ? q->segs : SIM_NSEGS;
    for (uint64_t k = 1; k <= kept; k++) {
        const struct sim_seg *s = &q->seg[(q->segs - k) % SIM_NSEGS];
        if (mark > s->done + s->len)
            break;
        /* older than what is kept: the oldest stretch's start, the nearest known */
        t = mark > s->done ? s->t + (mark - s->done) : s->t;
    }
    sim_gpu_unlock(g);
    return t;
}
