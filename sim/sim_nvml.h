/* What the simulated NVML's files share: a device handle's index, and how busy
 * a GPU was over the last second. */
#ifndef SIM_NVML_H
#define SIM_NVML_H

#include "gpuslice_nvml.h"

/* the handle's GPU index; -1 for a handle that is no device, -2 before nvmlInit */
int sim_nvml_index(nvmlDevice_t d);
/* in an entry point: `idx`, the handle's GPU index, or the error NVML answers for a bad handle */
#define SIM_NVML_DEVICE(d, idx)          \
    int idx = sim_nvml_index(d);         \
    if (idx == -2)                       \
        return NVML_ERROR_UNINITIALIZED; \
    if (idx < 0)                         \
        return NVML_ERROR_INVALID_ARGUMENT

/* percent of the last second the GPU ran kernels */
unsigned sim_nvml_busy_percent(int idx);

#endif
