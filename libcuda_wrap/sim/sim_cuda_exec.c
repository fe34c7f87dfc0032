/* Simulated driver: modules, kernels, launches, graphs and stream capture.
 *
 * A kernel runs for waves x wave_time, where a wave is as many blocks as all
 * SMs hold at once (occupancy from the block size), so run time follows the
 * grid the program launches.  Launches from every process queue on one
 * timeline per GPU (time slicing, as without MPS). */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_cuda.h"

#define QUEUE_AHEAD_NS 50000000ull /* launches block past 50 ms of queued work */

/* ---- modules --------------------------------------------------------- */

static int is_ptx(const char *img)
{
    return img[0] != 0x7f && ((const unsigned char *)img)[0] != 0x50;
}

/* NUL-separated list of ".entry NAME" names in PTX text, "" terminated. */
static char *ptx_entries(const char *text)
{
    size_t cap = 64, len = 0;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    for (const char *p = strstr(text, ".entry"); p; p = strstr(p + 6, ".entry")) {
        const char *q = p + 6;
        while (*q == ' ' || *q == '\t')
            q++;
        size_t n = strcspn(q, " \t\r\n(");
        if (n == 0)
            continue;
        if (len + n + 2 > cap) {
            cap = (len + n + 2) * 2;
            char *nout = realloc(out, cap);
            if (!nout) {
                free(out);
                return NULL;
            }
            out = nout;
        }
        memcpy(out + len, q, n);
        len += n;
        out[len++] = 0;
    }
    out[len] = 0;
    return out;
}

/* The device a module's functions run on: its context's; for a library loaded
 * with no context current (context-independent loading), the current one's. */
static int module_dev(const struct sim_module *m)
{
    struct sim_ctx *c = m->ctx ? m->ctx : sim_current_ctx();
    return c ? c->dev : 0;
}

