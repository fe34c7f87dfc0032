/* Simulated NVML, what monitoring tools read (nvidia-smi and the like):
 * temperature, power, clocks, states and modes, engines and PCIe traffic.
 * Values follow the modelled load and the config (clock_mhz, power_limit_w);
 * what a data-centre GPU has not (a fan) is NVML_ERROR_NOT_SUPPORTED. */
#include <stddef.h>

#include "gpuslice_nvml.h"
#include "sim_nvml.h"
#include "sim_state.h"

#define NVAPI SIM_API nvmlReturn_t
#define IDLE_MW 60000u          /* an idle data-centre GPU draws about 60 W */
#define IDLE_C 30u              /* and sits at about 30 C, up to 45 C more at full load */
#define MEMORY_CLOCK_MHZ 1215u  /* HBM2e, as on A100; not configurable */
#define ENGINE_SAMPLE_US 167000u /* the sampling period NVML reports for the video engines */

static const struct sim_gpu_info *gpu(int idx)
{
    return &sim_machine()->gpu[idx];
}

NVAPI nvmlDeviceGetTemperature(nvmlDevice_t d, nvmlTemperatureSensors_t sensor, unsigned int *temp)
{
    SIM_NVML_DEVICE(d, idx);
    if (!temp || sensor != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = IDLE_C + sim_nvml_busy_percent(idx) * 45u / 100u;
    return NVML_SUCCESS;
}

/* The versioned form NVML 13 points callers to (the unversioned one is
 * deprecated there): a struct carrying its version and the sensor asked. */
NVAPI nvmlDeviceGetTemperatureV(nvmlDevice_t d, nvmlTemperature_t *t)
{
    if (!t)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (t->version != nvmlTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned int temp;
    nvmlReturn_t r = nvmlDeviceGetTemperature(d, t->sensorType, &temp);
    if (r == NVML_SUCCESS)
        t->temperature = (int)temp;
    return r;
}

NVAPI nvmlDeviceGetFanSpeed(nvmlDevice_t d, unsigned int *speed)
{
    SIM_NVML_DEVICE(d, idx);
    (void)idx;
    return speed ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT; /* passively cooled (SXM) */
}

NVAPI nvmlDeviceGetFanSpeed_v2(nvmlDevice_t d, unsigned int fan, unsigned int *speed)
{
    (void)fan;
    return nvmlDeviceGetFanSpeed(d, speed);
}

NVAPI nvmlDeviceGetPowerManagementLimit(nvmlDevice_t d, unsigned int *limit_mw)
{
    SIM_NVML_DEVICE(d, idx);
    if (!limit_mw)
        return NVML_ERROR_INVALID_ARGUMENT;
    *limit_mw = gpu(idx)->power_limit_mw;
    return NVML_SUCCESS;
}

NVAPI nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *limit_mw)
{
    return nvmlDeviceGetPowerManagementLimit(d, limit_mw);
}

NVAPI nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *power_mw)
{
    SIM_NVML_DEVICE(d, idx);
    if (!power_mw)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned limit = gpu(idx)->power_limit_mw;
    unsigned idle = limit > IDLE_MW ? IDLE_MW : limit;
    *power_mw = idle + (limit - idle) / 100u * sim_nvml_busy_percent(idx);
    return NVML_SUCCESS;
}

static nvmlReturn_t engine(nvmlDevice_t d, unsigned int *util, unsigned int *period_us)
{
    SIM_NVML_DEVICE(d, idx);
    (void)idx;
    if (!util || !period_us)
        return NVML_ERROR_INVALID_ARGUMENT;
    *util = 0; /* no video work is modelled */
    *period_us = ENGINE_SAMPLE_US;
    return NVML_SUCCESS;
}

NVAPI nvmlDeviceGetEncoderUtilization(nvmlDevice_t d, unsigned int *util, unsigned int *period_us)
{
    return engine(d, util, period_us);
}

NVAPI nvmlDeviceGetDecoderUtilization(nvmlDevice_t d, unsigned int *util, unsigned int *period_us)
{
    return engine(d, util, period_us);
}

NVAPI nvmlDeviceGetPerformanceState(nvmlDevice_t d, nvmlPstates_t *state)
{
    SIM_NVML_DEVICE(d, idx);
    (void)idx;
    if (!state)
        return NVML_ERROR_INVALID_ARGUMENT;
    *state = NVML_PSTATE_0; /* data-centre GPUs with persistence mode stay in P0 */
    return NVML_SUCCESS;
}

NVAPI nvmlDeviceGetPersistenceMode(nvmlDevice_t d, nvmlEnableState_t *mode)
{
    SIM_NVML_DEVICE(d, idx);
    (void)idx;
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mode = NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
}

NVAPI nvmlDeviceGetComputeMode(nvmlDevice_t d, nvmlComputeMode_t *mode)
{
    SIM_NVML_DEVICE(d, idx);
    (void)idx;
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mode = NVML_COMPUTEMODE_DEFAULT; /* shared: gpuslice's slices are processes of many containers */
    return NVML_SUCCESS;
}

static nvmlReturn_t clock_mhz(nvmlDevice_t d, nvmlClockType_t type, unsigned int *mhz)
{
    SIM_NVML_DEVICE(d, idx);
    if (!mhz)
        return NVML_ERROR_INVALID_ARGUMENT;
    switch (type) {
    case NVML_CLOCK_GRAPHICS:
    case NVML_CLOCK_SM:
    case NVML_CLOCK_VIDEO:
        *mhz = (unsigned)gpu(idx)->clock_khz / 1000u;
        return NVML_SUCCESS;
    case NVML_CLOCK_MEM:
        *mhz = MEMORY_CLOCK_MHZ;
        return NVML_SUCCESS;
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

NVAPI nvmlDeviceGetClockInfo(nvmlDevice_t d, nvmlClockType_t type, unsigned int *mhz)
{
    return clock_mhz(d, type, mhz); /* the model runs at its one clock: current = max */
}

NVAPI nvmlDeviceGetMaxClockInfo(nvmlDevice_t d, nvmlClockType_t type, unsigned int *mhz)
{
    return clock_mhz(d, type, mhz);
}

NVAPI nvmlDeviceGetPcieThroughput(nvmlDevice_t d, nvmlPcieUtilCounter_t counter, unsigned int *kb_per_s)
{
    SIM_NVML_DEVICE(d, idx);
    (void)idx;
    if (!kb_per_s || (counter != NVML_PCIE_UTIL_TX_BYTES && counter != NVML_PCIE_UTIL_RX_BYTES))
        return NVML_ERROR_INVALID_ARGUMENT;
    *kb_per_s = 0; /* copies are modelled in time, not as PCIe traffic */
    return NVML_SUCCESS;
}
