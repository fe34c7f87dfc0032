/* Simulated driver: copies and sets, checked against the allocation table. */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>
#include "sim_cuda.h"
#include "sim_memory.h"

/* ---- copies and sets ------------------------------------------------- */

enum side { HOST_SIDE, DEVICE_SIDE, ANY_SIDE };

/* A pointer claimed to be device memory must lie inside one accessible
 * allocation; with unified addressing (ANY_SIDE) unknown pointers are host. */
static int check_side(uint64_t p, size_t n, enum side s)
{
    if (s == HOST_SIDE)
        return p != 0 || n == 0;
    pthread_mutex_lock(&sim_mu);
    struct alloc *a = sim_alloc_find(p);
    int ok = a ? (a->accessible && p + n <= a->base + a->size) : (s == ANY_SIDE && p != 0);
    pthread_mutex_unlock(&sim_mu);
    return ok;
}

static CUresult do_copy(uint64_t dst, enum side ds, uint64_t src, enum side ss, size_t n, CUstream hs, int async,
                        int ptds)
{
    SIM_ENTER();
    struct sim_stream *s = sim_stream_resolve(hs, ptds, &r);
    if (!s)
        return r;
    if (n == 0)
        return CUDA_SUCCESS;
    if (!check_side(dst, n, ds) || !check_side(src, n, ss))
        return CUDA_ERROR_INVALID_VALUE;
    if (s->capture)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (!async) { /* synchronous copies are ordered after queued work */
        struct sim_point after = sim_stream_after(s);
        sim_point_wait(&after);
    }
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

#define H(p) ((uint64_t)(uintptr_t)(p))
CUAPI cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { return do_copy(d, ANY_SIDE, s, ANY_SIDE, n, NULL, 0, 0); }
CUAPI cuMemcpy_ptds(CUdeviceptr d, CUdeviceptr s, size_t n) { return do_copy(d, ANY_SIDE, s, ANY_SIDE, n, NULL, 0, 1); }
CUAPI cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return do_copy(d, ANY_SIDE, s, ANY_SIDE, n, st, 1, 0); }
CUAPI cuMemcpyAsync_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return do_copy(d, ANY_SIDE, s, ANY_SIDE, n, st, 1, 1); }
CUAPI cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { return do_copy(d, DEVICE_SIDE, H(s), HOST_SIDE, n, NULL, 0, 0); }
CUAPI cuMemcpyHtoD_v2_ptds(CUdeviceptr d, const void *s, size_t n) { return do_copy(d, DEVICE_SIDE, H(s), HOST_SIDE, n, NULL, 0, 1); }
CUAPI cuMemcpyHtoD(CUdeviceptr_v1 d, const void *s, unsigned n) { return do_copy(d, DEVICE_SIDE, H(s), HOST_SIDE, n, NULL, 0, 0); }
CUAPI cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { return do_copy(H(d), HOST_SIDE, s, DEVICE_SIDE, n, NULL, 0, 0); }
CUAPI cuMemcpyDtoH_v2_ptds(void *d, CUdeviceptr s, size_t n) { return do_copy(H(d), HOST_SIDE, s, DEVICE_SIDE, n, NULL, 0, 1); }
CUAPI cuMemcpyDtoH(void *d, CUdeviceptr_v1 s, unsigned n) { return do_copy(H(d), HOST_SIDE, s, DEVICE_SIDE, n, NULL, 0, 0); }
CUAPI cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { return do_copy(d, DEVICE_SIDE, s, DEVICE_SIDE, n, NULL, 0, 0); }
CUAPI cuMemcpyDtoD_v2_ptds(CUdeviceptr d, CUdeviceptr s, size_t n) { return do_copy(d, DEVICE_SIDE, s, DEVICE_SIDE, n, NULL, 0, 1); }
CUAPI cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream st) { return do_copy(d, DEVICE_SIDE, H(s), HOST_SIDE, n, st, 1, 0); }
CUAPI cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d, const void *s, size_t n, CUstream st) { return do_copy(d, DEVICE_SIDE, H(s), HOST_SIDE, n, st, 1, 1); }
CUAPI cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUstream st) { return do_copy(H(d), HOST_SIDE, s, DEVICE_SIDE, n, st, 1, 0); }
CUAPI cuMemcpyDtoHAsync_v2_ptsz(void *d, CUdeviceptr s, size_t n, CUstream st) { return do_copy(H(d), HOST_SIDE, s, DEVICE_SIDE, n, st, 1, 1); }
CUAPI cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return do_copy(d, DEVICE_SIDE, s, DEVICE_SIDE, n, st, 1, 0); }
CUAPI cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return do_copy(d, DEVICE_SIDE, s, DEVICE_SIDE, n, st, 1, 1); }

static CUresult do_set(CUdeviceptr d, unsigned value, unsigned width, size_t count, CUstream hs, int async, int ptds)
{
    SIM_ENTER();
    struct sim_stream *s = sim_stream_resolve(hs, ptds, &r);
    if (!s)
        return r;
    if (count == 0)
        return CUDA_SUCCESS;
    if (count > SIZE_MAX / width || (d % width) || !check_side(d, count * width, DEVICE_SIDE))
        return CUDA_ERROR_INVALID_VALUE;
    if (s->capture)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (!async) {
        struct sim_point after = sim_stream_after(s);
        sim_point_wait(&after);
    }
    unsigned char *p = (unsigned char *)(uintptr_t)d;
    if (width == 1) {
        memset(p, (int)(value & 0xff), count);
    } else {
        for (size_t i = 0; i < count; i++)
            memcpy(p + i * width, width == 2 ? (void *)&(uint16_t){(uint16_t)value} : (void *)&(uint32_t){value}, width);
    }
    return CUDA_SUCCESS;
}

CUAPI cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { return do_set(d, v, 1, n, NULL, 0, 0); }
CUAPI cuMemsetD8_v2_ptds(CUdeviceptr d, unsigned char v, size_t n) { return do_set(d, v, 1, n, NULL, 0, 1); }
CUAPI cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) { return do_set(d, v, 2, n, NULL, 0, 0); }
CUAPI cuMemsetD16_v2_ptds(CUdeviceptr d, unsigned short v, size_t n) { return do_set(d, v, 2, n, NULL, 0, 1); }
CUAPI cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) { return do_set(d, v, 4, n, NULL, 0, 0); }
CUAPI cuMemsetD32_v2_ptds(CUdeviceptr d, unsigned int v, size_t n) { return do_set(d, v, 4, n, NULL, 0, 1); }
CUAPI cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { return do_set(d, v, 1, n, s, 1, 0); }
CUAPI cuMemsetD8Async_ptsz(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { return do_set(d, v, 1, n, s, 1, 1); }
CUAPI cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) { return do_set(d, v, 2, n, s, 1, 0); }
CUAPI cuMemsetD16Async_ptsz(CUdeviceptr d, unsigned short v, size_t n, CUstream s) { return do_set(d, v, 2, n, s, 1, 1); }
CUAPI cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s) { return do_set(d, v, 4, n, s, 1, 0); }
CUAPI cuMemsetD32Async_ptsz(CUdeviceptr d, unsigned int v, size_t n, CUstream s) { return do_set(d, v, 4, n, s, 1, 1); }
