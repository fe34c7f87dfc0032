/* Simulated driver: contexts (created and primary), the per-thread context
 * stack, and limits. CUDA state does not survive fork. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim_cuda.h"

static struct sim_ctx *ctx_list;
/* A device's primary context keeps its handle for the life of the process,
 * as the driver's does: reset or the last release frees what it holds and
 * leaves the object inactive (out of ctx_list, so invalid), and the next
 * retain brings the same handle back, which a thread may still have current.
 * primary_mu makes retain and drop whole, since creating one takes sim_mu. */
static pthread_mutex_t primary_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sim_ctx *primary[SIM_MAX_GPUS];       /* active */
static struct sim_ctx *primary_shell[SIM_MAX_GPUS]; /* the handle, once made */
static int primary_refs[SIM_MAX_GPUS];
static unsigned primary_flags[SIM_MAX_GPUS];

#define CTX_STACK 32
static __thread struct sim_ctx *ctx_stack[CTX_STACK];
static __thread int ctx_depth;

static void after_fork_child(void)
{
    /* CUDA state does not survive fork: the child starts uninitialised. */
    pthread_mutex_init(&sim_mu, NULL);
    pthread_mutex_init(&primary_mu, NULL);
    sim_initialized = 0;
    ctx_list = NULL;
    memset(primary, 0, sizeof primary);
    memset(primary_shell, 0, sizeof primary_shell);
    memset(primary_refs, 0, sizeof primary_refs);
    ctx_depth = 0;
    sim_stream_after_fork();
    sim_reset_after_fork();
}

__attribute__((constructor)) static void sim_cuda_ctor(void)
{
    pthread_atfork(NULL, NULL, after_fork_child);
}

/* ---- contexts -------------------------------------------------------- */

/* A stream some live context created; the caller holds sim_mu. */
int sim_stream_is_live(const struct sim_stream *s)
{
    for (struct sim_ctx *i = ctx_list; i; i = i->next)
        for (struct sim_stream *j = i->streams; j; j = j->next)
            if (j == s)
                return 1;
    return 0;
}

int sim_valid_ctx(struct sim_ctx *c)
{
    if (!c)
        return 0;
    for (struct sim_ctx *i = ctx_list; i; i = i->next)
        if (i == c)
            return c->magic == MAGIC_CTX;
    return 0;
}

struct sim_ctx *sim_current_ctx(void)
{
    return ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : NULL;
}

CUresult sim_ctx_or_error(struct sim_ctx **out)
{
    REQUIRE_INIT();
    struct sim_ctx *c = sim_current_ctx();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&sim_mu);
    int ok = sim_valid_ctx(c);
    pthread_mutex_unlock(&sim_mu);
    if (!ok)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = c;
    return CUDA_SUCCESS;
}

