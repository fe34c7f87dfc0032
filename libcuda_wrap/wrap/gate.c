/* The launch gate (docs/compute.md): every way of starting GPU work takes its
 * cost, the threads it starts, from the slice's budget for that GPU, and
 * waits while the budget is spent.  The daemon measures what each slice
 * really ran and sets the budget every period.  Under budget a launch costs
 * one atomic subtraction on the slice's shared gate: no lock, no syscall. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "gpuslice_cuda.h"
#include "wrap.h"

#include "real.h"

#define STALE_NS 2000000000ll  /* a daemon silent this long no longer holds launches back */
#define MAX_SLEEP_NS 100000000ll
#define WAKE_AFTER_REFILL_NS 200000ll
#define LEGACY_THREADS 1024    /* cuLaunchGrid's block shape is not known here: the most */
#define MAX_GRAPH_DEPTH 8

CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st);
CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus *st);
CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *n);
CUresult cuGraphNodeGetType(CUgraphNode n, CUgraphNodeType *t);
CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode n, CUDA_KERNEL_NODE_PARAMS_v2 *p);
CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode n, CUgraph *g);
CUresult cuGraphExecUpdate(CUgraphExec e, CUgraph g, CUgraphNode *err, CUgraphExecUpdateResult *res);
CUresult cuGraphExecUpdate_v2(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info);
CUresult cuGraphExecKernelNodeSetParams(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v1 *p);
CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v2 *p);
CUresult cuGraphExecNodeSetParams(CUgraphExec e, CUgraphNode n, CUgraphNodeParams *p);
CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec e, CUgraphNode n, CUgraph child);
CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *data,
                                     size_t n, CUstreamCaptureMode mode);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps,
                                          const CUgraphEdgeData *data, size_t n, CUstreamCaptureMode mode);

static int captures; /* stream captures under way: only then is a launch asked about it */
static int warned_stale;

static inline int64_t threads_of(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz)
{
    uint64_t blocks = (uint64_t)gx * gy * gz, per = (uint64_t)bx * by * bz;
    if (blocks > (1ull << 40))
        blocks = 1ull << 40;
    if (per > (1ull << 20))
        per = 1ull << 20;
    uint64_t t = blocks * per;
    return t ? (int64_t)t : 1;
}

/* launch configs, launch params and kernel node params (v1-v3) name their
 * shape with the same fields */
#define GRID_THREADS(p) threads_of((p)->gridDimX, (p)->gridDimY, (p)->gridDimZ, (p)->blockDimX, (p)->blockDimY, \
                                   (p)->blockDimZ)

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000ll + t.tv_nsec;
}

/* The budget is spent: give back what this launch took, then sleep until the
 * daemon's next refill and take again. */
static __attribute__((noinline)) void wait_for_budget(struct gpuslice_gate *gt, int64_t cost)
{
    __atomic_add_fetch(&gt->tokens, cost, __ATOMIC_RELAXED);
    __atomic_add_fetch(&gt->waits, 1, __ATOMIC_RELAXED);
    for (;;) {
        int64_t now = now_ns(), next = (int64_t)__atomic_load_n(&gt->next_refill_ns, __ATOMIC_ACQUIRE);
        if (now - next > STALE_NS) {
            if (!__atomic_exchange_n(&warned_stale, 1, __ATOMIC_RELAXED))
                gs_log(1, "the daemon has not refilled the launch budget for %lld ms: launches pass ungated",
                       (long long)((now - next) / 1000000));
            __atomic_sub_fetch(&gt->tokens, cost, __ATOMIC_RELAXED);
            return;
        }
        int64_t until = next + WAKE_AFTER_REFILL_NS > now ? next + WAKE_AFTER_REFILL_NS : now + 1000000;
        if (until > now + MAX_SLEEP_NS)
            until = now + MAX_SLEEP_NS;
        struct timespec ts = {until / 1000000000ll, until % 1000000000ll};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
            ;
        if (__atomic_fetch_sub(&gt->tokens, cost, __ATOMIC_RELAXED) > 0)
            return;
        __atomic_add_fetch(&gt->tokens, cost, __ATOMIC_RELAXED);
    }
}

