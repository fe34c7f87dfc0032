/* Bytes per channel of a CUDA array element, by CUarray_format: one table for
 * the simulator (which allocates arrays by it) and the interposer (which
 * charges them by it). 0 is a format the table does not know; each caller
 * says what it does then. */
#ifndef GPUSLICE_ARRAY_FORMAT_H
#define GPUSLICE_ARRAY_FORMAT_H

#include <stdint.h>

#include "gpuslice_cuda.h"

static inline uint64_t gpuslice_format_bytes(int format)
{
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
    }
}

#endif
