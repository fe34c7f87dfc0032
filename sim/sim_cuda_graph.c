/* Simulated driver: graphs and their nodes (kernel, empty, child graph,
 * event record). Nodes run in the order they were added. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "sim_cuda.h"
#include "sim_graph.h"

/* ---- graphs ---------------------------------------------------------- */

struct sim_graph *sim_graph_of(CUgraph h)
{
    struct sim_graph *g = (struct sim_graph *)h;
    return g && g->magic == MAGIC_GRAPH ? g : NULL;
}

struct sim_graph *sim_graph_new(void)
{
    struct sim_graph *g = calloc(1, sizeof *g);
    if (g) {
        g->magic = MAGIC_GRAPH;
        g->tail = &g->nodes;
    }
    return g;
}

CUAPI cuGraphCreate(CUgraph *out, unsigned int flags)
{
    SIM_ENTER();
    if (!out || flags)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_graph *g = sim_graph_new();
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = (CUgraph)g;
    return CUDA_SUCCESS;
}

void sim_graph_free(struct sim_graph *g)
{
    for (struct sim_node *n = g->nodes, *nx; n; n = nx) {
        nx = n->next;
        if (n->child)
            sim_graph_free(n->child);
        n->magic = MAGIC_DEAD;
        free(n);
    }
    g->magic = MAGIC_DEAD;
    free(g);
}

CUAPI cuGraphDestroy(CUgraph h)
{
    SIM_ENTER();
    struct sim_graph *g = sim_graph_of(h);
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    sim_graph_free(g);
    return CUDA_SUCCESS;
}

/* A copy of g (child graph nodes hold copies, as CUDA's do); NULL when out of
 * memory or nested too deep. */
struct sim_graph *sim_graph_clone(const struct sim_graph *g, int depth)
{
    struct sim_graph *c = depth < SIM_MAX_GRAPH_DEPTH ? sim_graph_new() : NULL;
    for (const struct sim_node *n = g->nodes; c && n; n = n->next) {
        struct sim_node *copy = NULL;
        if (sim_graph_add(c, n->is_kernel ? &n->k : NULL, &copy) != CUDA_SUCCESS) {
            sim_graph_free(c);
            return NULL;
        }
        copy->event = n->event;
        if (n->child && !(copy->child = sim_graph_clone(n->child, depth + 1))) {
            sim_graph_free(c);
            return NULL;
        }
    }
    return c;
}

static CUresult add_node(CUgraphNode *out, CUgraph h, const CUgraphNode *deps, size_t ndeps,
                         const struct sim_kernel_launch *k)
{
    SIM_ENTER();
    struct sim_graph *g = sim_graph_of(h);
    if (!out || !g || (ndeps && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < ndeps; i++) {
        struct sim_node *d = (struct sim_node *)deps[i];
        if (!d || d->magic != MAGIC_NODE || d->graph != g)
            return CUDA_ERROR_INVALID_VALUE;
    }
    if (k && !sim_func_of((CUfunction)k->func))
        return CUDA_ERROR_INVALID_VALUE;
    return sim_graph_add(g, k, (struct sim_node **)out);
}

CUAPI cuGraphAddEmptyNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n)
{
    return add_node(out, g, deps, n, NULL);
}

CUAPI cuGraphAddChildGraphNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, CUgraph child)
{
    struct sim_graph *src = sim_graph_of(child);
    if (!src)
        return sim_check_init() ? sim_check_init() : CUDA_ERROR_INVALID_VALUE;
    struct sim_graph *copy = sim_graph_clone(src, 1);
    if (!copy)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUgraphNode node = NULL;
    CUresult r = add_node(&node, g, deps, n, NULL);
    if (r != CUDA_SUCCESS) {
        sim_graph_free(copy);
        return r;
    }
    ((struct sim_node *)node)->child = copy;
    if (out)
        *out = node;
    return CUDA_SUCCESS;
}

CUAPI cuGraphAddKernelNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                           const CUDA_KERNEL_NODE_PARAMS_v1 *p)
{
    if (!p)
        return sim_check_init() ? sim_check_init() : CUDA_ERROR_INVALID_VALUE;
    struct sim_kernel_launch k = NODE_KL(p->func, p);
    return add_node(out, g, deps, n, &k);
}

CUAPI cuGraphAddKernelNode_v2(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                              const CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
    if (!p)
        return sim_check_init() ? sim_check_init() : CUDA_ERROR_INVALID_VALUE;
    struct sim_kernel_launch k = NODE_KL_V2(p);
    return add_node(out, g, deps, n, &k);
}

/* The generic form (CUDA 12.2): the node kinds the simulator has; others
 * (copies, sets, host, memory, conditional) are not modelled. Edge data only
 * orders, like any dependency here. */