/* need_ctx: modules belong to the current context; libraries need none */
static CUresult module_new(const void *image, struct sim_module **out, int need_ctx)
{
    struct sim_ctx *c = NULL;
    CUresult r = need_ctx ? sim_ctx_or_error(&c) : sim_check_init();
    if (r)
        return r;
    if (!image)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_module *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->magic = MAGIC_MODULE;
    m->ctx = c;
    const char *img = image;
    if (is_ptx(img)) {
        m->n_globals = sim_ptx_globals(img, m->globals, SIM_MAX_GLOBALS);
        m->const_bytes = sim_ptx_const_bytes(img);
        m->target = sim_ptx_target(img);
    }
    if (is_ptx(img) && strstr(img, ".entry")) {
        m->entries = ptx_entries(img);
        m->ptx = strdup(img);
        if (!m->entries || !m->ptx) {
            free(m->entries);
            free(m->ptx);
            free(m);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else {
        m->opaque = 1; /* cubin, fatbin or anything else: names are not checked */
    }
    *out = m;
    return CUDA_SUCCESS;
}

CUAPI cuModuleLoadData(CUmodule *mod, const void *image)
{
    if (!mod)
        return sim_check_init() ? sim_check_init() : CUDA_ERROR_INVALID_VALUE;
    struct sim_module *m;
    CUresult r = module_new(image, &m, 1);
    if (r == CUDA_SUCCESS)
        *mod = (CUmodule)m;
    return r;
}

CUAPI cuModuleLoadDataEx(CUmodule *mod, const void *image, unsigned n, void *opts, void **vals)
{
    (void)n, (void)opts, (void)vals;
    return cuModuleLoadData(mod, image);
}

CUAPI cuModuleLoadFatBinary(CUmodule *mod, const void *fatbin)
{
    return cuModuleLoadData(mod, fatbin);
}

CUAPI cuModuleLoad(CUmodule *mod, const char *fname)
{
    SIM_ENTER();
    if (!mod || !fname)
        return CUDA_ERROR_INVALID_VALUE;
    char *buf;
    size_t len;
    if ((r = sim_read_image(fname, &buf, &len)))
        return r;
    r = cuModuleLoadData(mod, buf);
    free(buf);
    return r;
}

static struct sim_module *module_of(CUmodule h)
{
    struct sim_module *m = (struct sim_module *)h;
    return m && m->magic == MAGIC_MODULE ? m : NULL;
}

CUAPI cuModuleUnload(CUmodule h)
{
    SIM_ENTER();
    struct sim_module *m = module_of(h);
    if (!m)
        return CUDA_ERROR_INVALID_HANDLE;
    for (struct sim_func *f = m->funcs, *n; f; f = n) {
        n = f->next;
        f->magic = MAGIC_DEAD;
        free(f);
    }
    for (int i = 0; i < m->n_globals; i++)
        if (m->globals[i].ptr)
            sim_global_free(m->globals[i].ptr);
    free(m->entries);
    free(m->ptx);
    m->magic = MAGIC_DEAD;
    free(m);
    return CUDA_SUCCESS;
}

static int has_entry(const struct sim_module *m, const char *name)
{
    if (m->opaque)
        return 1;
    for (const char *e = m->entries; *e; e += strlen(e) + 1)
        if (strcmp(e, name) == 0)
            return 1;
    return 0;
}

/* A kernel's attributes: from its PTX; for a binary image, a kernel of 32
 * registers and no static shared or local memory whose parameters are unknown. */
static void kernel_info(const struct sim_module *m, const char *name, struct sim_kernel_info *k)
{
    if (m->ptx && sim_ptx_kernel(m->ptx, name, k))
        return;
    *k = (struct sim_kernel_info){.regs = 32, .n_params = -1};
}

/* The module's function `name`, made at its first lookup; NULL if out of memory. */
static struct sim_func *func_get(struct sim_module *m, const char *name)
{
    pthread_mutex_lock(&sim_mu);
    struct sim_func *f = m->funcs;
    while (f && strcmp(f->name, name) != 0)
        f = f->next;
    if (!f && (f = calloc(1, sizeof *f + strlen(name) + 1))) {
        f->magic = MAGIC_FUNC;
        f->module = m;
        f->carveout = -1;
        strcpy(f->name, name);
        kernel_info(m, name, &f->info);
        f->next = m->funcs;
        m->funcs = f;
    }
    pthread_mutex_unlock(&sim_mu);
    return f;
}

CUAPI cuModuleGetFunction(CUfunction *out, CUmodule h, const char *name)
{
    SIM_ENTER();
    struct sim_module *m = module_of(h);
    if (!m)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!out || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!has_entry(m, name))
        return CUDA_ERROR_NOT_FOUND;
    struct sim_func *f = func_get(m, name);
    if (!f)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = (CUfunction)f;
    return CUDA_SUCCESS;
}

/* A PTX module's kernels, in the order its text declares them; a binary's are unknown. */
CUAPI cuModuleGetFunctionCount(unsigned *count, CUmodule h)
{
    SIM_ENTER();
    struct sim_module *m = module_of(h);
    if (!m)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    if (m->opaque)
        return CUDA_ERROR_NOT_SUPPORTED;
    unsigned n = 0;
    for (const char *e = m->entries; *e; e += strlen(e) + 1)
        n++;
    *count = n;
    return CUDA_SUCCESS;
}

CUAPI cuModuleEnumerateFunctions(CUfunction *out, unsigned n, CUmodule h)
{
    SIM_ENTER();
    struct sim_module *m = module_of(h);
    if (!m)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (m->opaque)
        return CUDA_ERROR_NOT_SUPPORTED;
    unsigned i = 0;
    for (const char *e = m->entries; *e && i < n; e += strlen(e) + 1, i++)
        if (!(out[i] = (CUfunction)func_get(m, e)))
            return CUDA_ERROR_OUT_OF_MEMORY;
    return CUDA_SUCCESS;
}

/* A global's device memory, made when it is first asked for (a driver makes
 * it at load: the difference shows only in when the memory is counted). */
CUAPI cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule h, const char *name)
{
    SIM_ENTER();
    struct sim_module *m = module_of(h);
    if (!m)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_global *g = NULL;
    for (int i = 0; i < m->n_globals && !g; i++)
        if (strcmp(m->globals[i].name, name) == 0)
            g = &m->globals[i];
    if (!g)
        return CUDA_ERROR_NOT_FOUND;
    if (!g->ptr && (r = sim_global_alloc(&g->ptr, g->size)) != CUDA_SUCCESS)
        return r;
    if (dptr)
        *dptr = g->ptr;
    if (bytes)
        *bytes = g->size;
    return CUDA_SUCCESS;
}

