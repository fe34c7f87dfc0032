/* Simulated driver: occupancy, the one model behind both the cuOccupancy*
 * calls and how long a launch runs (a wave is as many blocks as fit on all
 * SMs at once).
 *
 * Blocks of a kernel that fit on one SM: the fewest allowed by threads
 * (2048 per SM, counted in whole warps), blocks (32 per SM from compute
 * capability 8, else 16), registers (65536 per SM, allocated per warp in
 * units of 256) and shared memory (SIM_SHARED_PER_SM, each block taking its
 * static and dynamic bytes plus 1 KiB the driver reserves). A block larger
 * than the kernel's limit (.maxntid, or what its registers allow) fits 0. */
#include "sim_cuda.h"

#define THREADS_PER_SM 2048
#define WARP 32
#define REG_UNIT 256 /* registers are allocated per warp in units of this */
#define PORTABLE_CLUSTER 8
#define MAX_CLUSTER 16
#define SMS_PER_GPC 16 /* clusters run within one GPC */

static int max_blocks_per_sm(int cc_major)
{
    return cc_major >= 8 ? 32 : 16;
}

static int warp_registers(const struct sim_func *f)
{
    int per_warp = f->info.regs * WARP;
    return (per_warp + REG_UNIT - 1) / REG_UNIT * REG_UNIT;
}

/* The largest block this kernel can be launched with. */
int sim_func_max_threads(const struct sim_func *f)
{
    int by_regs = (int)(SIM_REGS_PER_SM / (unsigned)warp_registers(f)) * WARP;
    int limit = f->info.max_threads ? f->info.max_threads : 1024;
    return by_regs < limit ? by_regs : limit;
}

int sim_blocks_per_sm(const struct sim_func *f, int dev, unsigned threads, size_t dynamic_shared)
{
    if (!threads || threads > (unsigned)sim_func_max_threads(f))
        return 0;
    unsigned warps = (threads + WARP - 1) / WARP;
    int fit = max_blocks_per_sm(sim_machine()->gpu[dev].cc_major);
    int by_threads = (int)(THREADS_PER_SM / WARP / warps);
    int by_regs = (int)(SIM_REGS_PER_SM / (warps * (unsigned)warp_registers(f)));
    size_t shared = f->info.shared + dynamic_shared + SIM_SHARED_RESERVED;
    int by_shared = (int)(SIM_SHARED_PER_SM / shared);
    fit = by_threads < fit ? by_threads : fit;
    fit = by_regs < fit ? by_regs : fit;
    return by_shared < fit ? by_shared : fit;
}

int sim_device_max_blocks_per_sm(int dev)
{
    return max_blocks_per_sm(sim_machine()->gpu[dev].cc_major);
}

static struct sim_func *func_arg(CUfunction h, int *dev, CUresult *r)
{
    struct sim_func *f = sim_func_of(h);
    if (!f) {
        *r = CUDA_ERROR_INVALID_HANDLE;
        return NULL;
    }
    *dev = sim_func_dev(f);
    return f;
}

static CUresult active_blocks(int *n, CUfunction h, int block, size_t shared, unsigned flags)
{
    SIM_ENTER();
    int dev;
    struct sim_func *f = func_arg(h, &dev, &r);
    if (!f)
        return r;
    if (!n || block <= 0 || flags > CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE)
        return CUDA_ERROR_INVALID_VALUE;
    *n = sim_blocks_per_sm(f, dev, (unsigned)block, shared);
    return CUDA_SUCCESS;
}

CUAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int block, size_t shared)
{
    return active_blocks(n, f, block, shared, 0);
}

CUAPI cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *n, CUfunction f, int block, size_t shared,
                                                            unsigned flags)
{
    return active_blocks(n, f, block, shared, flags);
}

/* The block size that keeps the most threads resident per SM (the largest
 * such size on a tie), searched in whole warps from the largest allowed;
 * min_grid: the grid that fills every SM at that occupancy. */
static CUresult potential_block_size(int *min_grid, int *block, CUfunction h, CUoccupancyB2DSize to_shared,
                                     size_t shared, int limit, unsigned flags)
{
    SIM_ENTER();
    int dev;
    struct sim_func *f = func_arg(h, &dev, &r);
    if (!f)
        return r;
    if (!min_grid || !block || limit < 0 || flags > CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE)
        return CUDA_ERROR_INVALID_VALUE;
    int top = sim_func_max_threads(f);
    if (limit && limit < top)
        top = limit;
    int best_block = 0, best_blocks = 0, best_threads = 0;
    for (int b = (top + WARP - 1) / WARP * WARP; b > 0; b -= WARP) {
        int size = b > top ? top : b;
        int n = sim_blocks_per_sm(f, dev, (unsigned)size, to_shared ? to_shared(size) : shared);
        if (n * size > best_threads) {
            best_threads = n * size;
            best_block = size;
            best_blocks = n;
        }
    }
    *block = best_block;
    *min_grid = best_blocks * sim_machine()->gpu[dev].sms;
    return CUDA_SUCCESS;
}