static int capturing(CUstream s, int ptds)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult r = ptds ? REAL(cuStreamIsCapturing_ptsz)(s, &st) : REAL(cuStreamIsCapturing)(s, &st);
    return r == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* The gate of the GPU this launch runs on, or NULL: not in a slice, a whole
 * GPU (never throttled), or a launch into a stream capture (it runs when
 * the graph is launched, and is charged then). */
static inline struct gpuslice_gate *gate_for(CUstream s, int ptds)
{
    if (__atomic_load_n(&gs.mode, __ATOMIC_ACQUIRE) != GS_SLICE)
        return NULL;
    const struct gpuslice_limits *l = gs.limits;
    int g = l->gpu_count == 1 ? 0 : gs_current_gpu();
    if (g < 0 || l->gpu[g].cores >= 100)
        return NULL;
    if (__builtin_expect(__atomic_load_n(&captures, __ATOMIC_RELAXED) != 0, 0) && capturing(s, ptds))
        return NULL;
    return &gs.usage->gate[g];
}

static inline void take(struct gpuslice_gate *gt, int64_t cost)
{
    if (__builtin_expect(__atomic_fetch_sub(&gt->tokens, cost, __ATOMIC_RELAXED) <= 0, 0))
        wait_for_budget(gt, cost);
}

static inline void gate(CUstream s, int ptds, int64_t cost)
{
    struct gpuslice_gate *gt = gate_for(s, ptds);
    if (gt)
        take(gt, cost);
}

/* ---- kernels ------------------------------------------------------------ */

WRAP_API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned sh, CUstream s, void **params, void **extra)
{
    gate(s, 0, threads_of(gx, gy, gz, bx, by, bz));
    return REAL(cuLaunchKernel)(f, gx, gy, gz, bx, by, bz, sh, s, params, extra);
}

WRAP_API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                      unsigned bz, unsigned sh, CUstream s, void **params, void **extra)
{
    gate(s, 1, threads_of(gx, gy, gz, bx, by, bz));
    return REAL(cuLaunchKernel_ptsz)(f, gx, gy, gz, bx, by, bz, sh, s, params, extra);
}

WRAP_API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                            unsigned by, unsigned bz, unsigned sh, CUstream s, void **params)
{
    gate(s, 0, threads_of(gx, gy, gz, bx, by, bz));
    return REAL(cuLaunchCooperativeKernel)(f, gx, gy, gz, bx, by, bz, sh, s, params);
}

WRAP_API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                                 unsigned by, unsigned bz, unsigned sh, CUstream s, void **params)
{
    gate(s, 1, threads_of(gx, gy, gz, bx, by, bz));
    return REAL(cuLaunchCooperativeKernel_ptsz)(f, gx, gy, gz, bx, by, bz, sh, s, params);
}

static inline int64_t config_threads(const CUlaunchConfig *c)
{
    return c ? GRID_THREADS(c) : 1;
}

WRAP_API CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    gate(c ? c->hStream : NULL, 0, config_threads(c));
    return REAL(cuLaunchKernelEx)(c, f, params, extra);
}

WRAP_API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    gate(c ? c->hStream : NULL, 1, config_threads(c));
    return REAL(cuLaunchKernelEx_ptsz)(c, f, params, extra);
}

WRAP_API CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS_v1 *list, unsigned n, unsigned flags)
{
    for (unsigned i = 0; list && i < n; i++)
        gate(list[i].hStream, 0, GRID_THREADS(&list[i]));
    return REAL(cuLaunchCooperativeKernelMultiDevice)(list, n, flags);
}

/* The pre-4.0 launches: the block shape was set with cuFuncSetBlockShape. */
WRAP_API CUresult cuLaunch(CUfunction f)
{
    gate(NULL, 0, LEGACY_THREADS);
    return REAL(cuLaunch)(f);
}

WRAP_API CUresult cuLaunchGrid(CUfunction f, int w, int h)
{
    gate(NULL, 0, threads_of((unsigned)w, (unsigned)h, 1, LEGACY_THREADS, 1, 1));
    return REAL(cuLaunchGrid)(f, w, h);
}