/* The library API (CUDA 12) maps onto modules: a CUkernel is a CUfunction. */
CUAPI cuLibraryLoadData(CUlibrary *lib, const void *code, void *jo, void **jv, unsigned nj, void *lo, void **lv,
                        unsigned nl)
{
    (void)jo, (void)jv, (void)nj, (void)lo, (void)lv, (void)nl;
    if (!lib)
        return sim_check_init() ? sim_check_init() : CUDA_ERROR_INVALID_VALUE;
    struct sim_module *m;
    CUresult r = module_new(code, &m, 0); /* context-independent: no current context needed */
    if (r == CUDA_SUCCESS)
        *lib = (CUlibrary)m;
    return r;
}

CUAPI cuLibraryLoadFromFile(CUlibrary *lib, const char *path, void *jo, void **jv, unsigned nj, void *lo,
                            void **lv, unsigned nl)
{
    SIM_ENTER();
    if (!lib || !path)
        return CUDA_ERROR_INVALID_VALUE;
    char *buf;
    size_t len;
    if ((r = sim_read_image(path, &buf, &len)))
        return r;
    r = cuLibraryLoadData(lib, buf, jo, jv, nj, lo, lv, nl);
    free(buf);
    return r;
}

CUAPI cuLibraryUnload(CUlibrary lib)
{
    return cuModuleUnload((CUmodule)lib);
}

CUAPI cuLibraryGetKernel(CUkernel *k, CUlibrary lib, const char *name)
{
    return cuModuleGetFunction((CUfunction *)k, (CUmodule)lib, name);
}

CUAPI cuLibraryGetKernelCount(unsigned *count, CUlibrary lib)
{
    return cuModuleGetFunctionCount(count, (CUmodule)lib);
}

CUAPI cuLibraryEnumerateKernels(CUkernel *out, unsigned n, CUlibrary lib)
{
    return cuModuleEnumerateFunctions((CUfunction *)out, n, (CUmodule)lib);
}

CUAPI cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary lib, const char *name)
{
    return cuModuleGetGlobal_v2(dptr, bytes, (CUmodule)lib, name);
}

CUAPI cuLibraryGetModule(CUmodule *mod, CUlibrary lib)
{
    SIM_ENTER();
    if (!mod)
        return CUDA_ERROR_INVALID_VALUE;
    if (!module_of((CUmodule)lib))
        return CUDA_ERROR_INVALID_HANDLE;
    *mod = (CUmodule)lib;
    return CUDA_SUCCESS;
}

static struct sim_func *func_of(CUfunction h)
{
    struct sim_func *f = (struct sim_func *)h;
    return f && f->magic == MAGIC_FUNC ? f : NULL;
}

CUAPI cuKernelGetFunction(CUfunction *f, CUkernel k)
{
    SIM_ENTER();
    if (!f)
        return CUDA_ERROR_INVALID_VALUE;
    if (!func_of((CUfunction)k))
        return CUDA_ERROR_INVALID_HANDLE;
    *f = (CUfunction)k;
    return CUDA_SUCCESS;
}

CUAPI cuFuncGetModule(CUmodule *mod, CUfunction h)
{
    SIM_ENTER();
    struct sim_func *f = func_of(h);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!mod)
        return CUDA_ERROR_INVALID_VALUE;
    *mod = (CUmodule)f->module;
    return CUDA_SUCCESS;
}

CUAPI cuKernelGetLibrary(CUlibrary *lib, CUkernel k)
{
    return cuFuncGetModule((CUmodule *)lib, (CUfunction)k);
}

int sim_func_dev(const struct sim_func *f)
{
    return module_dev(f->module);
}

size_t sim_func_max_dynamic_shared(const struct sim_func *f)
{
    if (f->max_dynamic_shared)
        return (size_t)f->max_dynamic_shared;
    return f->info.shared < SIM_SHARED_DEFAULT ? SIM_SHARED_DEFAULT - f->info.shared : 0;
}

