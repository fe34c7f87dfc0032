/* Memory the driver allocates for a process by itself, outside any call an
 * interposer sees, as the real driver does (shared/research/real-driver-facts.md,
 * "Memory the driver allocates itself"):
 * - a module's code and constant banks: with lazy loading, the default since
 *   CUDA 12.2, when a kernel of it is first launched (PyTorch 287 MB lazy
 *   against 666 MB eager, pytorch PR #86509); at load with
 *   CUDA_MODULE_LOADING=EAGER. Per GPU: `module_memory`.
 * - local memory: the driver reserves each thread's local memory (stack) for
 *   every resident thread of the device, grows it for a launch that needs
 *   more or for cuCtxSetLimit(CU_LIMIT_STACK_SIZE), and keeps it (cuCtxSetLimit
 *   docs). Per GPU: `local_memory: true`.
 * All of it is charged to the process (NVML's per-process used memory, the
 * device's free memory) and given back with its module or its context. */
#include <stdlib.h>
#include <string.h>

#include "sim_cuda.h"

#define DEFAULT_STACK 1024u    /* CU_LIMIT_STACK_SIZE's default */
#define THREADS_PER_SM 2048u   /* CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR */

int sim_driver_eager(void)
{
    static int eager = -1; /* read once: the driver reads it at cuInit */
    if (eager < 0) {
        const char *v = getenv("CUDA_MODULE_LOADING");
        eager = v && strcmp(v, "EAGER") == 0;
    }
    return eager;
}

static CUresult charge(struct sim_ctx *c, uint64_t bytes)
{
    if (!bytes)
        return CUDA_SUCCESS;
    if (sim_mem_charge(c->dev, bytes))
        return CUDA_ERROR_OUT_OF_MEMORY;
    __atomic_add_fetch(&c->driver_bytes, bytes, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

CUresult sim_driver_module_load(struct sim_module *m, struct sim_ctx *c)
{
    if (__atomic_load_n(&m->charged_ctx, __ATOMIC_ACQUIRE))
        return CUDA_SUCCESS; /* loaded already: a launch's usual path takes no lock */
    uint64_t bytes = sim_machine()->gpu[c->dev].module_memory;
    pthread_mutex_lock(&sim_mu);
    int first = !m->charged_ctx;
    if (first) /* taken before the charge: one launch of many threads loads it once */
        m->charged_ctx = c, m->charged_gen = c->generation, m->charged = bytes;
    pthread_mutex_unlock(&sim_mu);
    if (!first)
        return CUDA_SUCCESS;
    CUresult r = charge(c, bytes);
    if (r) {
        pthread_mutex_lock(&sim_mu);
        m->charged_ctx = NULL, m->charged = 0;
        pthread_mutex_unlock(&sim_mu);
    }
    return r;
}

static CUresult grow_local(struct sim_ctx *c, size_t per_thread)
{
    const struct sim_gpu_info *g = &sim_machine()->gpu[c->dev];
    if (!g->local_memory || per_thread <= __atomic_load_n(&c->lmem_per_thread, __ATOMIC_RELAXED))
        return CUDA_SUCCESS;
    pthread_mutex_lock(&sim_mu);
    size_t had = c->lmem_per_thread ? c->lmem_per_thread : DEFAULT_STACK;
    int grows = per_thread > had;
    if (grows)
        c->lmem_per_thread = per_thread;
    pthread_mutex_unlock(&sim_mu);
    if (!grows)
        return CUDA_SUCCESS; /* kept, never shrunk */
    CUresult r = charge(c, (uint64_t)(per_thread - had) * g->sms * THREADS_PER_SM);
    if (r) {
        pthread_mutex_lock(&sim_mu);
        c->lmem_per_thread = had;
        pthread_mutex_unlock(&sim_mu);
    }
    return r;
}

CUresult sim_driver_before_launch(struct sim_ctx *c, struct sim_func *f)
{
    CUresult r = sim_driver_module_load(f->module, c);
    return r ? r : grow_local(c, f->info.local);
}

CUresult sim_driver_stack_limit(struct sim_ctx *c, size_t per_thread)
{
    return grow_local(c, per_thread);
}

void sim_driver_module_unload(struct sim_module *m)
{
    pthread_mutex_lock(&sim_mu);
    struct sim_ctx *c = m->charged_ctx;
    /* its context's memory went with the context (a later one in the same shell is another) */
    int live = c && sim_valid_ctx(c) && c->generation == m->charged_gen;
    uint64_t bytes = live ? m->charged : 0;
    if (live)
        c->driver_bytes -= bytes;
    m->charged_ctx = NULL, m->charged = 0;
    pthread_mutex_unlock(&sim_mu);
    if (bytes)
        sim_mem_uncharge(c->dev, bytes);
}

void sim_driver_ctx_gone(struct sim_ctx *c)
{
    uint64_t bytes = __atomic_exchange_n(&c->driver_bytes, 0, __ATOMIC_RELAXED);
    c->lmem_per_thread = 0;
    if (bytes)
        sim_mem_uncharge(c->dev, bytes);
}