CUAPI cuGraphAddNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, CUgraphNodeParams *p)
{
    if (!p)
        return sim_check_init() ? sim_check_init() : CUDA_ERROR_INVALID_VALUE;
    switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
        const CUDA_KERNEL_NODE_PARAMS_v3 *kp = &p->kernel;
        struct sim_kernel_launch k = NODE_KL_V2(kp);
        return add_node(out, g, deps, n, &k);
    }
    case CU_GRAPH_NODE_TYPE_EMPTY: return add_node(out, g, deps, n, NULL);
    case CU_GRAPH_NODE_TYPE_GRAPH: return cuGraphAddChildGraphNode(out, g, deps, n, p->graph.graph);
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD: {
        struct sim_event *e = (struct sim_event *)p->eventRecord.event;
        if (!e || e->magic != MAGIC_EVENT)
            return sim_check_init() ? sim_check_init() : CUDA_ERROR_INVALID_HANDLE;
        CUresult r = add_node(out, g, deps, n, NULL);
        if (r == CUDA_SUCCESS)
            ((struct sim_node *)*out)->event = e;
        return r;
    }
    default: return sim_check_init() ? sim_check_init() : CUDA_ERROR_NOT_SUPPORTED;
    }
}

CUAPI cuGraphAddNode_v2(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *edges,
                        size_t n, CUgraphNodeParams *p)
{
    (void)edges;
    return cuGraphAddNode(out, g, deps, n, p);
}

CUAPI cuGraphGetNodes(CUgraph h, CUgraphNode *nodes, size_t *count)
{
    SIM_ENTER();
    struct sim_graph *g = sim_graph_of(h);
    if (!g || !count)
        return CUDA_ERROR_INVALID_VALUE;
    size_t n = 0, cap = *count;
    pthread_mutex_lock(&sim_mu);
    for (struct sim_node *x = g->nodes; x; x = x->next, n++)
        if (nodes && n < cap)
            nodes[n] = (CUgraphNode)x;
    pthread_mutex_unlock(&sim_mu);
    if (nodes) {
        for (size_t i = n; i < cap; i++)
            nodes[i] = NULL;
        *count = n < cap ? n : cap;
    } else {
        *count = n;
    }
    return CUDA_SUCCESS;
}

struct sim_node *sim_node_of(CUgraphNode h)
{
    struct sim_node *n = (struct sim_node *)h;
    return n && n->magic == MAGIC_NODE ? n : NULL;
}

CUAPI cuGraphNodeGetType(CUgraphNode h, CUgraphNodeType *type)
{
    SIM_ENTER();
    struct sim_node *n = sim_node_of(h);
    if (!n || !type)
        return CUDA_ERROR_INVALID_VALUE;
    *type = n->is_kernel ? CU_GRAPH_NODE_TYPE_KERNEL
            : n->child   ? CU_GRAPH_NODE_TYPE_GRAPH
            : n->event   ? CU_GRAPH_NODE_TYPE_EVENT_RECORD
                         : CU_GRAPH_NODE_TYPE_EMPTY;
    return CUDA_SUCCESS;
}

CUAPI cuGraphChildGraphNodeGetGraph(CUgraphNode h, CUgraph *out)
{
    SIM_ENTER();
    struct sim_node *n = sim_node_of(h);
    if (!n || !n->child || !out)
        return CUDA_ERROR_INVALID_VALUE;
    *out = (CUgraph)n->child;
    return CUDA_SUCCESS;
}

static CUresult kernel_node(CUgraphNode h, CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
    SIM_ENTER();
    struct sim_node *n = sim_node_of(h);
    if (!n || !p)
        return CUDA_ERROR_INVALID_VALUE;
    if (!n->is_kernel)
        return CUDA_ERROR_INVALID_VALUE;
    const struct sim_kernel_launch *k = &n->k;
    *p = (CUDA_KERNEL_NODE_PARAMS_v2){.func = (CUfunction)k->func, .gridDimX = k->grid[0], .gridDimY = k->grid[1],
                                      .gridDimZ = k->grid[2], .blockDimX = k->block[0], .blockDimY = k->block[1],
                                      .blockDimZ = k->block[2], .sharedMemBytes = k->shmem};
    return CUDA_SUCCESS;
}

CUAPI cuGraphKernelNodeGetParams(CUgraphNode h, CUDA_KERNEL_NODE_PARAMS_v1 *p)
{
    CUDA_KERNEL_NODE_PARAMS_v2 v2;
    CUresult r = kernel_node(h, p ? &v2 : NULL);
    if (r == CUDA_SUCCESS)
        memcpy(p, &v2, sizeof *p); /* v1 is v2's leading fields */
    return r;
}

CUAPI cuGraphKernelNodeGetParams_v2(CUgraphNode h, CUDA_KERNEL_NODE_PARAMS_v2 *p) { return kernel_node(h, p); }

/* The kernels of g in order, child graphs flattened, into out[i...] (when
 * given); returns the index after the last.  Nodes run one after another:
 * dependencies only constrain order. */