WRAP_API CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s)
{
    gate(s, 0, threads_of((unsigned)w, (unsigned)h, 1, LEGACY_THREADS, 1, 1));
    return REAL(cuLaunchGridAsync)(f, w, h, s);
}

/* ---- graphs: the cost of an executable graph is known when it is made ----- */

static int64_t graph_cost(CUgraph g, int depth);

/* A graph node's threads: a kernel's, or its child graph's; other kinds none. */
static int64_t node_cost(CUgraphNode n, int depth)
{
    CUgraphNodeType t;
    CUDA_KERNEL_NODE_PARAMS_v2 p;
    CUgraph child;
    if (REAL(cuGraphNodeGetType)(n, &t) != CUDA_SUCCESS)
        return 0;
    if (t == CU_GRAPH_NODE_TYPE_KERNEL && REAL(cuGraphKernelNodeGetParams_v2)(n, &p) == CUDA_SUCCESS)
        return GRID_THREADS(&p);
    if (t == CU_GRAPH_NODE_TYPE_GRAPH && REAL(cuGraphChildGraphNodeGetGraph)(n, &child) == CUDA_SUCCESS)
        return graph_cost(child, depth + 1);
    return 0;
}

static int64_t graph_cost(CUgraph g, int depth)
{
    size_t n = 0;
    if (depth > MAX_GRAPH_DEPTH || REAL(cuGraphGetNodes)(g, NULL, &n) != CUDA_SUCCESS || n == 0)
        return 0;
    CUgraphNode *nodes = calloc(n, sizeof *nodes);
    if (!nodes)
        return 0;
    int64_t cost = 0;
    if (REAL(cuGraphGetNodes)(g, nodes, &n) == CUDA_SUCCESS)
        for (size_t i = 0; i < n; i++)
            cost += node_cost(nodes[i], depth);
    free(nodes);
    return cost;
}

static CUresult instantiated(CUresult r, CUgraphExec *out, CUgraph g)
{
    if (r == CUDA_SUCCESS && out && *out && gs.mode == GS_SLICE) {
        int64_t cost = graph_cost(g, 0);
        struct gs_entry x = {.key = (uint64_t)(uintptr_t)*out, .bytes = (uint64_t)(cost ? cost : 1),
                             .kind = GS_KIND_GRAPH_EXEC};
        if (gs_table_put(&x) != 0)
            gs_log(0, "graph table full: this graph's launches cost one thread each");
    }
    return r;
}

WRAP_API CUresult cuGraphInstantiate(CUgraphExec *out, CUgraph g, CUgraphNode *err, char *log, size_t n)
{
    return instantiated(REAL(cuGraphInstantiate)(out, g, err, log, n), out, g);
}

WRAP_API CUresult cuGraphInstantiate_v2(CUgraphExec *out, CUgraph g, CUgraphNode *err, char *log, size_t n)
{
    return instantiated(REAL(cuGraphInstantiate_v2)(out, g, err, log, n), out, g);
}

WRAP_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *out, CUgraph g, unsigned long long flags)
{
    return instantiated(REAL(cuGraphInstantiateWithFlags)(out, g, flags), out, g);
}

WRAP_API CUresult cuGraphInstantiateWithParams(CUgraphExec *out, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
    return instantiated(REAL(cuGraphInstantiateWithParams)(out, g, p), out, g);
}

WRAP_API CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *out, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
    return instantiated(REAL(cuGraphInstantiateWithParams_ptsz)(out, g, p), out, g);
}

static void forget_overrides(CUgraphExec e);

WRAP_API CUresult cuGraphExecDestroy(CUgraphExec e)
{
    struct gs_entry x = {.kind = GS_KIND_GRAPH_EXEC};
    if (gs_table_take((uint64_t)(uintptr_t)e, &x) == 0 && x.as.overridden)
        forget_overrides(e);
    return REAL(cuGraphExecDestroy)(e);
}

