/* Simulated driver: streams (legacy, per-thread and created) and events. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "sim_cuda.h"

static __thread struct { struct sim_ctx *ctx; struct sim_stream *s; } ptds[SIM_MAX_GPUS * 2];

void sim_stream_after_fork(void)
{
    memset(ptds, 0, sizeof ptds);
}

struct sim_point sim_ptds_ready(const struct sim_ctx *c)
{
    struct sim_point p = {0};
    for (size_t i = 0; i < sizeof ptds / sizeof ptds[0]; i++)
        if (ptds[i].ctx == c) {
            struct sim_point r = sim_ready(ptds[i].s);
            sim_point_max(&p, &r);
        }
    return p;
}

int sim_point_done(const struct sim_point *p)
{
    for (int d = 0; d < SIM_MAX_GPUS; d++)
        if (p->mark[d] && !sim_gpu_done(d, p->mark[d]))
            return 0;
    return 1;
}

void sim_point_wait(const struct sim_point *p)
{
    for (int d = 0; d < SIM_MAX_GPUS; d++)
        if (p->mark[d])
            sim_gpu_wait(d, p->mark[d]);
}

uint64_t sim_point_time(const struct sim_point *p)
{
    uint64_t t = 0;
    for (int d = 0; d < SIM_MAX_GPUS; d++)
        if (p->mark[d]) {
            uint64_t at = sim_gpu_mark_time(d, p->mark[d]);
            t = at > t ? at : t;
        }
    return t;
}

/* ---- streams --------------------------------------------------------- */

static struct sim_stream *per_thread_stream(struct sim_ctx *c)
{
    size_t free_i = sizeof ptds / sizeof ptds[0];
    for (size_t i = 0; i < sizeof ptds / sizeof ptds[0]; i++) {
        if (ptds[i].ctx == c)
            return ptds[i].s;
        if (!ptds[i].ctx && free_i == sizeof ptds / sizeof ptds[0])
            free_i = i;
    }
    if (free_i == sizeof ptds / sizeof ptds[0])
        return &c->legacy; /* table full: fall back to legacy ordering */
    struct sim_stream *s = calloc(1, sizeof *s);
    if (!s)
        return &c->legacy;
    s->magic = MAGIC_STREAM;
    s->ctx = c;
    ptds[free_i].ctx = c;
    ptds[free_i].s = s;
    return s;
}

struct sim_stream *sim_stream_resolve(CUstream h, int ptds_default, CUresult *err)
{
    struct sim_ctx *c;
    *err = CUDA_SUCCESS;
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        if ((*err = sim_ctx_or_error(&c)))
            return NULL;
        if (h == CU_STREAM_PER_THREAD || (h == NULL && ptds_default))
            return per_thread_stream(c);
        return &c->legacy;
    }
    if ((*err = sim_check_init()))
        return NULL;
    struct sim_stream *s = (struct sim_stream *)h;
    pthread_mutex_lock(&sim_mu);
    int ok = sim_stream_is_live(s);
    pthread_mutex_unlock(&sim_mu);
    if (!ok) {
        *err = CUDA_ERROR_INVALID_HANDLE;
        return NULL;
    }
    return s;
}

/* The work new work on s follows: the legacy stream waits for every
 * blocking stream and they wait for it; non-blocking streams wait for none. */
struct sim_point sim_stream_after(struct sim_stream *s)
{
    struct sim_point p = sim_ready(s);
    struct sim_ctx *c = s->ctx;
    if (s->flags & CU_STREAM_NON_BLOCKING)
        return p;
    if (s == &c->legacy) {
        pthread_mutex_lock(&sim_mu);
        for (struct sim_stream *i = c->streams; i; i = i->next)
            if (!(i->flags & CU_STREAM_NON_BLOCKING)) {
                struct sim_point r = sim_ready(i);
                sim_point_max(&p, &r);
            }
        pthread_mutex_unlock(&sim_mu);
    } else {
        struct sim_point r = sim_ready(&c->legacy);
        sim_point_max(&p, &r);
    }
    return p;
}

void sim_stream_sync_legacy(struct sim_ctx *c)
{
    struct sim_point p = sim_stream_after(&c->legacy);
    sim_point_wait(&p);
}

