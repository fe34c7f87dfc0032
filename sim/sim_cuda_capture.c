/* Simulated driver: stream capture into a graph, and what a capture has so far. */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "sim_cuda.h"
#include "sim_graph.h"

/* ---- stream capture -------------------------------------------------- */

static uint64_t capture_ids;

static CUresult begin_capture(CUstream hs, int mode, int ptds)
{
    SIM_ENTER();
    struct sim_stream *s = sim_stream_resolve(hs, ptds, &r);
    if (!s)
        return r;
    if (mode < 0 || mode > 2)
        return CUDA_ERROR_INVALID_VALUE;
    if (s == &s->ctx->legacy)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (s->capture)
        return CUDA_ERROR_ILLEGAL_STATE;
    s->capture = sim_graph_new();
    s->capture_id = __atomic_add_fetch(&capture_ids, 1, __ATOMIC_RELAXED);
    return s->capture ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* Capture into an existing graph: its new nodes follow the ones it has (the
 * simulator runs nodes in order, so dependencies add nothing). */
static CUresult begin_capture_to_graph(CUstream hs, CUgraph hg, int mode, int ptds)
{
    SIM_ENTER();
    struct sim_stream *s = sim_stream_resolve(hs, ptds, &r);
    if (!s)
        return r;
    struct sim_graph *g = sim_graph_of(hg);
    if (!g || mode < 0 || mode > 2)
        return CUDA_ERROR_INVALID_VALUE;
    if (s == &s->ctx->legacy)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (s->capture)
        return CUDA_ERROR_ILLEGAL_STATE;
    s->capture = g;
    s->capture_id = __atomic_add_fetch(&capture_ids, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

CUAPI cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *data,
                                  size_t n, CUstreamCaptureMode mode)
{
    (void)deps, (void)data, (void)n;
    return begin_capture_to_graph(s, g, (int)mode, 0);
}

CUAPI cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *data,
                                       size_t n, CUstreamCaptureMode mode)
{
    (void)deps, (void)data, (void)n;
    return begin_capture_to_graph(s, g, (int)mode, 1);
}

CUAPI cuStreamBeginCapture(CUstream s) { return begin_capture(s, 0, 0); }
CUAPI cuStreamBeginCapture_ptsz(CUstream s) { return begin_capture(s, 0, 1); }
CUAPI cuStreamBeginCapture_v2(CUstream s, int mode) { return begin_capture(s, mode, 0); }
CUAPI cuStreamBeginCapture_v2_ptsz(CUstream s, int mode) { return begin_capture(s, mode, 1); }

static CUresult end_capture(CUstream hs, CUgraph *out, int ptds)
{
    SIM_ENTER();
    struct sim_stream *s = sim_stream_resolve(hs, ptds, &r);
    if (!s)
        return r;
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (!s->capture)
        return CUDA_ERROR_ILLEGAL_STATE;
    *out = (CUgraph)s->capture;
    s->capture = NULL;
    return CUDA_SUCCESS;
}

CUAPI cuStreamEndCapture(CUstream s, CUgraph *g) { return end_capture(s, g, 0); }
CUAPI cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) { return end_capture(s, g, 1); }

static CUresult is_capturing(CUstream hs, CUstreamCaptureStatus *st, int ptds)
{
    SIM_ENTER();
    struct sim_stream *s = sim_stream_resolve(hs, ptds, &r);
    if (!s)
        return r;
    if (!st)
        return CUDA_ERROR_INVALID_VALUE;
    *st = s->capture ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

CUAPI cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st) { return is_capturing(s, st, 0); }
CUAPI cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus *st) { return is_capturing(s, st, 1); }

/* The capture's id and graph, and what the next captured node will follow:
 * the graph's last node (nodes run in order in this model), or none yet. */
static CUresult capture_info(CUstream hs, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *graph,
                             const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *n, int ptds)
{
    SIM_ENTER();
    struct sim_stream *s = sim_stream_resolve(hs, ptds, &r);
    if (!s)
        return r;
    if (!st || (edges && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    *st = s->capture ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    if (!s->capture)
        return CUDA_SUCCESS; /* the other outputs are set only while capturing */
    pthread_mutex_lock(&sim_mu);
    struct sim_graph *g = s->capture;
    struct sim_node *last = g->tail == &g->nodes ? NULL
                            : (struct sim_node *)((char *)g->tail - offsetof(struct sim_node, next));
    pthread_mutex_unlock(&sim_mu);
    s->capture_dep = (CUgraphNode)last;
    s->capture_edge = (CUgraphEdgeData){0};
    if (id)
        *id = s->capture_id;
    if (graph)
        *graph = (CUgraph)g;
    if (deps)
        *deps = last ? &s->capture_dep : NULL;
    if (edges)
        *edges = last ? &s->capture_edge : NULL;
    if (n)
        *n = last ? 1 : 0;
    return CUDA_SUCCESS;
}

CUAPI cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id)
{
    return capture_info(s, st, id, NULL, NULL, NULL, NULL, 0);
}

CUAPI cuStreamGetCaptureInfo_ptsz(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id)
{
    return capture_info(s, st, id, NULL, NULL, NULL, NULL, 1);
}

CUAPI cuStreamGetCaptureInfo_v2(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                const CUgraphNode **deps, size_t *n)
{
    return capture_info(s, st, id, g, deps, NULL, n, 0);
}

CUAPI cuStreamGetCaptureInfo_v2_ptsz(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                     const CUgraphNode **deps, size_t *n)
{
    return capture_info(s, st, id, g, deps, NULL, n, 1);
}

CUAPI cuStreamGetCaptureInfo_v3(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *n)
{
    return capture_info(s, st, id, g, deps, edges, n, 0);
}

CUAPI cuStreamGetCaptureInfo_v3_ptsz(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                     const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *n)
{
    return capture_info(s, st, id, g, deps, edges, n, 1);
}
