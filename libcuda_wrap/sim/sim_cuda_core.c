/* Simulated driver: init, errors, devices, contexts, streams, events. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim_cuda.h"

pthread_mutex_t sim_mu = PTHREAD_MUTEX_INITIALIZER;
int sim_initialized;
static struct sim_ctx *ctx_list;
static struct sim_ctx *primary[SIM_MAX_GPUS];
static int primary_refs[SIM_MAX_GPUS];
static unsigned primary_flags[SIM_MAX_GPUS];

#define CTX_STACK 32
static __thread struct sim_ctx *ctx_stack[CTX_STACK];
static __thread int ctx_depth;
static __thread struct { struct sim_ctx *ctx; struct sim_stream *s; } ptds[SIM_MAX_GPUS * 2];

static void after_fork_child(void)
{
    /* CUDA state does not survive fork: the child starts uninitialised. */
    pthread_mutex_init(&sim_mu, NULL);
    sim_initialized = 0;
    ctx_list = NULL;
    memset(primary, 0, sizeof primary);
    memset(primary_refs, 0, sizeof primary_refs);
    ctx_depth = 0;
    memset(ptds, 0, sizeof ptds);
    sim_reset_after_fork();
}

__attribute__((constructor)) static void sim_cuda_ctor(void)
{
    pthread_atfork(NULL, NULL, after_fork_child);
}

/* ---- errors ---------------------------------------------------------- */