CUAPI cuStreamCreateWithPriority(CUstream *ph, unsigned int flags, int priority)
{
    struct sim_ctx *c;
    CUresult r = sim_ctx_or_error(&c);
    if (r)
        return r;
    if (!ph || (flags & ~CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_stream *s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->magic = MAGIC_STREAM;
    s->ctx = c;
    s->flags = flags;
    s->priority = priority < -5 ? -5 : priority > 0 ? 0 : priority;
    pthread_mutex_lock(&sim_mu);
    s->next = c->streams;
    c->streams = s;
    pthread_mutex_unlock(&sim_mu);
    *ph = (CUstream)s;
    return CUDA_SUCCESS;
}

CUAPI cuStreamCreate(CUstream *ph, unsigned int flags)
{
    return cuStreamCreateWithPriority(ph, flags, 0);
}

CUAPI cuStreamDestroy_v2(CUstream h)
{
    CUresult r;
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
        return sim_check_init() ? sim_check_init() : CUDA_ERROR_INVALID_HANDLE;
    struct sim_stream *s = sim_stream_resolve(h, 0, &r);
    if (!s)
        return r;
    pthread_mutex_lock(&sim_mu);
    for (struct sim_stream **p = &s->ctx->streams; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    pthread_mutex_unlock(&sim_mu);
    /* queued work still completes on the GPU timeline; the handle is gone */
    s->magic = MAGIC_DEAD;
    free(s);
    return CUDA_SUCCESS;
}

CUAPI cuStreamDestroy(CUstream h)
{
    return cuStreamDestroy_v2(h);
}

static CUresult stream_sync(CUstream h, int ptds_default)
{
    CUresult r;
    struct sim_stream *s = sim_stream_resolve(h, ptds_default, &r);
    if (!s)
        return r;
    if (s->capture)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    struct sim_point p = sim_stream_after(s);
    sim_point_wait(&p);
    return CUDA_SUCCESS;
}

CUAPI cuStreamSynchronize(CUstream h) { return stream_sync(h, 0); }
CUAPI cuStreamSynchronize_ptsz(CUstream h) { return stream_sync(h, 1); }

static CUresult stream_query(CUstream h, int ptds_default)
{
    CUresult r;
    struct sim_stream *s = sim_stream_resolve(h, ptds_default, &r);
    if (!s)
        return r;
    struct sim_point p = sim_stream_after(s);
    return sim_point_done(&p) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUAPI cuStreamQuery(CUstream h) { return stream_query(h, 0); }
CUAPI cuStreamQuery_ptsz(CUstream h) { return stream_query(h, 1); }

static CUresult stream_get_priority(CUstream h, int *p, int ptds_default)
{
    CUresult r;
    struct sim_stream *s = sim_stream_resolve(h, ptds_default, &r);
    if (!s)
        return r;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    *p = s->priority;
    return CUDA_SUCCESS;
}

CUAPI cuStreamGetPriority(CUstream h, int *p) { return stream_get_priority(h, p, 0); }
CUAPI cuStreamGetPriority_ptsz(CUstream h, int *p) { return stream_get_priority(h, p, 1); }

static CUresult stream_get_flags(CUstream h, unsigned *f, int ptds_default)
{
    CUresult r;
    struct sim_stream *s = sim_stream_resolve(h, ptds_default, &r);
    if (!s)
        return r;
    if (!f)
        return CUDA_ERROR_INVALID_VALUE;
    *f = s->flags;
    return CUDA_SUCCESS;
}

CUAPI cuStreamGetFlags(CUstream h, unsigned *f) { return stream_get_flags(h, f, 0); }
CUAPI cuStreamGetFlags_ptsz(CUstream h, unsigned *f) { return stream_get_flags(h, f, 1); }

static CUresult stream_get_ctx(CUstream h, CUcontext *pctx, void **green, int ptds_default)
{
    CUresult r;
    struct sim_stream *s = sim_stream_resolve(h, ptds_default, &r);
    if (!s)
        return r;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)s->ctx;
    if (green)
        *green = NULL;
    return CUDA_SUCCESS;
}

CUAPI cuStreamGetCtx(CUstream h, CUcontext *c) { return stream_get_ctx(h, c, NULL, 0); }
CUAPI cuStreamGetCtx_ptsz(CUstream h, CUcontext *c) { return stream_get_ctx(h, c, NULL, 1); }
CUAPI cuStreamGetCtx_v2(CUstream h, CUcontext *c, void **g) { return stream_get_ctx(h, c, g, 0); }
CUAPI cuStreamGetCtx_v2_ptsz(CUstream h, CUcontext *c, void **g) { return stream_get_ctx(h, c, g, 1); }

/* ---- events ---------------------------------------------------------- */

static struct sim_event *event_of(CUevent h)
{
    struct sim_event *e = (struct sim_event *)h;
    return e && e->magic == MAGIC_EVENT ? e : NULL;
}

void sim_event_set(struct sim_event *e, struct sim_point after)
{
    e->after = after;
    e->recorded_ns = sim_now_ns();
    e->timed = 0;
    e->recorded = 1;
}

/* Is it complete (or never recorded)?  Once it is, its time is fixed: the
 * later of when it was recorded and when the work before it ended. */
static int event_done(struct sim_event *e)
{
    if (!e->recorded || e->timed)
        return 1;
    if (!sim_point_done(&e->after))
        return 0;
    uint64_t t = sim_point_time(&e->after);
    e->time = t > e->recorded_ns ? t : e->recorded_ns;
    e->timed = 1;
    return 1;
}

CUAPI cuEventCreate(CUevent *ph, unsigned int flags)
{
    struct sim_ctx *c;
    CUresult r = sim_ctx_or_error(&c);
    if (r)
        return r;
    if (!ph || (flags & ~0x7u) || ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)))
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_event *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = MAGIC_EVENT;
    e->flags = flags;
    *ph = (CUevent)e;
    return CUDA_SUCCESS;
}

CUAPI cuEventDestroy_v2(CUevent h)
{
    REQUIRE_INIT();
    struct sim_event *e = event_of(h);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    e->magic = MAGIC_DEAD;
    free(e);
    return CUDA_SUCCESS;
}

CUAPI cuEventDestroy(CUevent h)
{
    return cuEventDestroy_v2(h);
}

static CUresult event_record(CUevent h, CUstream hs, int ptds_default)
{
    REQUIRE_INIT();
    struct sim_event *e = event_of(h);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r;
    struct sim_stream *s = sim_stream_resolve(hs, ptds_default, &r);
    if (!s)
        return r;
    if (s->capture) /* recorded when the graph runs, as a real driver's event record node */
        return sim_capture_event_record(s, e);
    sim_event_set(e, sim_stream_after(s));
    return CUDA_SUCCESS;
}

CUAPI cuEventRecord(CUevent h, CUstream s) { return event_record(h, s, 0); }
CUAPI cuEventRecord_ptsz(CUevent h, CUstream s) { return event_record(h, s, 1); }
CUAPI cuEventRecordWithFlags(CUevent h, CUstream s, unsigned f) { (void)f; return event_record(h, s, 0); }
CUAPI cuEventRecordWithFlags_ptsz(CUevent h, CUstream s, unsigned f) { (void)f; return event_record(h, s, 1); }

CUAPI cuEventQuery(CUevent h)
{
    REQUIRE_INIT();
    struct sim_event *e = event_of(h);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    return event_done(e) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUAPI cuEventSynchronize(CUevent h)
{
    REQUIRE_INIT();
    struct sim_event *e = event_of(h);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    if (e->recorded)
        sim_point_wait(&e->after);
    event_done(e);
    return CUDA_SUCCESS;
}

CUAPI cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    REQUIRE_INIT();
    struct sim_event *s = event_of(a), *e = event_of(b);
    if (!s || !e || !ms)
        return !ms ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
    if ((s->flags | e->flags) & CU_EVENT_DISABLE_TIMING)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!s->recorded || !e->recorded)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!event_done(s) || !event_done(e))
        return CUDA_ERROR_NOT_READY;
    *ms = (float)((double)((int64_t)(e->time - s->time)) / 1e6);
    return CUDA_SUCCESS;
}

CUAPI cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b)
{
    return cuEventElapsedTime(ms, a, b);
}

static CUresult stream_wait_event(CUstream hs, CUevent h, unsigned flags, int ptds_default)
{
    REQUIRE_INIT();
    struct sim_event *e = event_of(h);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    if (flags & ~1u)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r;
    struct sim_stream *s = sim_stream_resolve(hs, ptds_default, &r);
    if (!s)
        return r;
    if (e->recorded) /* its work is this process's own: a mark per GPU to follow */
        for (int d = 0; d < SIM_MAX_GPUS; d++)
            sim_ready_raise(s, d, e->after.mark[d]);
    return CUDA_SUCCESS;
}

CUAPI cuStreamWaitEvent(CUstream s, CUevent e, unsigned f) { return stream_wait_event(s, e, f, 0); }
CUAPI cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned f) { return stream_wait_event(s, e, f, 1); }
