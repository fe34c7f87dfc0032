/* Simulated driver: launches. A kernel runs for waves x wave_time, where a
 * wave is as many blocks as all SMs hold at once (sim_cuda_occupancy.c), so
 * run time follows the grid the program launches. Each process's launches
 * queue in its own queue, which the GPU's scheduler runs in turn with the
 * others' (sim_schedule.c). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "sim_cuda.h"
#include "sim_graph.h"

#define QUEUE_AHEAD_NS 50000000ull /* a process's launches block past 50 ms of its own queued work */

/* ---- launches -------------------------------------------------------- */

uint64_t sim_kernel_ns(const struct sim_kernel_launch *k, int dev)
{
    const struct sim_gpu_info *g = &sim_machine()->gpu[dev];
    uint64_t blocks = (uint64_t)k->grid[0] * k->grid[1] * k->grid[2];
    int fit = sim_blocks_per_sm(k->func, dev, k->block[0] * k->block[1] * k->block[2], k->shmem);
    uint64_t per_wave = (uint64_t)g->sms * (uint64_t)(fit > 0 ? fit : 1);
    uint64_t waves = (blocks + per_wave - 1) / per_wave;
    return waves * g->wave_ns;
}

CUresult sim_launch_validate(const struct sim_kernel_launch *k, int cooperative, int dev)
{
    if (!sim_func_of((CUfunction)k->func))
        return CUDA_ERROR_INVALID_HANDLE;
    const unsigned *g = k->grid, *b = k->block;
    if (!g[0] || !g[1] || !g[2] || !b[0] || !b[1] || !b[2] || g[0] > 2147483647u || g[1] > 65535 || g[2] > 65535 ||
        b[0] > 1024 || b[1] > 1024 || b[2] > 64)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t threads = (uint64_t)b[0] * b[1] * b[2];
    if (threads > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    if (k->shmem > sim_func_max_dynamic_shared(k->func))
        return CUDA_ERROR_INVALID_VALUE;
    if (threads > (uint64_t)sim_func_max_threads(k->func)) /* its registers or launch bounds */
        return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
    if (cooperative) {
        const struct sim_gpu_info *gi = &sim_machine()->gpu[dev];
        uint64_t fits = (uint64_t)gi->sms * (uint64_t)sim_blocks_per_sm(k->func, dev, (unsigned)threads, k->shmem);
        if ((uint64_t)g[0] * g[1] * g[2] > fits)
            return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    }
    return CUDA_SUCCESS;
}

CUresult sim_graph_add(struct sim_graph *g, const struct sim_kernel_launch *k, struct sim_node **out)
{
    struct sim_node *n = calloc(1, sizeof *n);
    if (!n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    n->magic = MAGIC_NODE;
    n->graph = g;
    if (k) {
        n->is_kernel = 1;
        n->k = *k;
    }
    pthread_mutex_lock(&sim_mu);
    *g->tail = n;
    g->tail = &n->next;
    pthread_mutex_unlock(&sim_mu);
    if (out)
        *out = n;
    return CUDA_SUCCESS;
}

/* Put `ns` of work on the stream's GPU after what the stream waits for. */
void sim_run_on_stream(struct sim_stream *s, uint64_t ns)
{
    struct sim_point after = sim_stream_after(s);
    sim_run_after(s, s->ctx->dev, ns, &after);
}

void sim_run_after(struct sim_stream *s, int dev, uint64_t ns, const struct sim_point *after)
{
    /* the process's own queue on dev keeps its order; work it waits for on
     * another GPU is waited for here, by the CPU (a model's shortcut) */
    for (int d = 0; d < SIM_MAX_GPUS; d++)
        if (d != dev && after->mark[d])
            sim_gpu_wait(d, after->mark[d]);
    uint64_t pending, mark = sim_gpu_submit(dev, ns, &pending);
    sim_ready_raise(s, dev, mark);
    if (pending > QUEUE_AHEAD_NS) /* a full launch queue makes the CPU wait */
        sim_gpu_wait(dev, mark - QUEUE_AHEAD_NS);
}

static CUresult launch(const struct sim_kernel_launch *k, CUstream hs, int cooperative, int ptds)
{
    SIM_ENTER();
    struct sim_stream *s = sim_stream_resolve(hs, ptds, &r);
    if (!s)
        return r;
    if ((r = sim_launch_validate(k, cooperative, s->ctx->dev)))
        return r;
    if (s->capture)
        return sim_graph_add(s->capture, k, NULL);
    if ((r = sim_driver_before_launch(s->ctx, k->func)))
        return r; /* its module or its local memory did not fit */
    sim_run_on_stream(s, sim_kernel_ns(k, s->ctx->dev));
    return CUDA_SUCCESS;
}

CUAPI cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                     unsigned sh, CUstream s, void **params, void **extra)
{
    (void)params, (void)extra;
    struct sim_kernel_launch k = KL(f, gx, gy, gz, bx, by, bz, sh);
    return launch(&k, s, 0, 0);
}

CUAPI cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          unsigned sh, CUstream s, void **params, void **extra)
{
    (void)params, (void)extra;
    struct sim_kernel_launch k = KL(f, gx, gy, gz, bx, by, bz, sh);
    return launch(&k, s, 0, 1);
}

CUAPI cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                unsigned bz, unsigned sh, CUstream s, void **params)
{
    (void)params;
    struct sim_kernel_launch k = KL(f, gx, gy, gz, bx, by, bz, sh);
    return launch(&k, s, 1, 0);
}

CUAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                     unsigned bz, unsigned sh, CUstream s, void **params)
{
    (void)params;
    struct sim_kernel_launch k = KL(f, gx, gy, gz, bx, by, bz, sh);
    return launch(&k, s, 1, 1);
}

static CUresult launch_ex(const CUlaunchConfig *c, CUfunction f, int ptds)
{
    SIM_ENTER();
    if (!c || (c->numAttrs && !c->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    int coop = 0;
    for (unsigned i = 0; i < c->numAttrs; i++)
        if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE)
            coop = c->attrs[i].value.cooperative != 0;
    struct sim_kernel_launch k = KL(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY,
                                    c->blockDimZ, c->sharedMemBytes);
    return launch(&k, c->hStream, coop, ptds);
}

CUAPI cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    (void)params, (void)extra;
    return launch_ex(c, f, 0);
}

CUAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    (void)params, (void)extra;
    return launch_ex(c, f, 1);
}

/* Host functions run on the calling thread once the stream reaches them. */
static CUresult host_func(CUstream hs, CUhostFn fn, void *data, int ptds)
{
    SIM_ENTER();
    struct sim_stream *s = sim_stream_resolve(hs, ptds, &r);
    if (!s)
        return r;
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    if (s->capture)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    struct sim_point after = sim_stream_after(s);
    sim_point_wait(&after);
    fn(data);
    return CUDA_SUCCESS;
}

CUAPI cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data) { return host_func(s, fn, data, 0); }
CUAPI cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *data) { return host_func(s, fn, data, 1); }

/* ---- simulator only: the calling process's exact GPU time ------------- */

/* GPU time (ns) the calling process's work occupied on device `dev` in
 * [from_ns, to_ns) of CLOCK_MONOTONIC, whole 10 ms buckets of the last 2.5 s:
 * the ground truth that load tools and share tests measure against. */
SIM_API unsigned long long gpusliceSimBusyNs(int dev, unsigned long long from_ns, unsigned long long to_ns)
{
    int slot = sim_self_slot();
    if (slot < 0 || dev < 0 || dev >= sim_machine()->gpu_count)
        return 0;
    return sim_busy_between(dev, slot, from_ns, to_ns);
}