CUAPI cuOccupancyMaxPotentialBlockSize(int *min_grid, int *block, CUfunction f, CUoccupancyB2DSize to_shared,
                                       size_t shared, int limit)
{
    return potential_block_size(min_grid, block, f, to_shared, shared, limit, 0);
}

CUAPI cuOccupancyMaxPotentialBlockSizeWithFlags(int *min_grid, int *block, CUfunction f,
                                                CUoccupancyB2DSize to_shared, size_t shared, int limit,
                                                unsigned flags)
{
    return potential_block_size(min_grid, block, f, to_shared, shared, limit, flags);
}

/* The most dynamic shared memory a block may use with num_blocks of them per SM. */
CUAPI cuOccupancyAvailableDynamicSMemPerBlock(size_t *out, CUfunction h, int num_blocks, int block)
{
    SIM_ENTER();
    int dev;
    struct sim_func *f = func_arg(h, &dev, &r);
    if (!f)
        return r;
    if (!out || num_blocks <= 0 || block <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    *out = 0;
    if (sim_blocks_per_sm(f, dev, (unsigned)block, 0) < num_blocks)
        return CUDA_SUCCESS; /* not even with none */
    size_t per_block = SIM_SHARED_PER_SM / (size_t)num_blocks;
    size_t fixed = f->info.shared + SIM_SHARED_RESERVED;
    size_t avail = per_block > fixed ? per_block - fixed : 0;
    size_t cap = sim_func_max_dynamic_shared(f);
    *out = avail < cap ? avail : cap;
    return CUDA_SUCCESS;
}

/* Thread block clusters (compute capability 9 and later): the launch's
 * cluster size (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, 0 if it has none), the
 * most the function allows, and how many of its blocks one GPC holds. */
struct cluster_fit {
    unsigned size, limit, per_gpc;
    int dev;
};

static CUresult cluster_fit(int *out, CUfunction h, const CUlaunchConfig *c, struct cluster_fit *fit)
{
    CUresult r = sim_check_init();
    struct sim_func *f;
    if (r || !(f = func_arg(h, &fit->dev, &r)))
        return r;
    if (!out || !c || (c->numAttrs && !c->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    if (sim_machine()->gpu[fit->dev].cc_major < 9)
        return CUDA_ERROR_NOT_SUPPORTED;
    fit->size = 0;
    for (unsigned i = 0; i < c->numAttrs; i++)
        if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
            const unsigned *d = &c->attrs[i].value.clusterDim.x;
            fit->size = d[0] * (d[1] ? d[1] : 1) * (d[2] ? d[2] : 1);
        }
    fit->limit = f->non_portable_cluster ? MAX_CLUSTER : PORTABLE_CLUSTER;
    unsigned threads = c->blockDimX * c->blockDimY * c->blockDimZ;
    fit->per_gpc = (unsigned)sim_blocks_per_sm(f, fit->dev, threads, c->sharedMemBytes) * SMS_PER_GPC;
    return CUDA_SUCCESS;
}

CUAPI cuOccupancyMaxPotentialClusterSize(int *out, CUfunction h, const CUlaunchConfig *c)
{
    struct cluster_fit fit;
    CUresult r = cluster_fit(out, h, c, &fit);
    if (r == CUDA_SUCCESS)
        *out = (int)(fit.per_gpc < fit.limit ? fit.per_gpc : fit.limit);
    return r;
}

/* Clusters of the launch's size resident at once: each GPC holds as many as its SMs' blocks allow. */
CUAPI cuOccupancyMaxActiveClusters(int *out, CUfunction h, const CUlaunchConfig *c)
{
    struct cluster_fit fit;
    CUresult r = cluster_fit(out, h, c, &fit);
    if (r)
        return r;
    if (!fit.size || fit.size > fit.limit)
        return CUDA_ERROR_INVALID_CLUSTER_SIZE;
    unsigned gpcs = (unsigned)sim_machine()->gpu[fit.dev].sms / SMS_PER_GPC;
    *out = (int)(fit.per_gpc / fit.size * (gpcs ? gpcs : 1));
    return CUDA_SUCCESS;
}
