/* Simulated driver: cuInit, the driver's version, devices and their attributes,
 * the profiler, and where entry points come from (cuGetProcAddress). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "sim_cuda.h"
#include "sim_memory.h"

pthread_mutex_t sim_mu = PTHREAD_MUTEX_INITIALIZER;
int sim_initialized;

int sim_valid_dev(CUdevice d)
{
    return d >= 0 && d < sim_machine()->gpu_count;
}

CUAPI cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    char err[512] = "";
    if (sim_attach(err, sizeof err)) {
        static int said;
        if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
            sim_log("%s", err);
        return CUDA_ERROR_NO_DEVICE;
    }
    CUresult named = sim_name_driver_threads();
    if (named != CUDA_SUCCESS)
        return named;
    __atomic_store_n(&sim_initialized, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

CUresult sim_check_init(void)
{
    return __atomic_load_n(&sim_initialized, __ATOMIC_ACQUIRE) ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUAPI cuDriverGetVersion(int *v)
{
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    /* answers before cuInit, like the real driver; the config may not load */
    char err[512] = "";
    *v = sim_attach(err, sizeof err) == 0 ? sim_machine()->driver_version : 13000;
    return CUDA_SUCCESS;
}

CUAPI cuDeviceGetCount(int *count)
{
    REQUIRE_INIT();
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = sim_machine()->gpu_count;
    return CUDA_SUCCESS;
}

CUAPI cuDeviceGet(CUdevice *dev, int ordinal)
{
    REQUIRE_INIT();
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_valid_dev(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

CUAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
    REQUIRE_DEV(dev);
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", sim_machine()->gpu[dev].name);
    return CUDA_SUCCESS;
}

CUAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    REQUIRE_DEV(dev);
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(uuid->bytes, sim_machine()->gpu[dev].uuid_bytes, 16);
    return CUDA_SUCCESS;
}

CUAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    return cuDeviceGetUuid(uuid, dev);
}

CUAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    REQUIRE_DEV(dev);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = sim_machine()->gpu[dev].memory;
    return CUDA_SUCCESS;
}

CUAPI cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    size_t b;
    CUresult r = cuDeviceTotalMem_v2(&b, dev);
    if (r == CUDA_SUCCESS) {
        if (!bytes)
            return CUDA_ERROR_INVALID_VALUE;
        *bytes = b > 0xffffffffu ? 0xffffffffu : (unsigned)b; /* the v1 ABI is 32-bit */
    }
    return r;
}

CUAPI cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    REQUIRE_DEV(dev);
    if (!major || !minor)
        return CUDA_ERROR_INVALID_VALUE;
    *major = sim_machine()->gpu[dev].cc_major;
    *minor = sim_machine()->gpu[dev].cc_minor;
    return CUDA_SUCCESS;
}

CUAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    REQUIRE_DEV(dev);
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    const struct sim_gpu_info *g = &sim_machine()->gpu[dev];
    int v;
    switch ((int)attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = SIM_SHARED_DEFAULT; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: v = SIM_REGS_PER_SM; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = g->clock_khz; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: v = 512; break;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = g->sms; break;
    case CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = (int)g->pci_bus; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: v = (int)g->pci_device; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: v = (int)g->pci_domain; break;
    case CU_DEVICE_ATTRIBUTE_TCC_DRIVER: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: v = 1593000; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = 5120; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = 40 << 20; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = 2048; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: v = 3; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = g->cc_major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = g->cc_minor; break;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: v = SIM_SHARED_PER_SM; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: v = SIM_REGS_PER_SM; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: v = SIM_SHARED_PER_SM - SIM_SHARED_RESERVED; break;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: v = sim_device_max_blocks_per_sm(dev); break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 1; break;
    default:
        if (attrib <= 0 || attrib > 160)
            return CUDA_ERROR_INVALID_VALUE;
        v = 0; /* a capability the simulator does not model: "not supported" */
    }
    *pi = v;
    return CUDA_SUCCESS;
}