static inline int64_t exec_cost(CUgraphExec e)
{
    struct gs_entry x = {.kind = GS_KIND_GRAPH_EXEC};
    return gs_table_get((uint64_t)(uintptr_t)e, &x) == 0 ? (int64_t)x.bytes : 1;
}

/* The table is read only for a gated launch. */
static inline void gate_graph(CUgraphExec e, CUstream s, int ptds)
{
    struct gpuslice_gate *gt = gate_for(s, ptds);
    if (gt)
        take(gt, exec_cost(e));
}

WRAP_API CUresult cuGraphLaunch(CUgraphExec e, CUstream s)
{
    gate_graph(e, s, 0);
    return REAL(cuGraphLaunch)(e, s);
}

WRAP_API CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s)
{
    gate_graph(e, s, 1);
    return REAL(cuGraphLaunch_ptsz)(e, s);
}

/* ---- updates: an executable graph's cost follows what it will run ---------- */

/* `overridden`: some node of e has an entry of its own; only then does e's end
 * scan the table for them. */
static void set_exec_cost(CUgraphExec e, int64_t cost, int overridden)
{
    struct gs_entry x = {.kind = GS_KIND_GRAPH_EXEC};
    gs_table_take((uint64_t)(uintptr_t)e, &x);
    x = (struct gs_entry){.key = (uint64_t)(uintptr_t)e, .bytes = (uint64_t)(cost > 0 ? cost : 1), .kind = GS_KIND_GRAPH_EXEC,
                          .as.overridden = (uint64_t)overridden};
    if (gs_table_put(&x) != 0)
        gs_log(0, "graph table full: this graph's launches cost one thread each");
}

/* A kernel node given new parameters in one exec: its threads there, kept
 * under a key of (exec, node), owned by the exec so that its end drops it. */
static uint64_t override_key(CUgraphExec e, CUgraphNode n)
{
    uint64_t k = ((uint64_t)(uintptr_t)e * 0x9e3779b97f4a7c15ull) ^ (uint64_t)(uintptr_t)n;
    return k > 2 ? k : k + 3; /* 0-2 are the table's own marks */
}

static void dropped(const struct gs_entry *x) { (void)x; }

static void forget_overrides(CUgraphExec e) { gs_table_drop_owner((uint64_t)(uintptr_t)e, dropped); }

/* The threads a node (a kernel, or a child graph) runs in exec e now: what
 * it was last set to there, else what the graph node says; -1 when nothing
 * is priced. */
static int64_t node_threads(CUgraphExec e, CUgraphNode n, const void *params)
{
    if (gs.mode != GS_SLICE || !params)
        return -1;
    struct gs_entry x = {.kind = GS_KIND_EXEC_NODE};
    if (gs_table_get(override_key(e, n), &x) == 0 && x.owner == (uint64_t)(uintptr_t)e)
        return (int64_t)x.bytes;
    return node_cost(n, 1);
}

/* After a successful set: the node's threads in e are `now` (was: before). */
static CUresult node_set(CUresult r, CUgraphExec e, CUgraphNode n, int64_t was, int64_t now)
{
    if (r != CUDA_SUCCESS || was < 0)
        return r;
    uint64_t key = override_key(e, n);
    struct gs_entry x = {.kind = GS_KIND_EXEC_NODE};
    gs_table_take(key, &x);
    x = (struct gs_entry){.key = key, .bytes = (uint64_t)now, .owner = (uint64_t)(uintptr_t)e, .kind = GS_KIND_EXEC_NODE};
    if (gs_table_put(&x) != 0)
        gs_log(0, "graph table full: an exec node's new parameters are priced against its graph's");
    set_exec_cost(e, exec_cost(e) - was + now, 1);
    return r;
}

WRAP_API CUresult cuGraphExecKernelNodeSetParams(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v1 *p)
{
    int64_t was = node_threads(e, n, p);
    return node_set(REAL(cuGraphExecKernelNodeSetParams)(e, n, p), e, n, was, p ? GRID_THREADS(p) : 0);
}

WRAP_API CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
    int64_t was = node_threads(e, n, p);
    return node_set(REAL(cuGraphExecKernelNodeSetParams_v2)(e, n, p), e, n, was, p ? GRID_THREADS(p) : 0);
}

