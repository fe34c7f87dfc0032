/* Simulated driver: executable graphs: instantiation (child graphs
 * flattened), updates in place, and launches. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "sim_cuda.h"
#include "sim_graph.h"

static unsigned flatten(const struct sim_graph *g, const struct sim_node *top, struct sim_exec_kernel *out,
                        unsigned i, int depth)
{
    for (const struct sim_node *n = g->nodes; n; n = n->next) {
        if (n->child && depth < SIM_MAX_GRAPH_DEPTH) {
            i = flatten(n->child, top ? top : n, out, i, depth + 1);
        } else if (n->is_kernel && sim_func_of((CUfunction)n->k.func)) {
            int dev = sim_module_dev(n->k.func->module);
            if (out)
                out[i] = (struct sim_exec_kernel){n, top ? top : n, dev, sim_kernel_ns(&n->k, dev)};
            i++;
        }
    }
    return i;
}

/* The event record nodes of g (child graphs included), into out; their number. */
static unsigned flatten_events(const struct sim_graph *g, struct sim_event **out, unsigned i, int depth)
{
    for (const struct sim_node *n = g->nodes; n; n = n->next) {
        if (n->child && depth < SIM_MAX_GRAPH_DEPTH)
            i = flatten_events(n->child, out, i, depth + 1);
        else if (n->event) {
            if (out)
                out[i] = n->event;
            i++;
        }
    }
    return i;
}

/* The kernels of g into e (its times summed per GPU); their number. */
static unsigned exec_kernels(const struct sim_graph *g, struct sim_exec *e)
{
    if (!e)
        return flatten(g, NULL, NULL, 0, 0);
    unsigned n = flatten(g, NULL, e->k, 0, 0);
    for (unsigned i = 0; i < n; i++)
        e->ns_by_dev[e->k[i].dev] += e->k[i].ns;
    return n;
}

CUAPI cuGraphInstantiateWithFlags(CUgraphExec *out, CUgraph h, unsigned long long flags)
{
    SIM_ENTER();
    (void)flags;
    struct sim_graph *g = sim_graph_of(h);
    if (!out || !g)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_exec *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = MAGIC_EXEC;
    unsigned n = exec_kernels(g, NULL);
    if (n && !(e->k = calloc(n, sizeof *e->k))) {
        free(e);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    e->kernels = exec_kernels(g, e);
    e->n_events = flatten_events(g, NULL, 0, 0);
    if (e->n_events && !(e->events = calloc(e->n_events, sizeof *e->events))) {
        free(e->k);
        free(e);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    flatten_events(g, e->events, 0, 0);
    *out = (CUgraphExec)e;
    return CUDA_SUCCESS;
}

CUAPI cuGraphInstantiate(CUgraphExec *out, CUgraph h, CUgraphNode *err_node, char *log, size_t log_size)
{
    if (err_node)
        *err_node = NULL;
    if (log && log_size)
        log[0] = 0;
    return cuGraphInstantiateWithFlags(out, h, 0);
}

CUAPI cuGraphInstantiate_v2(CUgraphExec *out, CUgraph h, CUgraphNode *err_node, char *log, size_t log_size)
{
    return cuGraphInstantiate(out, h, err_node, log, log_size);
}

static struct sim_exec *exec_of(CUgraphExec h)
{
    struct sim_exec *e = (struct sim_exec *)h;
    return e && e->magic == MAGIC_EXEC ? e : NULL;
}

CUAPI cuGraphExecDestroy(CUgraphExec h)
{
    SIM_ENTER();
    struct sim_exec *e = exec_of(h);
    if (!e)
        return CUDA_ERROR_INVALID_VALUE;
    e->magic = MAGIC_DEAD;
    free(e->k);
    free(e->events);
    free(e);
    return CUDA_SUCCESS;
}

/* ---- updating an executable graph in place ----------------------------- */

static void exec_set(struct sim_exec *e, struct sim_exec_kernel *x, const struct sim_kernel_launch *k, int dev)
{
    e->ns_by_dev[x->dev] -= x->ns;
    x->dev = dev;
    x->ns = sim_kernel_ns(k, dev);
    e->ns_by_dev[dev] += x->ns;
}

static CUresult exec_kernel_set(CUgraphExec h, CUgraphNode node, const struct sim_kernel_launch *k)
{
    SIM_ENTER();
    struct sim_exec *e = exec_of(h);
    if (!e || !node)
        return CUDA_ERROR_INVALID_VALUE;
    const struct sim_func *f = sim_func_of((CUfunction)k->func);
    if (!f)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_mu);
    struct sim_exec_kernel *x = NULL;
    for (unsigned i = 0; i < e->kernels && !x; i++)
        if (e->k[i].node == (const struct sim_node *)node)
            x = &e->k[i];
    /* the function may change, but not its context (CUDA says so too) */
    if (x && sim_module_dev(f->module) == x->dev && (r = sim_launch_validate(k, 0, x->dev)) == CUDA_SUCCESS)
        exec_set(e, x, k, x->dev);
    else if (!x || r == CUDA_SUCCESS)
        r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&sim_mu);
    return r;
}

CUAPI cuGraphExecKernelNodeSetParams(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v1 *p)
{
    if (!p)
        return sim_check_init() ? sim_check_init() : CUDA_ERROR_INVALID_VALUE;
    struct sim_kernel_launch k = NODE_KL(p->func, p);
    return exec_kernel_set(e, n, &k);
}

