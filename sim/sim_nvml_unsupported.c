/* Every function nvml.h declares that the simulator does not model, exported
 * anyway and answering NVML_ERROR_NOT_SUPPORTED, as a current driver does for
 * a feature its GPU lacks. A driver of the header's generation exports every
 * name, and clients choose struct layouts and fallbacks by which names exist
 * (nvitop, pynvml): a simulator exporting fewer would steer them onto paths
 * no real driver of that generation takes. Weak, as in
 * sim_cuda_unsupported.c: a file that models a function wins at link time.
 * The stubs take no arguments and read none. */
#include "gpuslice_nvml.h"

#define FWD(name)                                                          \
    __attribute__((weak, visibility("default"))) nvmlReturn_t name(void); \
    __attribute__((weak, visibility("default"))) nvmlReturn_t name(void)  \
    {                                                                      \
        return NVML_ERROR_NOT_SUPPORTED;                                   \
    }
#include "nvml_exports.def"
#undef FWD
