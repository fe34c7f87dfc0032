/* Simulated NVML, the other ways a driver lists processes: graphics and MPS
 * clients (none: the simulator runs compute contexts, and no MPS server),
 * nvmlDeviceGetRunningProcessDetailList (one mode's processes, in the detail
 * struct) and nvmlDeviceGetProcessesUtilizationInfo (the samples of
 * nvmlDeviceGetProcessUtilization in the newer struct). Each answers from
 * the same model as the calls it stands beside (sim_nvml.c), with nvml.h's
 * rules for sizes, versions and modes. */
#include <string.h>

#include "gpuslice_nvml.h"
#include "sim_nvml.h"
#include "sim_state.h"

#define NVAPI SIM_API nvmlReturn_t

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned int *,
                                             unsigned long long);

static nvmlReturn_t none(nvmlDevice_t d, unsigned int *count)
{
    SIM_NVML_DEVICE(d, idx);
    (void)idx;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}

NVAPI nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *i)
{
    (void)i;
    return none(d, c);
}

NVAPI nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i)
{
    (void)i;
    return none(d, c);
}

NVAPI nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i)
{
    (void)i;
    return none(d, c);
}

NVAPI nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *i)
{
    (void)i;
    return none(d, c);
}

/* Sized as nvml.h says: NULL and 0 ask the count (INSUFFICIENT_SIZE when
 * there is any, SUCCESS when none); too small an array is INSUFFICIENT_SIZE
 * with the count needed. */
NVAPI nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t d, nvmlProcessDetailList_t *plist)
{
    if (!plist || plist->version != nvmlProcessDetailList_v1 || plist->mode > NVML_PROCESS_MODE_ALL)
        return sim_nvml_index(d) == -2 ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
    if (plist->mode == NVML_PROCESS_MODE_GRAPHICS || plist->mode == NVML_PROCESS_MODE_MPS)
        return none(d, &plist->numProcArrayEntries);
    nvmlProcessInfo_t all[SIM_MAX_PROCS];
    unsigned n = SIM_MAX_PROCS;
    nvmlReturn_t r = nvmlDeviceGetComputeRunningProcesses_v3(d, &n, all);
    if (r != NVML_SUCCESS)
        return r;
    unsigned room = plist->procArray ? plist->numProcArrayEntries : 0;
    for (unsigned i = 0; i < n && i < room; i++)
        plist->procArray[i] = (nvmlProcessDetail_v1_t){.pid = all[i].pid, .usedGpuMemory = all[i].usedGpuMemory,
                                                      .gpuInstanceId = all[i].gpuInstanceId,
                                                      .computeInstanceId = all[i].computeInstanceId};
    plist->numProcArrayEntries = n;
    return n > room ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

/* The samples since lastSeenTimeStamp, each as nvmlDeviceGetProcessUtilization
 * gives it (the JPEG and OFA engines idle). */
NVAPI nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t d, nvmlProcessesUtilizationInfo_t *info)
{
    if (!info)
        return sim_nvml_index(d) == -2 ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlProcessesUtilizationInfo_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlProcessUtilizationSample_t samples[SIM_MAX_PROCS * 8];
    unsigned n = sizeof samples / sizeof samples[0];
    nvmlReturn_t r = nvmlDeviceGetProcessUtilization(d, samples, &n, info->lastSeenTimeStamp);
    if (r == NVML_ERROR_NOT_FOUND || r == NVML_ERROR_INSUFFICIENT_SIZE)
        info->processSamplesCount = r == NVML_ERROR_NOT_FOUND ? 0 : n;
    if (r != NVML_SUCCESS)
        return r;
    unsigned room = info->procUtilArray ? info->processSamplesCount : 0;
    for (unsigned i = 0; i < n && i < room; i++)
        info->procUtilArray[i] = (nvmlProcessUtilizationInfo_v1_t){
            .timeStamp = samples[i].timeStamp, .pid = samples[i].pid, .smUtil = samples[i].smUtil,
            .memUtil = samples[i].memUtil, .encUtil = samples[i].encUtil, .decUtil = samples[i].decUtil};
    info->processSamplesCount = n;
    return n > room ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}
