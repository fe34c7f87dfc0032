/* The JIT linker (cuLink*): PTX inputs are joined into one image, which
 * cuModuleLoadData reads like any PTX (kernels, globals); a binary input
 * (cubin, fatbin, object, library) makes the result an opaque image, whose
 * every kernel name resolves, as the simulator treats binaries anyway. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_cuda.h"

#define MAGIC_LINK 0x4c4e4b31u
#define MAX_INPUT (64u << 20)
static const char OPAQUE_IMAGE[] = "\x7f" "gpuslice-sim linked binary";

struct sim_link {
    uint32_t magic;
    char *text; /* the PTX inputs, NUL-terminated */
    size_t len;
    int binary; /* a non-PTX input was added */
};

static struct sim_link *link_of(CUlinkState h)
{
    struct sim_link *l = (struct sim_link *)h;
    return l && l->magic == MAGIC_LINK ? l : NULL;
}

CUAPI cuLinkCreate_v2(unsigned n, CUjit_option *options, void **values, CUlinkState *out)
{
    (void)n, (void)options, (void)values; /* JIT options tune code the simulator does not make */
    SIM_ENTER();
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_link *l = calloc(1, sizeof *l);
    if (!l)
        return CUDA_ERROR_OUT_OF_MEMORY;
    l->magic = MAGIC_LINK;
    *out = (CUlinkState)l;
    return CUDA_SUCCESS;
}

CUAPI cuLinkCreate(unsigned n, CUjit_option *options, void **values, CUlinkState *out)
{
    return cuLinkCreate_v2(n, options, values, out);
}

CUAPI cuLinkAddData_v2(CUlinkState h, CUjitInputType type, void *data, size_t size, const char *name, unsigned n,
                       CUjit_option *options, void **values)
{
    (void)name, (void)n, (void)options, (void)values;
    SIM_ENTER();
    struct sim_link *l = link_of(h);
    if (!l || !data || size == 0 || size > MAX_INPUT)
        return CUDA_ERROR_INVALID_VALUE;
    if (type == CU_JIT_INPUT_NVVM)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (type != CU_JIT_INPUT_PTX) {
        l->binary = 1;
        return CUDA_SUCCESS;
    }
    CUresult jit = sim_ptx_jit();
    if (jit != CUDA_SUCCESS)
        return jit;
    size_t add = strnlen(data, size);
    char *t = realloc(l->text, l->len + add + 2);
    if (!t)
        return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(t + l->len, data, add);
    l->len += add;
    t[l->len++] = '\n';
    t[l->len] = 0;
    l->text = t;
    return CUDA_SUCCESS;
}

CUAPI cuLinkAddData(CUlinkState h, CUjitInputType type, void *data, size_t size, const char *name, unsigned n,
                    CUjit_option *options, void **values)
{
    return cuLinkAddData_v2(h, type, data, size, name, n, options, values);
}

/* A file's bytes, NUL-terminated (PTX is text), at most MAX_INPUT of them. */
CUresult sim_read_image(const char *path, char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return CUDA_ERROR_FILE_NOT_FOUND;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *buf = size > 0 && (size_t)size <= MAX_INPUT ? malloc((size_t)size + 1) : NULL;
    size_t got = buf && fseek(f, 0, SEEK_SET) == 0 ? fread(buf, 1, (size_t)size, f) : 0;
    fclose(f);
    CUresult r = size <= 0 || (size_t)size > MAX_INPUT ? CUDA_ERROR_INVALID_IMAGE
                 : !buf                                  ? CUDA_ERROR_OUT_OF_MEMORY
                 : got != (size_t)size                   ? CUDA_ERROR_FILE_NOT_FOUND
                                                         : CUDA_SUCCESS;
    if (r) {
        free(buf);
        return r;
    }
    buf[got] = 0;
    *out = buf;
    *len = got;
    return CUDA_SUCCESS;
}

CUAPI cuLinkAddFile_v2(CUlinkState h, CUjitInputType type, const char *path, unsigned n, CUjit_option *options,
                       void **values)
{
    SIM_ENTER();
    if (!link_of(h) || !path)
        return CUDA_ERROR_INVALID_VALUE;
    char *buf;
    size_t len;
    if ((r = sim_read_image(path, &buf, &len)))
        return r == CUDA_ERROR_INVALID_IMAGE ? CUDA_ERROR_INVALID_VALUE : r;
    r = cuLinkAddData_v2(h, type, buf, len, path, n, options, values);
    free(buf);
    return r;
}

CUAPI cuLinkAddFile(CUlinkState h, CUjitInputType type, const char *path, unsigned n, CUjit_option *options,
                    void **values)
{
    return cuLinkAddFile_v2(h, type, path, n, options, values);
}

/* The image stays the link state's until cuLinkDestroy, as CUDA says. */
CUAPI cuLinkComplete(CUlinkState h, void **image, size_t *size)
{
    SIM_ENTER();
    struct sim_link *l = link_of(h);
    if (!l || !image || !size)
        return CUDA_ERROR_INVALID_VALUE;
    if (!l->len && !l->binary)
        return CUDA_ERROR_INVALID_IMAGE; /* nothing was added */
    if (l->binary) {
        *image = (void *)OPAQUE_IMAGE;
        *size = sizeof OPAQUE_IMAGE;
    } else {
        *image = l->text;
        *size = l->len + 1;
    }
    return CUDA_SUCCESS;
}

CUAPI cuLinkDestroy(CUlinkState h)
{
    SIM_ENTER();
    struct sim_link *l = link_of(h);
    if (!l)
        return CUDA_ERROR_INVALID_VALUE;
    l->magic = 0;
    free(l->text);
    free(l);
    return CUDA_SUCCESS;
}