static CUresult func_attribute(int *v, CUfunction_attribute attr, const struct sim_func *f, int dev)
{
    const struct sim_gpu_info *g = &sim_machine()->gpu[dev];
    int cc = g->cc_major * 10 + g->cc_minor;
    switch (attr) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = sim_func_max_threads(f); break;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *v = (int)f->info.shared; break;
    case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: *v = (int)f->module->const_bytes; break;
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: *v = (int)f->info.local; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *v = f->info.regs; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: *v = f->module->target ? f->module->target : cc; break;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *v = cc; break; /* PTX is compiled for the device it loads on */
    case CU_FUNC_ATTRIBUTE_CACHE_MODE_CA: *v = 0; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *v = (int)sim_func_max_dynamic_shared(f); break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: *v = f->carveout; break;
    case CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE: *v = 0; break;
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: *v = f->non_portable_cluster; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUAPI cuFuncGetAttribute(int *v, CUfunction_attribute attr, CUfunction h)
{
    SIM_ENTER();
    struct sim_func *f = func_of(h);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    return func_attribute(v, attr, f, module_dev(f->module));
}

CUAPI cuKernelGetAttribute(int *v, CUfunction_attribute attr, CUkernel k, CUdevice dev)
{
    SIM_ENTER();
    struct sim_func *f = func_of((CUfunction)k);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!v || dev < 0 || dev >= sim_machine()->gpu_count)
        return dev < 0 || dev >= sim_machine()->gpu_count ? CUDA_ERROR_INVALID_DEVICE : CUDA_ERROR_INVALID_VALUE;
    return func_attribute(v, attr, f, dev);
}

CUAPI cuFuncSetAttribute(CUfunction h, CUfunction_attribute attr, int v)
{
    SIM_ENTER();
    struct sim_func *f = func_of(h);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    switch (attr) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        if (v < 0 || (size_t)v + f->info.shared > SIM_SHARED_PER_SM - SIM_SHARED_RESERVED)
            return CUDA_ERROR_INVALID_VALUE;
        f->max_dynamic_shared = v;
        break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
        if (v < -1 || v > 100)
            return CUDA_ERROR_INVALID_VALUE;
        f->carveout = v;
        break;
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
        if (v != 0 && v != 1)
            return CUDA_ERROR_INVALID_VALUE;
        if (sim_machine()->gpu[module_dev(f->module)].cc_major < 9)
            return CUDA_ERROR_NOT_SUPPORTED;
        f->non_portable_cluster = v;
        break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUAPI cuKernelSetAttribute(CUfunction_attribute attr, int v, CUkernel k, CUdevice dev)
{
    SIM_ENTER();
    if (dev < 0 || dev >= sim_machine()->gpu_count)
        return CUDA_ERROR_INVALID_DEVICE;
    return cuFuncSetAttribute((CUfunction)k, attr, v);
}

CUAPI cuFuncSetCacheConfig(CUfunction h, int config)
{
    SIM_ENTER();
    if (config < 0 || config > 3)
        return CUDA_ERROR_INVALID_VALUE;
    return func_of(h) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUAPI cuFuncGetName(const char **name, CUfunction h)
{
    SIM_ENTER();
    struct sim_func *f = func_of(h);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    *name = f->name;
    return CUDA_SUCCESS;
}

CUAPI cuKernelGetName(const char **name, CUkernel k)
{
    return cuFuncGetName(name, (CUfunction)k);
}

/* A parameter's offset and size in the kernel's parameter buffer, as its PTX declares it. */
CUAPI cuFuncGetParamInfo(CUfunction h, size_t index, size_t *offset, size_t *size)
{
    SIM_ENTER();
    struct sim_func *f = func_of(h);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (f->info.n_params < 0)
        return CUDA_ERROR_NOT_SUPPORTED; /* a binary image: the simulator does not read it */
    if (index >= (size_t)f->info.n_params)
        return CUDA_ERROR_INVALID_VALUE;
    if (offset)
        *offset = f->info.param_offset[index];
    if (size)
        *size = f->info.param_size[index];
    return CUDA_SUCCESS;
}

CUAPI cuKernelGetParamInfo(CUkernel k, size_t index, size_t *offset, size_t *size)
{
    return cuFuncGetParamInfo((CUfunction)k, index, offset, size);
}

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

static CUresult validate(const struct sim_kernel_launch *k, int cooperative, int dev)
{
    if (!func_of((CUfunction)k->func))
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

static CUresult graph_add(struct sim_graph *g, const struct sim_kernel_launch *k, struct sim_node **out)
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

static void run_on_gpu(struct sim_stream *s, int dev, uint64_t ns);

/* Put `ns` of work on the stream's GPU after what the stream waits for. */
static void run_on_stream(struct sim_stream *s, uint64_t ns)
{
    run_on_gpu(s, s->ctx->dev, ns);
}

static void run_on_gpu(struct sim_stream *s, int dev, uint64_t ns)
{
    uint64_t end = sim_gpu_run(dev, sim_stream_not_before(s), ns);
    sim_ready_raise(s, end);
    uint64_t now = sim_now_ns();
    if (end > now + QUEUE_AHEAD_NS) /* a full launch queue makes the CPU wait */
        sim_sleep_until(end - QUEUE_AHEAD_NS);
}

static CUresult launch(const struct sim_kernel_launch *k, CUstream hs, int cooperative, int ptds)
{
    SIM_ENTER();
    struct sim_stream *s = sim_stream_resolve(hs, ptds, &r);
    if (!s)
        return r;
    if ((r = validate(k, cooperative, s->ctx->dev)))
        return r;
    if (s->capture)
        return graph_add(s->capture, k, NULL);
    run_on_stream(s, sim_kernel_ns(k, s->ctx->dev));
    return CUDA_SUCCESS;
}

#define KL(f, gx, gy, gz, bx, by, bz, sh) \
    (struct sim_kernel_launch){(struct sim_func *)(f), {gx, gy, gz}, {bx, by, bz}, sh}
/* kernel node parameters (v1, v2, v3: the same leading fields) */
#define NODE_KL(f, p) \
    KL(f, (p)->gridDimX, (p)->gridDimY, (p)->gridDimZ, (p)->blockDimX, (p)->blockDimY, (p)->blockDimZ, \
       (p)->sharedMemBytes)
/* v2 and later name the kernel by function or by library kernel */
#define NODE_KL_V2(p) NODE_KL((p)->func ? (p)->func : (CUfunction)(p)->kern, p)

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
    sim_sleep_until(sim_stream_not_before(s));
    fn(data);
    return CUDA_SUCCESS;
}

CUAPI cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data) { return host_func(s, fn, data, 0); }
CUAPI cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *data) { return host_func(s, fn, data, 1); }