/* The generic setter: kernel nodes are priced, other kinds cost no threads */
WRAP_API CUresult cuGraphExecNodeSetParams(CUgraphExec e, CUgraphNode n, CUgraphNodeParams *p)
{
    const CUDA_KERNEL_NODE_PARAMS_v3 *k = p && p->type == CU_GRAPH_NODE_TYPE_KERNEL ? &p->kernel : NULL;
    int64_t was = node_threads(e, n, k);
    return node_set(REAL(cuGraphExecNodeSetParams)(e, n, p), e, n, was, k ? GRID_THREADS(k) : 0);
}

WRAP_API CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec e, CUgraphNode n, CUgraph child)
{
    int64_t was = node_threads(e, n, child);
    return node_set(REAL(cuGraphExecChildGraphNodeSetParams)(e, n, child), e, n, was,
                    was >= 0 ? graph_cost(child, 1) : 0);
}

/* After an update the exec runs what the new graph holds: its cost is the
 * new graph's, and earlier per-node settings are gone. */
static CUresult updated(CUresult r, CUgraphExec e, CUgraph g)
{
    if (r == CUDA_SUCCESS && gs.mode == GS_SLICE) {
        struct gs_entry x = {.kind = GS_KIND_GRAPH_EXEC};
        if (gs_table_get((uint64_t)(uintptr_t)e, &x) == 0 && x.as.overridden)
            forget_overrides(e);
        set_exec_cost(e, graph_cost(g, 0), 0);
    }
    return r;
}

WRAP_API CUresult cuGraphExecUpdate(CUgraphExec e, CUgraph g, CUgraphNode *err, CUgraphExecUpdateResult *res)
{
    return updated(REAL(cuGraphExecUpdate)(e, g, err, res), e, g);
}

WRAP_API CUresult cuGraphExecUpdate_v2(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info)
{
    return updated(REAL(cuGraphExecUpdate_v2)(e, g, info), e, g);
}

/* ---- stream capture: counted, so launches ask only while one is under way -- */

static CUresult capture_began(CUresult r)
{
    if (r == CUDA_SUCCESS)
        __atomic_add_fetch(&captures, 1, __ATOMIC_RELAXED);
    return r;
}

static CUresult capture_ended(CUresult r)
{
    /* a capture ends with this call whether or not the graph is valid */
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED || r == CUDA_ERROR_STREAM_CAPTURE_UNJOINED) {
        int c = __atomic_load_n(&captures, __ATOMIC_RELAXED);
        while (c > 0 && !__atomic_compare_exchange_n(&captures, &c, c - 1, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            ;
    }
    return r;
}

WRAP_API CUresult cuStreamBeginCapture(CUstream s) { return capture_began(REAL(cuStreamBeginCapture)(s)); }
WRAP_API CUresult cuStreamBeginCapture_ptsz(CUstream s) { return capture_began(REAL(cuStreamBeginCapture_ptsz)(s)); }

WRAP_API CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode m)
{
    return capture_began(REAL(cuStreamBeginCapture_v2)(s, m));
}

WRAP_API CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode m)
{
    return capture_began(REAL(cuStreamBeginCapture_v2_ptsz)(s, m));
}

WRAP_API CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps,
                                              const CUgraphEdgeData *data, size_t n, CUstreamCaptureMode m)
{
    return capture_began(REAL(cuStreamBeginCaptureToGraph)(s, g, deps, data, n, m));
}

WRAP_API CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps,
                                                   const CUgraphEdgeData *data, size_t n, CUstreamCaptureMode m)
{
    return capture_began(REAL(cuStreamBeginCaptureToGraph_ptsz)(s, g, deps, data, n, m));
}

WRAP_API CUresult cuStreamEndCapture(CUstream s, CUgraph *g) { return capture_ended(REAL(cuStreamEndCapture)(s, g)); }

WRAP_API CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g)
{
    return capture_ended(REAL(cuStreamEndCapture_ptsz)(s, g));
}
