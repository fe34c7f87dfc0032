/* Graphs as the simulator's graph files (graph, graph_exec, capture, launch)
 * share them. */
#ifndef GPUSLICE_SIM_GRAPH_H
#define GPUSLICE_SIM_GRAPH_H

#include "sim_cuda.h"

struct sim_node {
    uint32_t magic;
    struct sim_graph *graph;
    int is_kernel;
    struct sim_kernel_launch k;
    struct sim_graph *child; /* a child graph node: its own copy of the graph it was given */
    struct sim_event *event; /* an event record node: recorded when the graph has run */
    struct sim_node *next;
};

#define SIM_MAX_GRAPH_DEPTH 8

struct sim_graph {
    uint32_t magic;
    struct sim_node *nodes, **tail;
};

/* What an executable graph runs: its kernels in order (child graphs
 * flattened), each remembered by the graph node it came from (how
 * cuGraphExecKernelNodeSetParams names it) and by the top-level node that
 * holds it (how cuGraphExecChildGraphNodeSetParams does). */
struct sim_exec_kernel {
    const struct sim_node *node, *top;
    int dev;
    uint64_t ns;
};

struct sim_exec {
    uint32_t magic;
    uint64_t ns_by_dev[SIM_MAX_GPUS];
    unsigned kernels;
    struct sim_exec_kernel *k;
    unsigned n_events;
    struct sim_event **events; /* recorded at the end of each launch (nodes run in order) */
};

#define KL(f, gx, gy, gz, bx, by, bz, sh) \
    (struct sim_kernel_launch){(struct sim_func *)(f), {gx, gy, gz}, {bx, by, bz}, sh}
/* kernel node parameters (v1, v2, v3: the same leading fields) */
#define NODE_KL(f, p) \
    KL(f, (p)->gridDimX, (p)->gridDimY, (p)->gridDimZ, (p)->blockDimX, (p)->blockDimY, (p)->blockDimZ, \
       (p)->sharedMemBytes)
/* v2 and later name the kernel by function or by library kernel */
#define NODE_KL_V2(p) NODE_KL((p)->func ? (p)->func : (CUfunction)(p)->kern, p)

struct sim_graph *sim_graph_of(CUgraph h);       /* NULL if not a live graph */
struct sim_graph *sim_graph_new(void);
void sim_graph_free(struct sim_graph *g);
struct sim_graph *sim_graph_clone(const struct sim_graph *g, int depth);
struct sim_node *sim_node_of(CUgraphNode h);
/* a node after the graph's others: a kernel launch, or empty when k is NULL */
CUresult sim_graph_add(struct sim_graph *g, const struct sim_kernel_launch *k, struct sim_node **out);
CUresult sim_launch_validate(const struct sim_kernel_launch *k, int cooperative, int dev);
void sim_run_on_stream(struct sim_stream *s, uint64_t ns); /* ns of work after what the stream waits for */
void sim_run_after(struct sim_stream *s, int dev, uint64_t ns, const struct sim_point *after); /* ... on dev, after `after` */

#endif