/* ---- graphs ---------------------------------------------------------- */

static struct sim_graph *graph_of(CUgraph h)
{
    struct sim_graph *g = (struct sim_graph *)h;
    return g && g->magic == MAGIC_GRAPH ? g : NULL;
}

static struct sim_graph *graph_new(void)
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
    struct sim_graph *g = graph_new();
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = (CUgraph)g;
    return CUDA_SUCCESS;
}

static void graph_free(struct sim_graph *g)
{
    for (struct sim_node *n = g->nodes, *nx; n; n = nx) {
        nx = n->next;
        if (n->child)
            graph_free(n->child);
        n->magic = MAGIC_DEAD;
        free(n);
    }
    g->magic = MAGIC_DEAD;
    free(g);
}

CUAPI cuGraphDestroy(CUgraph h)
{
    SIM_ENTER();
    struct sim_graph *g = graph_of(h);
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    graph_free(g);
    return CUDA_SUCCESS;
}

/* A copy of g (child graph nodes hold copies, as CUDA's do); NULL when out of
 * memory or nested too deep. */
static struct sim_graph *graph_clone(const struct sim_graph *g, int depth)
{
    struct sim_graph *c = depth < SIM_MAX_GRAPH_DEPTH ? graph_new() : NULL;
    for (const struct sim_node *n = g->nodes; c && n; n = n->next) {
        struct sim_node *copy = NULL;
        if (graph_add(c, n->is_kernel ? &n->k : NULL, &copy) != CUDA_SUCCESS) {
            graph_free(c);
            return NULL;
        }
        copy->event = n->event;
        if (n->child && !(copy->child = graph_clone(n->child, depth + 1))) {
            graph_free(c);
            return NULL;
        }
    }
    return c;
}

