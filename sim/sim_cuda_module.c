/* Simulated driver: modules and libraries (PTX kept and read for each
 * kernel; binaries opaque), functions and kernels, their attributes. */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "sim_cuda.h"

/* ---- modules --------------------------------------------------------- */

static int is_ptx(const char *img)
{
    return img[0] != 0x7f && ((const unsigned char *)img)[0] != 0x50;
}

/* The device a module's functions run on: its context's; for a library loaded
 * with no context current (context-independent loading), the current one's. */
int sim_module_dev(const struct sim_module *m)
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
    if (is_ptx(image) && (r = sim_ptx_jit()) != CUDA_SUCCESS)
        return r;
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
        m->entries = sim_ptx_entries(img);
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
    if (c && sim_driver_eager() && (r = sim_driver_module_load(m, c))) {
        free(m->entries);
        free(m->ptx);
        free(m);
        return r;
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
    sim_driver_module_unload(m);
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

struct sim_func *sim_func_of(CUfunction h)
{
    struct sim_func *f = (struct sim_func *)h;
    return f && f->magic == MAGIC_FUNC ? f : NULL;
}

CUAPI cuKernelGetFunction(CUfunction *f, CUkernel k)
{
    SIM_ENTER();
    if (!f)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_func_of((CUfunction)k))
        return CUDA_ERROR_INVALID_HANDLE;
    *f = (CUfunction)k;
    return CUDA_SUCCESS;
}

CUAPI cuFuncGetModule(CUmodule *mod, CUfunction h)
{
    SIM_ENTER();
    struct sim_func *f = sim_func_of(h);
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
    return sim_module_dev(f->module);
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
    struct sim_func *f = sim_func_of(h);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    return func_attribute(v, attr, f, sim_module_dev(f->module));
}

CUAPI cuKernelGetAttribute(int *v, CUfunction_attribute attr, CUkernel k, CUdevice dev)
{
    SIM_ENTER();
    struct sim_func *f = sim_func_of((CUfunction)k);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!v || dev < 0 || dev >= sim_machine()->gpu_count)
        return dev < 0 || dev >= sim_machine()->gpu_count ? CUDA_ERROR_INVALID_DEVICE : CUDA_ERROR_INVALID_VALUE;
    return func_attribute(v, attr, f, dev);
}

CUAPI cuFuncSetAttribute(CUfunction h, CUfunction_attribute attr, int v)
{
    SIM_ENTER();
    struct sim_func *f = sim_func_of(h);
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
        if (sim_machine()->gpu[sim_module_dev(f->module)].cc_major < 9)
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
    return sim_func_of(h) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUAPI cuFuncGetName(const char **name, CUfunction h)
{
    SIM_ENTER();
    struct sim_func *f = sim_func_of(h);
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
    struct sim_func *f = sim_func_of(h);
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