CUAPI cuGraphExecKernelNodeSetParams_v2(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
    if (!p)
        return sim_check_init() ? sim_check_init() : CUDA_ERROR_INVALID_VALUE;
    struct sim_kernel_launch k = NODE_KL_V2(p);
    return exec_kernel_set(e, n, &k);
}

CUAPI cuGraphExecNodeSetParams(CUgraphExec e, CUgraphNode n, CUgraphNodeParams *p)
{
    if (!p || p->type != CU_GRAPH_NODE_TYPE_KERNEL) /* kernels are the only nodes with parameters here */
        return sim_check_init() ? sim_check_init() : CUDA_ERROR_INVALID_VALUE;
    struct sim_kernel_launch k = NODE_KL_V2(&p->kernel);
    return exec_kernel_set(e, n, &k);
}

/* Kernels [from, from + count) of e take g's kernels' parameters when g has
 * as many, on the same GPUs, in order; otherwise nothing changes and info
 * says why.  Under sim_mu. */
static CUresult exec_replace(struct sim_exec *e, unsigned from, unsigned count, const struct sim_graph *g,
                             CUgraphExecUpdateResultInfo *info)
{
    unsigned n = flatten(g, NULL, NULL, 0, 0);
    struct sim_exec_kernel *k = n ? calloc(n, sizeof *k) : NULL;
    if (n && !k)
        return CUDA_ERROR_OUT_OF_MEMORY;
    flatten(g, NULL, k, 0, 0);
    if (n != count)
        info->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
    for (unsigned i = 0; i < n && info->result == CU_GRAPH_EXEC_UPDATE_SUCCESS; i++)
        if (k[i].dev != e->k[from + i].dev) {
            info->result = CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE;
            info->errorNode = (CUgraphNode)k[i].node;
        }
    for (unsigned i = 0; i < n && info->result == CU_GRAPH_EXEC_UPDATE_SUCCESS; i++)
        exec_set(e, &e->k[from + i], &k[i].node->k, k[i].dev);
    free(k);
    return info->result == CU_GRAPH_EXEC_UPDATE_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
}

/* A child graph node's kernels in e take those of `child` (same shape). */
CUAPI cuGraphExecChildGraphNodeSetParams(CUgraphExec h, CUgraphNode node, CUgraph child)
{
    SIM_ENTER();
    struct sim_exec *e = exec_of(h);
    struct sim_graph *g = sim_graph_of(child);
    struct sim_node *n = sim_node_of(node);
    if (!e || !g || !n || !n->child)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_mu);
    unsigned from = 0, count = 0;
    while (from < e->kernels && e->k[from].top != n)
        from++;
    while (from + count < e->kernels && e->k[from + count].top == n)
        count++;
    CUgraphExecUpdateResultInfo info = {CU_GRAPH_EXEC_UPDATE_SUCCESS, NULL, NULL};
    r = exec_replace(e, from, count, g, &info);
    pthread_mutex_unlock(&sim_mu);
    return r == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE ? CUDA_ERROR_INVALID_VALUE : r;
}

/* The exec takes the new graph's kernel parameters when the graphs have the
 * same kernels on the same GPUs, in the same order; otherwise nothing changes
 * and the result says why, as cuGraphExecUpdate does. */
static CUresult exec_update(CUgraphExec h, CUgraph hg, CUgraphExecUpdateResultInfo *info)
{
    SIM_ENTER();
    struct sim_exec *e = exec_of(h);
    struct sim_graph *g = sim_graph_of(hg);
    if (!e || !g || !info)
        return CUDA_ERROR_INVALID_VALUE;
    *info = (CUgraphExecUpdateResultInfo){CU_GRAPH_EXEC_UPDATE_SUCCESS, NULL, NULL};
    pthread_mutex_lock(&sim_mu);
    r = exec_replace(e, 0, e->kernels, g, info);
    pthread_mutex_unlock(&sim_mu);
    return r;
}

CUAPI cuGraphExecUpdate(CUgraphExec e, CUgraph g, CUgraphNode *error_node, CUgraphExecUpdateResult *result)
{
    CUgraphExecUpdateResultInfo info;
    CUresult r = exec_update(e, g, &info);
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) {
        if (error_node)
            *error_node = info.errorNode;
        if (result)
            *result = info.result;
    }
    return r;
}

CUAPI cuGraphExecUpdate_v2(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info)
{
    return exec_update(e, g, info);
}

static CUresult graph_launch(CUgraphExec h, CUstream hs, int ptds)
{
    SIM_ENTER();
    struct sim_exec *e = exec_of(h);
    if (!e)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_stream *s = sim_stream_resolve(hs, ptds, &r);
    if (!s)
        return r;
    if (s->capture)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    struct sim_point after = sim_stream_after(s);
    for (int d = 0; d < SIM_MAX_GPUS; d++)
        if (e->ns_by_dev[d])
            sim_run_after(s, d, e->ns_by_dev[d], &after);
    struct sim_point done = sim_stream_after(s);
    for (unsigned i = 0; i < e->n_events; i++)
        sim_event_set(e->events[i], done);
    return CUDA_SUCCESS;
}

CUresult sim_capture_event_record(struct sim_stream *s, struct sim_event *e)
{
    struct sim_node *n;
    CUresult r = sim_graph_add(s->capture, NULL, &n);
    if (r == CUDA_SUCCESS)
        n->event = e;
    return r;
}

CUAPI cuGraphLaunch(CUgraphExec e, CUstream s) { return graph_launch(e, s, 0); }
CUAPI cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) { return graph_launch(e, s, 1); }
