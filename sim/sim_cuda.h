/* Process-local objects of the simulated CUDA driver. */
#ifndef GPUSLICE_SIM_CUDA_H
#define GPUSLICE_SIM_CUDA_H

#include <pthread.h>
#include <stdint.h>

#include "gpuslice_cuda.h"
#include "sim_state.h"

#define CUAPI SIM_API CUresult

enum sim_magic {
    MAGIC_CTX = 0x43545831,
    MAGIC_STREAM = 0x53545231,
    MAGIC_EVENT = 0x45564e31,
    MAGIC_MODULE = 0x4d4f4431,
    MAGIC_FUNC = 0x46554e31,
    MAGIC_ARRAY = 0x41525231,
    MAGIC_MIPMAP = 0x4d495031,
    MAGIC_POOL = 0x504f4f31,
    MAGIC_GRAPH = 0x47525031,
    MAGIC_NODE = 0x4e4f4431,
    MAGIC_EXEC = 0x45584531,
    MAGIC_VMM = 0x564d4d31,
    MAGIC_DEAD = 0xdeadbeef
};

struct sim_graph;

/* Where some work ends: a mark per GPU in the calling process's queues
 * (sim_schedule.c; 0: no work there). */
struct sim_point {
    uint64_t mark[SIM_MAX_GPUS];
};

struct sim_stream {
    uint32_t magic;
    struct sim_ctx *ctx;
    unsigned flags;
    int priority;
    struct sim_point ready; /* the end of its queued work */
    struct sim_graph *capture;
    uint64_t capture_id;            /* unique per capture sequence */
    CUgraphNode capture_dep;        /* what cuStreamGetCaptureInfo hands out: */
    CUgraphEdgeData capture_edge;   /* the node the next captured one follows */
    struct sim_stream *next;
};

struct sim_ctx {
    uint32_t magic;
    int dev;
    unsigned flags;
    int primary;
    uint64_t generation;      /* tells a context apart from a later one in the same (primary) shell */
    size_t lmem_per_thread;   /* the local memory the driver reserved per resident thread */
    uint64_t driver_bytes;    /* memory the driver allocated itself in it: modules, local memory */
    struct sim_stream legacy;
    struct sim_stream *streams; /* created streams, for legacy-stream sync */
    struct sim_ctx *next;
};

struct sim_event {
    uint32_t magic;
    unsigned flags;
    int recorded;
    int timed;              /* time is known */
    struct sim_point after; /* the work it waits for */
    uint64_t recorded_ns;   /* when it was recorded */
    uint64_t time;          /* when it completed: the later of the two */
};

struct sim_pool {
    uint32_t magic;
    int dev;
    uint64_t used, used_high, threshold;
    size_t max_size;
    unsigned reuse_off; /* bit (1 << attr) per CU_MEMPOOL_ATTR_REUSE_* turned off; all on by default */
};

#define SIM_MAX_PARAMS 256
struct sim_kernel_info { /* what a kernel's PTX says of it (sim_ptx.c); defaults for an opaque image */
    int regs;            /* per thread */
    int max_threads;     /* .maxntid/.reqntid: their product; 0 if neither */
    size_t shared;       /* static .shared bytes */
    size_t local;        /* .local bytes per thread */
    int n_params;        /* -1: unknown (a binary image) */
    uint32_t param_offset[SIM_MAX_PARAMS], param_size[SIM_MAX_PARAMS];
};

struct sim_func {
    uint32_t magic;
    struct sim_module *module;
    struct sim_func *next;
    int max_dynamic_shared;
    int non_portable_cluster; /* CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED */
    int carveout;             /* CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, -1: default */
    struct sim_kernel_info info;
    char name[];
};

#define SIM_MAX_GLOBALS 64
struct sim_global {          /* a .global variable a PTX image declares */
    char name[64];
    size_t size;
    CUdeviceptr ptr;          /* its device memory, made at the first cuModuleGetGlobal */
};

struct sim_module {
    uint32_t magic;
    struct sim_ctx *ctx;
    int opaque;       /* cubin/fatbin: any function name resolves */
    char *entries;    /* PTX: NUL-separated .entry names, ends with "" */
    char *ptx;        /* PTX: the text, read again for each function's attributes */
    size_t const_bytes; /* PTX: its .const variables */
    int target;       /* PTX: .target sm_NN as NN; 0 if none */
    uint64_t charged; /* its code and constants, charged to charged_ctx (0: not loaded yet) */
    struct sim_ctx *charged_ctx;
    uint64_t charged_gen;
    struct sim_func *funcs;
    int n_globals;
    struct sim_global globals[SIM_MAX_GLOBALS];
};

struct sim_kernel_launch {
    struct sim_func *func;
    unsigned grid[3], block[3];
    unsigned shmem;
};

/* A stream's end of work is read and raised from any thread. */
static inline struct sim_point sim_ready(const struct sim_stream *s)
{
    struct sim_point p;
    for (int d = 0; d < SIM_MAX_GPUS; d++)
        p.mark[d] = __atomic_load_n(&s->ready.mark[d], __ATOMIC_ACQUIRE);
    return p;
}