static CUresult ctx_new(CUdevice dev, unsigned flags, int is_primary, struct sim_ctx **out)
{
    uint64_t cmem = sim_machine()->gpu[dev].context_memory;
    if (sim_register_self() < 0) {
        sim_log("more than %d processes use the simulated GPUs", SIM_MAX_PROCS);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (cmem && sim_mem_charge(dev, cmem))
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim_ctx *c = is_primary && primary_shell[dev] ? primary_shell[dev] : calloc(1, sizeof *c);
    if (!c) {
        if (cmem)
            sim_mem_uncharge(dev, cmem);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memset(c, 0, sizeof *c);
    if (is_primary)
        primary_shell[dev] = c;
    static uint64_t generations;
    c->magic = MAGIC_CTX;
    c->generation = __atomic_add_fetch(&generations, 1, __ATOMIC_RELAXED);
    c->dev = dev;
    c->flags = flags;
    c->primary = is_primary;
    c->legacy.magic = MAGIC_STREAM;
    c->legacy.ctx = c;
    sim_context_count(dev, +1);
    pthread_mutex_lock(&sim_mu);
    c->next = ctx_list;
    ctx_list = c;
    pthread_mutex_unlock(&sim_mu);
    *out = c;
    return CUDA_SUCCESS;
}

static void ctx_destroy(struct sim_ctx *c)
{
    sim_ctx_free_memory(c);
    pthread_mutex_lock(&sim_mu);
    for (struct sim_ctx **p = &ctx_list; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    for (struct sim_stream *s = c->streams, *n; s; s = n) {
        n = s->next;
        s->magic = MAGIC_DEAD;
        free(s);
    }
    c->streams = NULL;
    pthread_mutex_unlock(&sim_mu);
    uint64_t cmem = sim_machine()->gpu[c->dev].context_memory;
    if (cmem)
        sim_mem_uncharge(c->dev, cmem);
    sim_driver_ctx_gone(c);
    sim_context_count(c->dev, -1);
    if (c->primary)
        return; /* the handle stays, inactive: a current slot may still name it */
    for (int i = 0; i < ctx_depth; i++)
        if (ctx_stack[i] == c)
            ctx_stack[i] = NULL; /* other threads find out via sim_valid_ctx */
    c->magic = MAGIC_DEAD;
    free(c);
}

CUAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    REQUIRE_DEV(dev);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (ctx_depth >= CTX_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim_ctx *c;
    CUresult r = ctx_new(dev, flags, 0, &c);
    if (r)
        return r;
    ctx_stack[ctx_depth++] = c;
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

CUAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return cuCtxCreate_v2(pctx, flags, dev);
}

CUAPI cuCtxCreate_v3(CUcontext *pctx, void *params, int n, unsigned int flags, CUdevice dev)
{
    if (n > 0 || params)
        return CUDA_ERROR_NOT_SUPPORTED; /* execution affinity needs MPS */
    return cuCtxCreate_v2(pctx, flags, dev);
}

CUAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev)
{
    if (params && (params->execAffinityParams || params->numExecAffinityParams || params->cigParams))
        return CUDA_ERROR_NOT_SUPPORTED;
    return cuCtxCreate_v2(pctx, flags, dev);
}

CUAPI cuCtxDestroy_v2(CUcontext ctx)
{
    REQUIRE_INIT();
    struct sim_ctx *c = (struct sim_ctx *)ctx;
    pthread_mutex_lock(&sim_mu);
    int ok = sim_valid_ctx(c) && !c->primary;
    pthread_mutex_unlock(&sim_mu);
    if (!ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    int top = ctx_depth > 0 && ctx_stack[ctx_depth - 1] == c;
    ctx_destroy(c);
    if (top)
        ctx_depth--;
    return CUDA_SUCCESS;
}

CUAPI cuCtxDestroy(CUcontext ctx)
{
    return cuCtxDestroy_v2(ctx);
}

CUAPI cuCtxPushCurrent_v2(CUcontext ctx)
{
    REQUIRE_INIT();
    pthread_mutex_lock(&sim_mu);
    int ok = sim_valid_ctx((struct sim_ctx *)ctx);
    pthread_mutex_unlock(&sim_mu);
    if (!ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth >= CTX_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = (struct sim_ctx *)ctx;
    return CUDA_SUCCESS;
}

CUAPI cuCtxPushCurrent(CUcontext ctx)
{
    return cuCtxPushCurrent_v2(ctx);
}

CUAPI cuCtxPopCurrent_v2(CUcontext *pctx)
{
    REQUIRE_INIT();
    if (ctx_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct sim_ctx *c = ctx_stack[--ctx_depth];
    if (pctx)
        *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

CUAPI cuCtxPopCurrent(CUcontext *pctx)
{
    return cuCtxPopCurrent_v2(pctx);
}

CUAPI cuCtxSetCurrent(CUcontext ctx)
{
    REQUIRE_INIT();
    if (!ctx) {
        if (ctx_depth > 0)
            ctx_depth--;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&sim_mu);
    int ok = sim_valid_ctx((struct sim_ctx *)ctx);
    pthread_mutex_unlock(&sim_mu);
    if (!ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 0)
        ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = (struct sim_ctx *)ctx;
    return CUDA_SUCCESS;
}

CUAPI cuCtxGetCurrent(CUcontext *pctx)
{
    REQUIRE_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)sim_current_ctx();
    return CUDA_SUCCESS;
}

static CUresult ctx_arg(CUcontext ctx, struct sim_ctx **out)
{
    if (!ctx)
        return sim_ctx_or_error(out);
    REQUIRE_INIT();
    pthread_mutex_lock(&sim_mu);
    int ok = sim_valid_ctx((struct sim_ctx *)ctx);
    pthread_mutex_unlock(&sim_mu);
    if (!ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = (struct sim_ctx *)ctx;
    return CUDA_SUCCESS;
}

CUAPI cuCtxGetDevice_v2(CUdevice *dev, CUcontext ctx)
{
    struct sim_ctx *c;
    CUresult r = ctx_arg(ctx, &c);
    if (r)
        return r;
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    *dev = c->dev;
    return CUDA_SUCCESS;
}

CUAPI cuCtxGetDevice(CUdevice *dev)
{
    return cuCtxGetDevice_v2(dev, NULL);
}

static struct sim_point ctx_ready(struct sim_ctx *c)
{
    pthread_mutex_lock(&sim_mu);
    struct sim_point p = sim_ready(&c->legacy);
    for (struct sim_stream *s = c->streams; s; s = s->next) {
        struct sim_point r = sim_ready(s);
        sim_point_max(&p, &r);
    }
    pthread_mutex_unlock(&sim_mu);
    struct sim_point own = sim_ptds_ready(c);
    sim_point_max(&p, &own);
    return p;
}

CUAPI cuCtxSynchronize_v2(CUcontext ctx)
{
    struct sim_ctx *c;
    CUresult r = ctx_arg(ctx, &c);
    if (r)
        return r;
    struct sim_point p = ctx_ready(c);
    sim_point_wait(&p);
    return CUDA_SUCCESS;
}

CUAPI cuCtxSynchronize(void)
{
    return cuCtxSynchronize_v2(NULL);
}

CUAPI cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    struct sim_ctx *c;
    CUresult r = ctx_arg(ctx, &c);
    if (r)
        return r;
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = 3020;
    return CUDA_SUCCESS;
}

CUAPI cuCtxGetFlags(unsigned int *flags)
{
    struct sim_ctx *c;
    CUresult r = sim_ctx_or_error(&c);
    if (r)
        return r;
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = c->flags;
    return CUDA_SUCCESS;
}

CUAPI cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    REQUIRE_INIT();
    if (least)
        *least = 0;
    if (greatest)
        *greatest = -5;
    return CUDA_SUCCESS;
}

static size_t limits[8] = {1024, 1048576, 8388608, 2, 2048, 0, 0, 0};

CUAPI cuCtxGetLimit(size_t *value, int limit)
{
    struct sim_ctx *c;
    CUresult r = sim_ctx_or_error(&c);
    if (r)
        return r;
    if (!value || limit < 0 || limit >= 8)
        return CUDA_ERROR_INVALID_VALUE;
    *value = limits[limit];
    return CUDA_SUCCESS;
}

CUAPI cuCtxSetLimit(int limit, size_t value)
{
    struct sim_ctx *c;
    CUresult r = sim_ctx_or_error(&c);
    if (r)
        return r;
    if (limit < 0 || limit >= 8)
        return CUDA_ERROR_INVALID_VALUE;
    if (limit == 0 /* CU_LIMIT_STACK_SIZE */ && (r = sim_driver_stack_limit(c, value)))
        return r; /* the local memory for every resident thread did not fit */
    limits[limit] = value;
    return CUDA_SUCCESS;
}

/* ---- primary contexts ------------------------------------------------ */

CUAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    REQUIRE_DEV(dev);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&primary_mu);
    CUresult r = CUDA_SUCCESS;
    if (!primary[dev])
        r = ctx_new(dev, primary_flags[dev], 1, &primary[dev]);
    if (r == CUDA_SUCCESS) {
        primary_refs[dev]++;
        *pctx = (CUcontext)primary[dev];
    }
    pthread_mutex_unlock(&primary_mu);
    return r;
}

static CUresult primary_drop(CUdevice dev, int reset)
{
    REQUIRE_DEV(dev);
    pthread_mutex_lock(&primary_mu);
    struct sim_ctx *c = primary[dev];
    if (!c || (!reset && primary_refs[dev] == 0)) {
        pthread_mutex_unlock(&primary_mu);
        return reset ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    }
    if (reset || --primary_refs[dev] == 0) {
        primary[dev] = NULL;
        primary_refs[dev] = 0;
        ctx_destroy(c);
    }
    pthread_mutex_unlock(&primary_mu);
    return CUDA_SUCCESS;
}

CUAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return primary_drop(dev, 0); }
CUAPI cuDevicePrimaryCtxRelease(CUdevice dev) { return primary_drop(dev, 0); }
CUAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) { return primary_drop(dev, 1); }
CUAPI cuDevicePrimaryCtxReset(CUdevice dev) { return primary_drop(dev, 1); }

CUAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    REQUIRE_DEV(dev);
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&primary_mu);
    *flags = primary_flags[dev];
    *active = primary[dev] != NULL;
    pthread_mutex_unlock(&primary_mu);
    return CUDA_SUCCESS;
}

CUAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    REQUIRE_DEV(dev);
    primary_flags[dev] = flags;
    return CUDA_SUCCESS;
}

CUAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
    return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}
