/* What the simulated NVML's files share: a device handle's index, and how busy
 * a GPU was over the last second. */
#ifndef SIM_NVML_H
#define SIM_NVML_H

#include "gpuslice_nvml.h"

/* the handle's GPU index; -1 for a handle that is no device, -2 before nvmlInit */
int sim_nvml_index(nvmlDevice_t d);
/* percent of the last second the GPU ran kernels */
unsigned sim_nvml_busy_percent(int idx);

#endif
