/* Simulated driver: CUDA arrays and mipmapped arrays (device memory charged
 * like any other allocation). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "gpuslice_array_format.h"
#include "sim_cuda.h"
#include "sim_memory.h"

/* ---- arrays ---------------------------------------------------------- */

struct sim_array {
    uint32_t magic;
    int dev;
    CUDA_ARRAY3D_DESCRIPTOR desc;
    size_t bytes;
    void *data;
};

struct sim_mipmap {
    uint32_t magic;
    unsigned levels;
    struct sim_array *level[32];
};

static size_t format_bytes(CUarray_format f)
{
    return (size_t)gpuslice_format_bytes((int)f); /* 0: a format not modelled, refused */
}

static size_t array_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    size_t e = format_bytes(d->Format);
    if (!e || d->Width == 0 || (d->NumChannels != 1 && d->NumChannels != 2 && d->NumChannels != 4))
        return 0;
    size_t h = d->Height ? d->Height : 1, z = d->Depth ? d->Depth : 1;
    size_t row = d->Width * e * d->NumChannels;
    if (row / d->Width != e * d->NumChannels || h > SIZE_MAX / row || z > SIZE_MAX / (row * h))
        return 0;
    return row * h * z;
}

static CUresult array_new(const CUDA_ARRAY3D_DESCRIPTOR *d, struct sim_array **out)
{
    struct sim_ctx *c;
    CUresult r = sim_ctx_or_error(&c);
    if (r)
        return r;
    size_t bytes = d ? array_bytes(d) : 0;
    if (!bytes || (d->Depth && !d->Height))
        return CUDA_ERROR_INVALID_VALUE;
    if (sim_mem_charge(c->dev, bytes))
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim_array *a = calloc(1, sizeof *a);
    void *data = a ? sim_map_lazy(bytes, 0) : NULL;
    if (!data) {
        free(a);
        sim_mem_uncharge(c->dev, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *a = (struct sim_array){.magic = MAGIC_ARRAY, .dev = c->dev, .desc = *d, .bytes = bytes, .data = data};
    *out = a;
    return CUDA_SUCCESS;
}

static void array_free(struct sim_array *a)
{
    munmap(a->data, a->bytes);
    sim_mem_uncharge(a->dev, a->bytes);
    a->magic = MAGIC_DEAD;
    free(a);
}

CUAPI cuArray3DCreate_v2(CUarray *h, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    if (!h)
        return sim_check_init() ? sim_check_init() : CUDA_ERROR_INVALID_VALUE;
    struct sim_array *a;
    CUresult r = array_new(d, &a);
    if (r == CUDA_SUCCESS)
        *h = (CUarray)a;
    return r;
}

CUAPI cuArrayCreate_v2(CUarray *h, const CUDA_ARRAY_DESCRIPTOR *d)
{
    if (!d)
        return sim_check_init() ? sim_check_init() : CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d3 = {.Width = d->Width, .Height = d->Height, .Format = d->Format,
                                  .NumChannels = d->NumChannels};
    return cuArray3DCreate_v2(h, &d3);
}

static struct sim_array *array_of(CUarray h)
{
    struct sim_array *a = (struct sim_array *)h;
    return a && a->magic == MAGIC_ARRAY ? a : NULL;
}

CUAPI cuArrayDestroy(CUarray h)
{
    SIM_ENTER();
    struct sim_array *a = array_of(h);
    if (!a)
        return CUDA_ERROR_INVALID_HANDLE;
    array_free(a);
    return CUDA_SUCCESS;
}

CUAPI cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR *d, CUarray h)
{
    SIM_ENTER();
    struct sim_array *a = array_of(h);
    if (!a)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    *d = a->desc;
    return CUDA_SUCCESS;
}

CUAPI cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR *d, CUarray h)
{
    CUDA_ARRAY3D_DESCRIPTOR d3;
    CUresult r = cuArray3DGetDescriptor_v2(d ? &d3 : NULL, h);
    if (r == CUDA_SUCCESS) {
        if (d3.Depth)
            return CUDA_ERROR_INVALID_VALUE;
        *d = (CUDA_ARRAY_DESCRIPTOR){d3.Width, d3.Height, d3.Format, d3.NumChannels};
    }
    return r;
}

CUAPI cuMipmappedArrayCreate(CUmipmappedArray *h, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    SIM_ENTER();
    if (!h || !d || levels == 0 || levels > 32)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_mipmap *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->magic = MAGIC_MIPMAP;
    CUDA_ARRAY3D_DESCRIPTOR ld = *d;
    for (unsigned i = 0; i < levels; i++) {
        r = array_new(&ld, &m->level[i]);
        if (r) { /* all or nothing */
            for (unsigned j = 0; j < i; j++)
                array_free(m->level[j]);
            free(m);
            return r;
        }
        m->levels = i + 1;
        ld.Width = ld.Width > 1 ? ld.Width / 2 : 1;
        ld.Height = ld.Height > 1 ? ld.Height / 2 : ld.Height;
        ld.Depth = ld.Depth > 1 ? ld.Depth / 2 : ld.Depth;
    }
    *h = (CUmipmappedArray)m;
    return CUDA_SUCCESS;
}

static struct sim_mipmap *mipmap_of(CUmipmappedArray h)
{
    struct sim_mipmap *m = (struct sim_mipmap *)h;
    return m && m->magic == MAGIC_MIPMAP ? m : NULL;
}

CUAPI cuMipmappedArrayDestroy(CUmipmappedArray h)
{
    SIM_ENTER();
    struct sim_mipmap *m = mipmap_of(h);
    if (!m)
        return CUDA_ERROR_INVALID_HANDLE;
    for (unsigned i = 0; i < m->levels; i++)
        array_free(m->level[i]);
    m->magic = MAGIC_DEAD;
    free(m);
    return CUDA_SUCCESS;
}

CUAPI cuMipmappedArrayGetLevel(CUarray *out, CUmipmappedArray h, unsigned int level)
{
    SIM_ENTER();
    struct sim_mipmap *m = mipmap_of(h);
    if (!m)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!out || level >= m->levels)
        return CUDA_ERROR_INVALID_VALUE;
    *out = (CUarray)m->level[level];
    return CUDA_SUCCESS;
}