static inline void sim_ready_raise(struct sim_stream *s, int dev, uint64_t mark)
{
    uint64_t cur = __atomic_load_n(&s->ready.mark[dev], __ATOMIC_ACQUIRE);
    while (mark > cur &&
           !__atomic_compare_exchange_n(&s->ready.mark[dev], &cur, mark, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        ;
}

static inline void sim_point_max(struct sim_point *into, const struct sim_point *p)
{
    for (int d = 0; d < SIM_MAX_GPUS; d++)
        if (p->mark[d] > into->mark[d])
            into->mark[d] = p->mark[d];
}

/* points (sim_cuda_stream.c): done, waited for, or when done (0 if no work) */
int sim_point_done(const struct sim_point *p);
void sim_point_wait(const struct sim_point *p);
uint64_t sim_point_time(const struct sim_point *p);

/* PTX text (sim_ptx.c): the .global variables it declares, at most max; their number */
int sim_ptx_globals(const char *ptx, struct sim_global *out, int max);
size_t sim_ptx_const_bytes(const char *ptx);
int sim_ptx_target(const char *ptx);
/* the names of its kernels (.entry), NUL-separated, ending with ""; NULL if out of memory */
char *sim_ptx_entries(const char *text);
/* The kernel `name`'s parameters, directives and resources; 0 if it has no .entry */
int sim_ptx_kernel(const char *ptx, const char *name, struct sim_kernel_info *k);

/* occupancy (sim_cuda_occupancy.c): blocks of f that fit on one SM of dev */
int sim_blocks_per_sm(const struct sim_func *f, int dev, unsigned threads, size_t dynamic_shared);
int sim_func_max_threads(const struct sim_func *f);
int sim_device_max_blocks_per_sm(int dev);
/* functions (sim_cuda_module.c): a handle's function or NULL; the device a
 * module's or a function's kernels run on; a function's dynamic shared memory limit */
struct sim_func *sim_func_of(CUfunction h);
int sim_module_dev(const struct sim_module *m);
int sim_func_dev(const struct sim_func *f);
size_t sim_func_max_dynamic_shared(const struct sim_func *f);
/* memory the driver allocates itself (sim_cuda_driver_memory.c): a module
 * loaded (eager: at load; lazy, the default: at its first launch), local
 * memory grown for a launch or a stack limit and kept, a context's share
 * given back when it goes */
CUresult sim_driver_module_load(struct sim_module *m, struct sim_ctx *c);
CUresult sim_driver_before_launch(struct sim_ctx *c, struct sim_func *f);
void sim_driver_module_unload(struct sim_module *m);
CUresult sim_driver_stack_limit(struct sim_ctx *c, size_t per_thread);
void sim_driver_ctx_gone(struct sim_ctx *c);
int sim_driver_eager(void);
/* cuGetExportTable's id of the simulator's private allocation table (sim_cuda_device.c) */
#define SIM_INTERNAL_TABLE_ID "gpuslice-sim-int"
/* a module image from a file, NUL-terminated (sim_cuda_link.c) */
CUresult sim_read_image(const char *path, char **out, size_t *len);
#define SIM_SHARED_PER_SM 167936u     /* CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
#define SIM_SHARED_RESERVED 1024u     /* per block, by the driver */
#define SIM_SHARED_DEFAULT 49152u     /* per block without opting in */
#define SIM_REGS_PER_SM 65536u
/* memory (sim_cuda_memory.c), for module globals: cuMemAlloc_v2 and cuMemFree_v2 */
CUresult sim_global_alloc(CUdeviceptr *dptr, size_t size);
CUresult sim_global_free(CUdeviceptr dptr);

/* stream capture (sim_cuda_graph_exec.c): cuEventRecord on a capturing stream adds an event record node */
CUresult sim_capture_event_record(struct sim_stream *s, struct sim_event *e);
/* cuEventRecord: e completes once the work up to `after` has run (sim_cuda_stream.c) */
void sim_event_set(struct sim_event *e, struct sim_point after);

/* process state (sim_cuda_device.c, sim_cuda_context.c) */
extern pthread_mutex_t sim_mu;
extern int sim_initialized;
CUresult sim_check_init(void);
/* the PTX JIT compiler's library, loaded before PTX is compiled (sim_cuda_jit.c) */
CUresult sim_ptx_jit(void);
/* cuInit's naming of the driver's threads through /proc (sim_cuda_thread_names.c) */
CUresult sim_name_driver_threads(void);
/* Opens every API call that needs cuInit first; leaves its result in r. */
#define SIM_ENTER()                     \
    CUresult r = sim_check_init();      \
    if (r)                              \
    return r
int sim_valid_dev(CUdevice d);
#define REQUIRE_INIT()                  \
    do {                                \
        CUresult r_ = sim_check_init(); \
        if (r_)                         \
            return r_;                  \
    } while (0)
#define REQUIRE_DEV(d)                        \
    do {                                      \
        REQUIRE_INIT();                       \
        if (!sim_valid_dev(d))                \
            return CUDA_ERROR_INVALID_DEVICE; \
    } while (0)
struct sim_ctx *sim_current_ctx(void);
CUresult sim_ctx_or_error(struct sim_ctx **out);
int sim_valid_ctx(struct sim_ctx *c);
/* Resolve a stream handle: NULL/legacy/per-thread (ptds selects what 0 means). */
struct sim_stream *sim_stream_resolve(CUstream h, int ptds, CUresult *err);
struct sim_point sim_stream_after(struct sim_stream *s); /* what new work on s follows (legacy-stream semantics) */
void sim_stream_sync_legacy(struct sim_ctx *c);
void sim_ctx_free_memory(struct sim_ctx *c); /* sim_cuda_memory.c */
void sim_stream_after_fork(void);            /* sim_cuda_stream.c */
struct sim_point sim_ptds_ready(const struct sim_ctx *c); /* the end of c's per-thread streams of this thread */
int sim_stream_is_live(const struct sim_stream *s); /* sim_cuda_context.c; caller holds sim_mu */

/* memory (sim_cuda_memory.c) */
int sim_addr_is_device(uint64_t addr, size_t n);

CUresult sim_proc_lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *status);

/* kernels (sim_cuda_launch.c) */
uint64_t sim_kernel_ns(const struct sim_kernel_launch *k, int dev);

#endif