CUAPI cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    REQUIRE_DEV(dev);
    if (!pciBusId || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    const struct sim_gpu_info *g = &sim_machine()->gpu[dev];
    /* the driver API uses a 4-digit domain, NVML an 8-digit one */
    snprintf(pciBusId, (size_t)len, "%04X:%02X:%02X.%X", g->pci_domain, g->pci_bus, g->pci_device, g->pci_function);
    return CUDA_SUCCESS;
}

CUAPI cuDeviceGetByPCIBusId(CUdevice *dev, const char *pciBusId)
{
    REQUIRE_INIT();
    if (!dev || !pciBusId)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned dom = 0, bus, d, fn = 0;
    if (sscanf(pciBusId, "%x:%x:%x.%x", &dom, &bus, &d, &fn) < 3 &&
        (dom = 0, sscanf(pciBusId, "%x:%x.%x", &bus, &d, &fn) < 2))
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < sim_machine()->gpu_count; i++) {
        const struct sim_gpu_info *g = &sim_machine()->gpu[i];
        if (g->pci_domain == dom && g->pci_bus == bus && g->pci_device == d && g->pci_function == fn)
            return *dev = i, CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_DEVICE;
}

CUAPI cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
    REQUIRE_DEV(dev);
    if (!sim_valid_dev(peer))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!can)
        return CUDA_ERROR_INVALID_VALUE;
    const struct sim_machine *m = sim_machine();
    *can = dev != peer && (m->nvlinks[dev][peer] > 0 || m->pcie[dev][peer] <= SIM_TOPO_HOSTBRIDGE);
    return CUDA_SUCCESS;
}

/* The one private table the simulator has: device memory allocated through
 * the driver's own path, as a library does that reaches the driver past the
 * exported API (NCCL's buffers escaped a slice's books on the H200: shared/
 * research/real-gpu-h200-2026-11-26.md). An interposer forwards
 * cuGetExportTable, so nothing it charges sees these. */
static CUresult internal_alloc(CUdeviceptr *dptr, size_t size)
{
    struct sim_ctx *c;
    CUresult r = sim_ctx_or_error(&c);
    return r ? r : sim_device_alloc(dptr, size, K_DEVICE, c->dev, NULL, 0);
}

static CUresult internal_free(CUdeviceptr dptr)
{
    return sim_free_kind(dptr, 0);
}

static const struct {
    size_t size;
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
} internal_table = {sizeof internal_table, internal_alloc, internal_free};

CUAPI cuGetExportTable(const void **table, const void *id)
{
    if (!table || !id)
        return CUDA_ERROR_INVALID_VALUE;
    if (memcmp(id, SIM_INTERNAL_TABLE_ID, 16) == 0) {
        *table = &internal_table;
        return CUDA_SUCCESS;
    }
    *table = NULL;
    return CUDA_ERROR_NOT_SUPPORTED; /* the real runtime's private tables are not simulated */
}

/* ---- the profiler (cudaProfiler.h): no profiler attaches to the simulator,
 * so starting and stopping collection only asks for a current context ---- */

CUAPI cuProfilerInitialize(const char *config_file, const char *output_file, int output_mode)
{
    (void)config_file, (void)output_file, (void)output_mode;
    return CUDA_ERROR_NOT_SUPPORTED; /* deprecated, and gone from current drivers */
}

CUAPI cuProfilerStart(void)
{
    SIM_ENTER();
    struct sim_ctx *c;
    return sim_ctx_or_error(&c);
}

CUAPI cuProfilerStop(void)
{
    return cuProfilerStart();
}

/* ---- cuGetProcAddress (table in sim_cuda_procs.c) --------------------- */

CUAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                          CUdriverProcAddressQueryResult *status)
{
    return sim_proc_lookup(symbol, pfn, version, flags, status);
}

CUAPI cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    return sim_proc_lookup(symbol, pfn, version, flags, NULL);
}