/* every CUresult of cuda.h (tests/integration check it against the header) */
static const struct { CUresult code; const char *name, *text; } errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_PROFILER_DISABLED, "CUDA_ERROR_PROFILER_DISABLED", "profiler disabled while using an external profiling tool"},
    {CUDA_ERROR_PROFILER_NOT_INITIALIZED, "CUDA_ERROR_PROFILER_NOT_INITIALIZED", "profiler not initialized"},
    {CUDA_ERROR_PROFILER_ALREADY_STARTED, "CUDA_ERROR_PROFILER_ALREADY_STARTED", "profiler already started"},
    {CUDA_ERROR_PROFILER_ALREADY_STOPPED, "CUDA_ERROR_PROFILER_ALREADY_STOPPED", "profiler already stopped"},
    {CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER", "the call needs a newer CUDA driver"},
    {CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE", "the device is not available now"},
    {CUDA_ERROR_MULTICAST_RESOURCE_FULL, "CUDA_ERROR_MULTICAST_RESOURCE_FULL", "multicast resources of the device are exhausted"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_DEVICE_NOT_LICENSED, "CUDA_ERROR_DEVICE_NOT_LICENSED", "the device is not licensed for this use"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", "context already current"},
    {CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
    {CUDA_ERROR_UNMAP_FAILED, "CUDA_ERROR_UNMAP_FAILED", "unmapping of buffer object failed"},
    {CUDA_ERROR_ARRAY_IS_MAPPED, "CUDA_ERROR_ARRAY_IS_MAPPED", "the array is mapped"},
    {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for this device"},
    {CUDA_ERROR_ALREADY_ACQUIRED, "CUDA_ERROR_ALREADY_ACQUIRED", "the resource is already acquired"},
    {CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {CUDA_ERROR_NOT_MAPPED_AS_ARRAY, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY", "the resource is not mapped as an array"},
    {CUDA_ERROR_NOT_MAPPED_AS_POINTER, "CUDA_ERROR_NOT_MAPPED_AS_POINTER", "the resource is not mapped as a pointer"},
    {CUDA_ERROR_ECC_UNCORRECTABLE, "CUDA_ERROR_ECC_UNCORRECTABLE", "an uncorrectable ECC error was detected"},
    {CUDA_ERROR_UNSUPPORTED_LIMIT, "CUDA_ERROR_UNSUPPORTED_LIMIT", "the limit is not supported on this device"},
    {CUDA_ERROR_CONTEXT_ALREADY_IN_USE, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE", "the context is already in use by another thread"},
    {CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access is not supported between these devices"},
    {CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT", "invalid OpenGL or DirectX context"},
    {CUDA_ERROR_NVLINK_UNCORRECTABLE, "CUDA_ERROR_NVLINK_UNCORRECTABLE", "an uncorrectable NVLink error was detected"},
    {CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "the PTX JIT compiler library was not found"},
    {CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the PTX was compiled with an unsupported toolchain"},
    {CUDA_ERROR_JIT_COMPILATION_DISABLED, "CUDA_ERROR_JIT_COMPILATION_DISABLED", "PTX JIT compilation is disabled"},
    {CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY", "the execution affinity type is not supported"},
    {CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC", "the code calls device-side synchronization, which is not supported"},
    {CUDA_ERROR_CONTAINED, "CUDA_ERROR_CONTAINED", "an exception on the device was contained"},
    {CUDA_ERROR_INSUFFICIENT_LOADER_VERSION, "CUDA_ERROR_INSUFFICIENT_LOADER_VERSION", "the CUDA loader is too old for this call"},
    {CUDA_ERROR_INVALID_SOURCE, "CUDA_ERROR_INVALID_SOURCE", "device kernel image is invalid"},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND", "a shared object's symbol could not be resolved"},
    {CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", "a shared object's initialization failed"},
    {CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_LOSSY_QUERY, "CUDA_ERROR_LOSSY_QUERY", "the attribute cannot be reported without loss"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {CUDA_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"},
    {CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING", "the launch uses an incompatible texturing mode"},
    {CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"},
    {CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access has not been enabled"},
    {CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "primary context active"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_ASSERT, "CUDA_ERROR_ASSERT", "a device-side assert was triggered"},
    {CUDA_ERROR_TOO_MANY_PEERS, "CUDA_ERROR_TOO_MANY_PEERS", "peer mapping resources are exhausted"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_HARDWARE_STACK_ERROR, "CUDA_ERROR_HARDWARE_STACK_ERROR", "a hardware stack error was encountered"},
    {CUDA_ERROR_ILLEGAL_INSTRUCTION, "CUDA_ERROR_ILLEGAL_INSTRUCTION", "an illegal instruction was encountered"},
    {CUDA_ERROR_MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS", "a misaligned address was encountered"},
    {CUDA_ERROR_INVALID_ADDRESS_SPACE, "CUDA_ERROR_INVALID_ADDRESS_SPACE", "an operation on an invalid address space was encountered"},
    {CUDA_ERROR_INVALID_PC, "CUDA_ERROR_INVALID_PC", "an illegal program counter was encountered"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", "too many blocks in cooperative launch"},
    {CUDA_ERROR_TENSOR_MEMORY_LEAK, "CUDA_ERROR_TENSOR_MEMORY_LEAK", "tensor memory was not freed before the kernel exited"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_SYSTEM_NOT_READY, "CUDA_ERROR_SYSTEM_NOT_READY", "the system is not yet ready for GPU work"},
    {CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "the driver and kernel module versions do not match"},
    {CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "forward compatibility is not supported on this device"},
    {CUDA_ERROR_MPS_CONNECTION_FAILED, "CUDA_ERROR_MPS_CONNECTION_FAILED", "the MPS client could not connect to the MPS server"},
    {CUDA_ERROR_MPS_RPC_FAILURE, "CUDA_ERROR_MPS_RPC_FAILURE", "the MPS remote procedure call failed"},
    {CUDA_ERROR_MPS_SERVER_NOT_READY, "CUDA_ERROR_MPS_SERVER_NOT_READY", "the MPS server is not ready"},
    {CUDA_ERROR_MPS_MAX_CLIENTS_REACHED, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED", "the MPS server reached its client limit"},
    {CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED", "the MPS server reached its connection limit"},
    {CUDA_ERROR_MPS_CLIENT_TERMINATED, "CUDA_ERROR_MPS_CLIENT_TERMINATED", "the MPS client was terminated by the server"},
    {CUDA_ERROR_CDP_NOT_SUPPORTED, "CUDA_ERROR_CDP_NOT_SUPPORTED", "the module uses dynamic parallelism, which is not supported"},
    {CUDA_ERROR_CDP_VERSION_MISMATCH, "CUDA_ERROR_CDP_VERSION_MISMATCH", "the module uses an unsupported dynamic parallelism version"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_MERGE, "CUDA_ERROR_STREAM_CAPTURE_MERGE", "the capture would merge two independent captures"},
    {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not initiated in this stream"},
    {CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "the capture did not join a forked stream"},
    {CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "the capture would cross a capture boundary"},
    {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "the capture would depend on the legacy stream"},
    {CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT", "the operation is not permitted on an event last recorded in a capture"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempt to terminate a thread-local capture sequence from another thread"},
    {CUDA_ERROR_TIMEOUT, "CUDA_ERROR_TIMEOUT", "the wait timed out"},
    {CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update"},
    {CUDA_ERROR_EXTERNAL_DEVICE, "CUDA_ERROR_EXTERNAL_DEVICE", "an asynchronous error occurred in an external device"},
    {CUDA_ERROR_INVALID_CLUSTER_SIZE, "CUDA_ERROR_INVALID_CLUSTER_SIZE", "invalid cluster size"},
    {CUDA_ERROR_FUNCTION_NOT_LOADED, "CUDA_ERROR_FUNCTION_NOT_LOADED", "the function is not loaded"},
    {CUDA_ERROR_INVALID_RESOURCE_TYPE, "CUDA_ERROR_INVALID_RESOURCE_TYPE", "invalid resource type"},
    {CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION", "invalid resource configuration"},
    {CUDA_ERROR_KEY_ROTATION, "CUDA_ERROR_KEY_ROTATION", "an error occurred during key rotation"},
    {CUDA_ERROR_STREAM_DETACHED, "CUDA_ERROR_STREAM_DETACHED", "the stream is detached"},
    {CUDA_ERROR_GRAPH_RECAPTURE_FAILURE, "CUDA_ERROR_GRAPH_RECAPTURE_FAILURE", "the graph could not be captured again"},
    {CUDA_ERROR_FABRIC_NOT_READY, "CUDA_ERROR_FABRIC_NOT_READY", "the GPU fabric is not ready"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

CUAPI cuGetErrorName(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == error)
            return *pStr = errors[i].name, CUDA_SUCCESS;
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUAPI cuGetErrorString(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == error)
            return *pStr = errors[i].text, CUDA_SUCCESS;
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- init and devices ------------------------------------------------ */

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
    __atomic_store_n(&sim_initialized, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

CUresult sim_check_init(void)
{
    return __atomic_load_n(&sim_initialized, __ATOMIC_ACQUIRE) ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

#define REQUIRE_INIT()                      \
    do {                                    \
        CUresult r_ = sim_check_init();     \
        if (r_)                             \
            return r_;                      \
    } while (0)

static int valid_dev(CUdevice d)
{
    return d >= 0 && d < sim_machine()->gpu_count;
}

#define REQUIRE_DEV(d)                      \
    do {                                    \
        REQUIRE_INIT();                     \
        if (!valid_dev(d))                  \
            return CUDA_ERROR_INVALID_DEVICE; \
    } while (0)

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
    if (!valid_dev(ordinal))
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
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: v = 0; break;
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
    if (!valid_dev(peer))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!can)
        return CUDA_ERROR_INVALID_VALUE;
    const struct sim_machine *m = sim_machine();
    *can = dev != peer && (m->nvlinks[dev][peer] > 0 || m->pcie[dev][peer] <= SIM_TOPO_HOSTBRIDGE);
    return CUDA_SUCCESS;
}

/* ---- contexts -------------------------------------------------------- */

int sim_valid_ctx(struct sim_ctx *c)
{
    if (!c)
        return 0;
    for (struct sim_ctx *i = ctx_list; i; i = i->next)
        if (i == c)
            return c->magic == MAGIC_CTX;
    return 0;
}

struct sim_ctx *sim_current_ctx(void)
{
    return ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : NULL;
}

CUresult sim_ctx_or_error(struct sim_ctx **out)
{
    REQUIRE_INIT();
    struct sim_ctx *c = sim_current_ctx();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&sim_mu);
    int ok = sim_valid_ctx(c);
    pthread_mutex_unlock(&sim_mu);
    if (!ok)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = c;
    return CUDA_SUCCESS;
}

static CUresult ctx_new(CUdevice dev, unsigned flags, int is_primary, struct sim_ctx **out)
{
    uint64_t cmem = sim_machine()->gpu[dev].context_memory;
    if (sim_register_self() < 0) {
        sim_log("more than %d processes use the simulated GPUs", SIM_MAX_PROCS);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (cmem && sim_mem_charge(dev, cmem))
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        if (cmem)
            sim_mem_uncharge(dev, cmem);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    c->magic = MAGIC_CTX;
    c->dev = dev;
    c->flags = flags;
    c->primary = is_primary;
    c->legacy.magic = MAGIC_STREAM;
    c->legacy.ctx = c;
    sim_context_count(dev, +1);
    pthread_mutex_lock(&sim_mu);
    c->next = ctx_list;
    ctx_list = c;
    pthread_mutex_unlock(&sim_mu);
    *out = c;
    return CUDA_SUCCESS;
}

static void ctx_destroy(struct sim_ctx *c)
{
    sim_ctx_free_memory(c);
    pthread_mutex_lock(&sim_mu);
    for (struct sim_ctx **p = &ctx_list; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    for (struct sim_stream *s = c->streams, *n; s; s = n) {
        n = s->next;
        s->magic = MAGIC_DEAD;
        free(s);
    }
    pthread_mutex_unlock(&sim_mu);
    for (int i = 0; i < ctx_depth; i++)
        if (ctx_stack[i] == c)
            ctx_stack[i] = NULL; /* other threads find out via sim_valid_ctx */
    uint64_t cmem = sim_machine()->gpu[c->dev].context_memory;
    if (cmem)
        sim_mem_uncharge(c->dev, cmem);
    sim_context_count(c->dev, -1);
    c->magic = MAGIC_DEAD;
    free(c);
}

CUAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    REQUIRE_DEV(dev);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (ctx_depth >= CTX_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim_ctx *c;
    CUresult r = ctx_new(dev, flags, 0, &c);
    if (r)
        return r;
    ctx_stack[ctx_depth++] = c;
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

CUAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return cuCtxCreate_v2(pctx, flags, dev);
}

CUAPI cuCtxCreate_v3(CUcontext *pctx, void *params, int n, unsigned int flags, CUdevice dev)
{
    if (n > 0 || params)
        return CUDA_ERROR_NOT_SUPPORTED; /* execution affinity needs MPS */
    return cuCtxCreate_v2(pctx, flags, dev);
}

CUAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev)
{
    if (params && (params->execAffinityParams || params->numExecAffinityParams || params->cigParams))
        return CUDA_ERROR_NOT_SUPPORTED;
    return cuCtxCreate_v2(pctx, flags, dev);
}

CUAPI cuCtxDestroy_v2(CUcontext ctx)
{
    REQUIRE_INIT();
    struct sim_ctx *c = (struct sim_ctx *)ctx;
    pthread_mutex_lock(&sim_mu);
    int ok = sim_valid_ctx(c) && !c->primary;
    pthread_mutex_unlock(&sim_mu);
    if (!ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    int top = ctx_depth > 0 && ctx_stack[ctx_depth - 1] == c;
    ctx_destroy(c);
    if (top)
        ctx_depth--;
    return CUDA_SUCCESS;
}

CUAPI cuCtxDestroy(CUcontext ctx)
{
    return cuCtxDestroy_v2(ctx);
}

CUAPI cuCtxPushCurrent_v2(CUcontext ctx)
{
    REQUIRE_INIT();
    pthread_mutex_lock(&sim_mu);
    int ok = sim_valid_ctx((struct sim_ctx *)ctx);
    pthread_mutex_unlock(&sim_mu);
    if (!ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth >= CTX_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = (struct sim_ctx *)ctx;
    return CUDA_SUCCESS;
}

CUAPI cuCtxPushCurrent(CUcontext ctx)
{
    return cuCtxPushCurrent_v2(ctx);
}

CUAPI cuCtxPopCurrent_v2(CUcontext *pctx)
{
    REQUIRE_INIT();
    if (ctx_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct sim_ctx *c = ctx_stack[--ctx_depth];
    if (pctx)
        *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

CUAPI cuCtxPopCurrent(CUcontext *pctx)
{
    return cuCtxPopCurrent_v2(pctx);
}

CUAPI cuCtxSetCurrent(CUcontext ctx)
{
    REQUIRE_INIT();
    if (!ctx) {
        if (ctx_depth > 0)
            ctx_depth--;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&sim_mu);
    int ok = sim_valid_ctx((struct sim_ctx *)ctx);
    pthread_mutex_unlock(&sim_mu);
    if (!ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 0)
        ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = (struct sim_ctx *)ctx;
    return CUDA_SUCCESS;
}

CUAPI cuCtxGetCurrent(CUcontext *pctx)
{
    REQUIRE_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)sim_current_ctx();
    return CUDA_SUCCESS;
}

static CUresult ctx_arg(CUcontext ctx, struct sim_ctx **out)
{
    if (!ctx)
        return sim_ctx_or_error(out);
    REQUIRE_INIT();
    pthread_mutex_lock(&sim_mu);
    int ok = sim_valid_ctx((struct sim_ctx *)ctx);
    pthread_mutex_unlock(&sim_mu);
    if (!ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = (struct sim_ctx *)ctx;
    return CUDA_SUCCESS;
}

CUAPI cuCtxGetDevice_v2(CUdevice *dev, CUcontext ctx)
{
    struct sim_ctx *c;
    CUresult r = ctx_arg(ctx, &c);
    if (r)
        return r;
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    *dev = c->dev;
    return CUDA_SUCCESS;
}

CUAPI cuCtxGetDevice(CUdevice *dev)
{
    return cuCtxGetDevice_v2(dev, NULL);
}

static uint64_t ctx_ready(struct sim_ctx *c)
{
    pthread_mutex_lock(&sim_mu);
    uint64_t t = sim_ready(&c->legacy);
    for (struct sim_stream *s = c->streams; s; s = s->next)
        if (sim_ready(s) > t)
            t = sim_ready(s);
    pthread_mutex_unlock(&sim_mu);
    for (size_t i = 0; i < sizeof ptds / sizeof ptds[0]; i++)
        if (ptds[i].ctx == c && sim_ready(ptds[i].s) > t)
            t = sim_ready(ptds[i].s);
    return t;
}

CUAPI cuCtxSynchronize_v2(CUcontext ctx)
{
    struct sim_ctx *c;
    CUresult r = ctx_arg(ctx, &c);
    if (r)
        return r;
    sim_sleep_until(ctx_ready(c));
    return CUDA_SUCCESS;
}

CUAPI cuCtxSynchronize(void)
{
    return cuCtxSynchronize_v2(NULL);
}

CUAPI cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    struct sim_ctx *c;
    CUresult r = ctx_arg(ctx, &c);
    if (r)
        return r;
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = 3020;
    return CUDA_SUCCESS;
}

CUAPI cuCtxGetFlags(unsigned int *flags)
{
    struct sim_ctx *c;
    CUresult r = sim_ctx_or_error(&c);
    if (r)
        return r;
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = c->flags;
    return CUDA_SUCCESS;
}

CUAPI cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    REQUIRE_INIT();
    if (least)
        *least = 0;
    if (greatest)
        *greatest = -5;
    return CUDA_SUCCESS;
}

static size_t limits[8] = {1024, 1048576, 8388608, 2, 2048, 0, 0, 0};

CUAPI cuCtxGetLimit(size_t *value, int limit)
{
    struct sim_ctx *c;
    CUresult r = sim_ctx_or_error(&c);
    if (r)
        return r;
    if (!value || limit < 0 || limit >= 8)
        return CUDA_ERROR_INVALID_VALUE;
    *value = limits[limit];
    return CUDA_SUCCESS;
}

CUAPI cuCtxSetLimit(int limit, size_t value)
{
    struct sim_ctx *c;
    CUresult r = sim_ctx_or_error(&c);
    if (r)
        return r;
    if (limit < 0 || limit >= 8)
        return CUDA_ERROR_INVALID_VALUE;
    limits[limit] = value;
    return CUDA_SUCCESS;
}

/* ---- primary contexts ------------------------------------------------ */

CUAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    REQUIRE_DEV(dev);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_mu);
    struct sim_ctx *c = primary[dev];
    if (c)
        primary_refs[dev]++;
    pthread_mutex_unlock(&sim_mu);
    if (!c) {
        CUresult r = ctx_new(dev, primary_flags[dev], 1, &c);
        if (r)
            return r;
        pthread_mutex_lock(&sim_mu);
        if (primary[dev]) { /* another thread won the race */
            pthread_mutex_unlock(&sim_mu);
            c->primary = 0;
            ctx_destroy(c);
            pthread_mutex_lock(&sim_mu);
            c = primary[dev];
        } else {
            primary[dev] = c;
        }
        primary_refs[dev]++;
        pthread_mutex_unlock(&sim_mu);
    }
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

static CUresult primary_drop(CUdevice dev, int reset)
{
    REQUIRE_DEV(dev);
    pthread_mutex_lock(&sim_mu);
    struct sim_ctx *c = primary[dev];
    if (!c || (!reset && primary_refs[dev] == 0)) {
        pthread_mutex_unlock(&sim_mu);
        return reset ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    }
    int last = reset || --primary_refs[dev] == 0;
    if (last) {
        primary[dev] = NULL;
        primary_refs[dev] = 0;
    }
    pthread_mutex_unlock(&sim_mu);
    if (last)
        ctx_destroy(c);
    return CUDA_SUCCESS;
}

CUAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return primary_drop(dev, 0); }
CUAPI cuDevicePrimaryCtxRelease(CUdevice dev) { return primary_drop(dev, 0); }
CUAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) { return primary_drop(dev, 1); }
CUAPI cuDevicePrimaryCtxReset(CUdevice dev) { return primary_drop(dev, 1); }

CUAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    REQUIRE_DEV(dev);
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_mu);
    *flags = primary_flags[dev];
    *active = primary[dev] != NULL;
    pthread_mutex_unlock(&sim_mu);
    return CUDA_SUCCESS;
}

CUAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    REQUIRE_DEV(dev);
    primary_flags[dev] = flags;
    return CUDA_SUCCESS;
}

CUAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
    return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}

/* ---- streams --------------------------------------------------------- */

static struct sim_stream *per_thread_stream(struct sim_ctx *c)
{
    size_t free_i = sizeof ptds / sizeof ptds[0];
    for (size_t i = 0; i < sizeof ptds / sizeof ptds[0]; i++) {
        if (ptds[i].ctx == c)
            return ptds[i].s;
        if (!ptds[i].ctx && free_i == sizeof ptds / sizeof ptds[0])
            free_i = i;
    }
    if (free_i == sizeof ptds / sizeof ptds[0])
        return &c->legacy; /* table full: fall back to legacy ordering */
    struct sim_stream *s = calloc(1, sizeof *s);
    if (!s)
        return &c->legacy;
    s->magic = MAGIC_STREAM;
    s->ctx = c;
    ptds[free_i].ctx = c;
    ptds[free_i].s = s;
    return s;
}

struct sim_stream *sim_stream_resolve(CUstream h, int ptds_default, CUresult *err)
{
    struct sim_ctx *c;
    *err = CUDA_SUCCESS;
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        if ((*err = sim_ctx_or_error(&c)))
            return NULL;
        if (h == CU_STREAM_PER_THREAD || (h == NULL && ptds_default))
            return per_thread_stream(c);
        return &c->legacy;
    }
    if ((*err = sim_check_init()))
        return NULL;
    struct sim_stream *s = (struct sim_stream *)h;
    pthread_mutex_lock(&sim_mu);
    int ok = 0;
    for (struct sim_ctx *i = ctx_list; i && !ok; i = i->next)
        for (struct sim_stream *j = i->streams; j && !ok; j = j->next)
            ok = j == s;
    pthread_mutex_unlock(&sim_mu);
    if (!ok) {
        *err = CUDA_ERROR_INVALID_HANDLE;
        return NULL;
    }
    return s;
}

/* Earliest start of new work on s: the legacy stream waits for every
 * blocking stream and they wait for it; non-blocking streams wait for none. */
uint64_t sim_stream_not_before(struct sim_stream *s)
{
    uint64_t t = sim_ready(s);
    struct sim_ctx *c = s->ctx;
    if (s->flags & CU_STREAM_NON_BLOCKING)
        return t;
    if (s == &c->legacy) {
        pthread_mutex_lock(&sim_mu);
        for (struct sim_stream *i = c->streams; i; i = i->next)
            if (!(i->flags & CU_STREAM_NON_BLOCKING) && sim_ready(i) > t)
                t = sim_ready(i);
        pthread_mutex_unlock(&sim_mu);
    } else if (sim_ready(&c->legacy) > t) {
        t = sim_ready(&c->legacy);
    }
    return t;
}

void sim_stream_sync_legacy(struct sim_ctx *c)
{
    sim_sleep_until(sim_stream_not_before(&c->legacy));
}

CUAPI cuStreamCreateWithPriority(CUstream *ph, unsigned int flags, int priority)
{
    struct sim_ctx *c;
    CUresult r = sim_ctx_or_error(&c);
    if (r)
        return r;
    if (!ph || (flags & ~CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_stream *s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->magic = MAGIC_STREAM;
    s->ctx = c;
    s->flags = flags;
    s->priority = priority < -5 ? -5 : priority > 0 ? 0 : priority;
    pthread_mutex_lock(&sim_mu);
    s->next = c->streams;
    c->streams = s;
    pthread_mutex_unlock(&sim_mu);
    *ph = (CUstream)s;
    return CUDA_SUCCESS;
}

CUAPI cuStreamCreate(CUstream *ph, unsigned int flags)
{
    return cuStreamCreateWithPriority(ph, flags, 0);
}

CUAPI cuStreamDestroy_v2(CUstream h)
{
    CUresult r;
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
        return sim_check_init() ? sim_check_init() : CUDA_ERROR_INVALID_HANDLE;
    struct sim_stream *s = sim_stream_resolve(h, 0, &r);
    if (!s)
        return r;
    pthread_mutex_lock(&sim_mu);
    for (struct sim_stream **p = &s->ctx->streams; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    pthread_mutex_unlock(&sim_mu);
    /* queued work still completes on the GPU timeline; the handle is gone */
    s->magic = MAGIC_DEAD;
    free(s);
    return CUDA_SUCCESS;
}

CUAPI cuStreamDestroy(CUstream h)
{
    return cuStreamDestroy_v2(h);
}

static CUresult stream_sync(CUstream h, int ptds_default)
{
    CUresult r;
    struct sim_stream *s = sim_stream_resolve(h, ptds_default, &r);
    if (!s)
        return r;
    if (s->capture)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    sim_sleep_until(sim_stream_not_before(s));
    return CUDA_SUCCESS;
}

CUAPI cuStreamSynchronize(CUstream h) { return stream_sync(h, 0); }
CUAPI cuStreamSynchronize_ptsz(CUstream h) { return stream_sync(h, 1); }

static CUresult stream_query(CUstream h, int ptds_default)
{
    CUresult r;
    struct sim_stream *s = sim_stream_resolve(h, ptds_default, &r);
    if (!s)
        return r;
    return sim_now_ns() >= sim_stream_not_before(s) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUAPI cuStreamQuery(CUstream h) { return stream_query(h, 0); }
CUAPI cuStreamQuery_ptsz(CUstream h) { return stream_query(h, 1); }

static CUresult stream_get_priority(CUstream h, int *p, int ptds_default)
{
    CUresult r;
    struct sim_stream *s = sim_stream_resolve(h, ptds_default, &r);
    if (!s)
        return r;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    *p = s->priority;
    return CUDA_SUCCESS;
}

CUAPI cuStreamGetPriority(CUstream h, int *p) { return stream_get_priority(h, p, 0); }
CUAPI cuStreamGetPriority_ptsz(CUstream h, int *p) { return stream_get_priority(h, p, 1); }

static CUresult stream_get_flags(CUstream h, unsigned *f, int ptds_default)
{
    CUresult r;
    struct sim_stream *s = sim_stream_resolve(h, ptds_default, &r);
    if (!s)
        return r;
    if (!f)
        return CUDA_ERROR_INVALID_VALUE;
    *f = s->flags;
    return CUDA_SUCCESS;
}

CUAPI cuStreamGetFlags(CUstream h, unsigned *f) { return stream_get_flags(h, f, 0); }
CUAPI cuStreamGetFlags_ptsz(CUstream h, unsigned *f) { return stream_get_flags(h, f, 1); }

static CUresult stream_get_ctx(CUstream h, CUcontext *pctx, void **green, int ptds_default)
{
    CUresult r;
    struct sim_stream *s = sim_stream_resolve(h, ptds_default, &r);
    if (!s)
        return r;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)s->ctx;
    if (green)
        *green = NULL;
    return CUDA_SUCCESS;
}

CUAPI cuStreamGetCtx(CUstream h, CUcontext *c) { return stream_get_ctx(h, c, NULL, 0); }
CUAPI cuStreamGetCtx_ptsz(CUstream h, CUcontext *c) { return stream_get_ctx(h, c, NULL, 1); }
CUAPI cuStreamGetCtx_v2(CUstream h, CUcontext *c, void **g) { return stream_get_ctx(h, c, g, 0); }
CUAPI cuStreamGetCtx_v2_ptsz(CUstream h, CUcontext *c, void **g) { return stream_get_ctx(h, c, g, 1); }

/* ---- events ---------------------------------------------------------- */

static struct sim_event *event_of(CUevent h)
{
    struct sim_event *e = (struct sim_event *)h;
    return e && e->magic == MAGIC_EVENT ? e : NULL;
}

CUAPI cuEventCreate(CUevent *ph, unsigned int flags)
{
    struct sim_ctx *c;
    CUresult r = sim_ctx_or_error(&c);
    if (r)
        return r;
    if (!ph || (flags & ~0x7u) || ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)))
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_event *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = MAGIC_EVENT;
    e->flags = flags;
    *ph = (CUevent)e;
    return CUDA_SUCCESS;
}

CUAPI cuEventDestroy_v2(CUevent h)
{
    REQUIRE_INIT();
    struct sim_event *e = event_of(h);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    e->magic = MAGIC_DEAD;
    free(e);
    return CUDA_SUCCESS;
}

CUAPI cuEventDestroy(CUevent h)
{
    return cuEventDestroy_v2(h);
}

static CUresult event_record(CUevent h, CUstream hs, int ptds_default)
{
    REQUIRE_INIT();
    struct sim_event *e = event_of(h);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r;
    struct sim_stream *s = sim_stream_resolve(hs, ptds_default, &r);
    if (!s)
        return r;
    if (s->capture) /* recorded when the graph runs, as a real driver's event record node */
        return sim_capture_event_record(s, e);
    uint64_t now = sim_now_ns(), t = sim_stream_not_before(s);
    e->time = t > now ? t : now;
    e->recorded = 1;
    return CUDA_SUCCESS;
}

CUAPI cuEventRecord(CUevent h, CUstream s) { return event_record(h, s, 0); }
CUAPI cuEventRecord_ptsz(CUevent h, CUstream s) { return event_record(h, s, 1); }
CUAPI cuEventRecordWithFlags(CUevent h, CUstream s, unsigned f) { (void)f; return event_record(h, s, 0); }
CUAPI cuEventRecordWithFlags_ptsz(CUevent h, CUstream s, unsigned f) { (void)f; return event_record(h, s, 1); }

CUAPI cuEventQuery(CUevent h)
{
    REQUIRE_INIT();
    struct sim_event *e = event_of(h);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    return !e->recorded || sim_now_ns() >= e->time ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUAPI cuEventSynchronize(CUevent h)
{
    REQUIRE_INIT();
    struct sim_event *e = event_of(h);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    if (e->recorded)
        sim_sleep_until(e->time);
    return CUDA_SUCCESS;
}

CUAPI cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    REQUIRE_INIT();
    struct sim_event *s = event_of(a), *e = event_of(b);
    if (!s || !e || !ms)
        return !ms ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
    if ((s->flags | e->flags) & CU_EVENT_DISABLE_TIMING)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!s->recorded || !e->recorded)
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t now = sim_now_ns();
    if (now < s->time || now < e->time)
        return CUDA_ERROR_NOT_READY;
    *ms = (float)((double)((int64_t)(e->time - s->time)) / 1e6);
    return CUDA_SUCCESS;
}

CUAPI cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b)
{
    return cuEventElapsedTime(ms, a, b);
}

static CUresult stream_wait_event(CUstream hs, CUevent h, unsigned flags, int ptds_default)
{
    REQUIRE_INIT();
    struct sim_event *e = event_of(h);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    if (flags & ~1u)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r;
    struct sim_stream *s = sim_stream_resolve(hs, ptds_default, &r);
    if (!s)
        return r;
    if (e->recorded)
        sim_ready_raise(s, e->time);
    return CUDA_SUCCESS;
}

CUAPI cuStreamWaitEvent(CUstream s, CUevent e, unsigned f) { return stream_wait_event(s, e, f, 0); }
CUAPI cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned f) { return stream_wait_event(s, e, f, 1); }

CUAPI cuGetExportTable(const void **table, const void *id)
{
    (void)id;
    if (table)
        *table = NULL;
    return CUDA_ERROR_NOT_SUPPORTED; /* private runtime tables are not simulated */
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