static CUresult add_node(CUgraphNode *out, CUgraph h, const CUgraphNode *deps, size_t ndeps,
                         const struct sim_kernel_launch *k)
{
    SIM_ENTER();
    struct sim_graph *g = graph_of(h);
    if (!out || !g || (ndeps && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < ndeps; i++) {
        struct sim_node *d = (struct sim_node *)deps[i];
        if (!d || d->magic != MAGIC_NODE || d->graph != g)
            return CUDA_ERROR_INVALID_VALUE;
    }
    if (k && !func_of((CUfunction)k->func))
        return CUDA_ERROR_INVALID_VALUE;
    return graph_add(g, k, (struct sim_node **)out);
}

CUAPI cuGraphAddEmptyNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n)
{
    return add_node(out, g, deps, n, NULL);
}

CUAPI cuGraphAddChildGraphNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, CUgraph child)
{
    struct sim_graph *src = graph_of(child);
    if (!src)
        return sim_check_init() ? sim_check_init() : CUDA_ERROR_INVALID_VALUE;
    struct sim_graph *copy = graph_clone(src, 1);
    if (!copy)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUgraphNode node = NULL;
    CUresult r = add_node(&node, g, deps, n, NULL);
    if (r != CUDA_SUCCESS) {
        graph_free(copy);
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

CUAPI cuGraphGetNodes(CUgraph h, CUgraphNode *nodes, size_t *count)
{
    SIM_ENTER();
    struct sim_graph *g = graph_of(h);
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

static struct sim_node *node_of(CUgraphNode h)
{
    struct sim_node *n = (struct sim_node *)h;
    return n && n->magic == MAGIC_NODE ? n : NULL;
}

CUAPI cuGraphNodeGetType(CUgraphNode h, CUgraphNodeType *type)
{
    SIM_ENTER();
    struct sim_node *n = node_of(h);
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
    struct sim_node *n = node_of(h);
    if (!n || !n->child || !out)
        return CUDA_ERROR_INVALID_VALUE;
    *out = (CUgraph)n->child;
    return CUDA_SUCCESS;
}

static CUresult kernel_node(CUgraphNode h, CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
    SIM_ENTER();
    struct sim_node *n = node_of(h);
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
static unsigned flatten(const struct sim_graph *g, const struct sim_node *top, struct sim_exec_kernel *out,
                        unsigned i, int depth)
{
    for (const struct sim_node *n = g->nodes; n; n = n->next) {
        if (n->child && depth < SIM_MAX_GRAPH_DEPTH) {
            i = flatten(n->child, top ? top : n, out, i, depth + 1);
        } else if (n->is_kernel && func_of((CUfunction)n->k.func)) {
            int dev = module_dev(n->k.func->module);
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
    struct sim_graph *g = graph_of(h);
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
    const struct sim_func *f = func_of((CUfunction)k->func);
    if (!f)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_mu);
    struct sim_exec_kernel *x = NULL;
    for (unsigned i = 0; i < e->kernels && !x; i++)
        if (e->k[i].node == (const struct sim_node *)node)
            x = &e->k[i];
    /* the function may change, but not its context (CUDA says so too) */
    if (x && module_dev(f->module) == x->dev && (r = validate(k, 0, x->dev)) == CUDA_SUCCESS)
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
    struct sim_graph *g = graph_of(child);
    struct sim_node *n = node_of(node);
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
    struct sim_graph *g = graph_of(hg);
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
    for (int d = 0; d < SIM_MAX_GPUS; d++)
        if (e->ns_by_dev[d])
            run_on_gpu(s, d, e->ns_by_dev[d]);
    uint64_t now = sim_now_ns(), done = sim_stream_not_before(s);
    for (unsigned i = 0; i < e->n_events; i++) {
        e->events[i]->time = done > now ? done : now;
        e->events[i]->recorded = 1;
    }
    return CUDA_SUCCESS;
}

CUresult sim_capture_event_record(struct sim_stream *s, struct sim_event *e)
{
    struct sim_node *n;
    CUresult r = graph_add(s->capture, NULL, &n);
    if (r == CUDA_SUCCESS)
        n->event = e;
    return r;
}

CUAPI cuGraphLaunch(CUgraphExec e, CUstream s) { return graph_launch(e, s, 0); }
CUAPI cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) { return graph_launch(e, s, 1); }

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
    s->capture = graph_new();
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
    struct sim_graph *g = graph_of(hg);
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
