/* What the simulator reads from PTX text beyond its kernels' names:
 * - the variables it declares in a state space (.global for
 *   cuModuleGetGlobal, .const for a function's constant bytes, .shared and
 *   .local inside a kernel's body), found and sized. A declaration is a
 *   statement of its own, e.g.
 *     .visible .global .align 4 .b8 table[1024];
 *     .global .f32 scale = 1.0;
 *   ld.global/st.global instructions and .extern declarations (no storage of
 *   their own) are not declarations;
 * - a kernel's parameters (offset and size, as the ABI lays them out), its
 *   performance directives (.maxntid, .reqntid, .maxnreg) and a register
 *   count: the virtual registers its body declares (.reg .b32 %r<9> is 9; a
 *   64-bit one counts 2, a predicate none), at least 2, at most .maxnreg or
 *   255. ptxas allocates fewer for a large kernel; this is the documented
 *   model (docs/simulator.md), not a compiler. */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "sim_cuda.h"

static size_t type_size(const char *t, size_t n)
{
    static const struct {
        const char *name;
        size_t bytes;
    } types[] = {{"b8", 1},  {"u8", 1},  {"s8", 1},  {"b16", 2}, {"u16", 2}, {"s16", 2}, {"f16", 2},
                 {"b32", 4}, {"u32", 4}, {"s32", 4}, {"f32", 4}, {"b64", 8}, {"u64", 8}, {"s64", 8},
                 {"f64", 8}, {"pred", 1}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strlen(types[i].name) == n && strncmp(t, types[i].name, n) == 0)
            return types[i].bytes;
    return 0;
}

/* The statement that begins at p (after whitespace), up to its ';'. */
static int parse(const char *p, const char *end, struct sim_global *g)
{
    size_t elem = 0;
    while (p < end) { /* directives: .visible .weak .global .align N .TYPE */
        while (p < end && isspace((unsigned char)*p))
            p++;
        if (*p != '.')
            break;
        const char *w = ++p;
        while (p < end && (isalnum((unsigned char)*p) || *p == '_'))
            p++;
        size_t n = (size_t)(p - w);
        if (n == 6 && strncmp(w, "extern", 6) == 0)
            return 0;
        if (n == 5 && strncmp(w, "align", 5) == 0)
            strtoul(p, (char **)&p, 10);
        else if (type_size(w, n))
            elem = type_size(w, n);
    }
    const char *name = p;
    while (p < end && (isalnum((unsigned char)*p) || *p == '_' || *p == '$'))
        p++;
    size_t len = (size_t)(p - name);
    if (!elem || !len || len >= sizeof g->name)
        return 0;
    size_t count = 1;
    while (p < end && *p == '[') { /* each dimension multiplies */
        char *after;
        unsigned long d = strtoul(p + 1, &after, 10);
        if (*after != ']' || d == 0)
            return 0;
        count *= d;
        p = after + 1;
    }
    memcpy(g->name, name, len);
    g->name[len] = 0;
    g->size = elem * count;
    g->ptr = 0;
    return 1;
}

/* Only directives (.visible, .weak, ...) and blanks between a statement's start and q. */
static int only_directives(const char *start, const char *q)
{
    for (const char *c = start; c < q; c++) {
        if (isspace((unsigned char)*c))
            continue;
        if (*c != '.')
            return 0;
        while (c + 1 < q && isalpha((unsigned char)c[1]))
            c++;
    }
    return 1;
}

/* The variables declared in state space `space` (".global", ...) in [ptx, stop):
 * the first max into out, and the bytes of all of them into *total if given. */
static int vars(const char *ptx, const char *stop, const char *space, struct sim_global *out, int max,
                size_t *total)
{
    size_t k = strlen(space);
    int n = 0;
    struct sim_global g;
    for (const char *p = memmem(ptx, (size_t)(stop - ptx), space, k); p;
         p = memmem(p + k, (size_t)(stop - p - (ptrdiff_t)k), space, k)) {
        if ((p > ptx && !isspace((unsigned char)p[-1])) || isalnum((unsigned char)p[k]))
            continue; /* ld.global, st.shared, cvta.global, .sharedmem ... */
        const char *start = p;
        while (start > ptx && !strchr(";{}\n", start[-1]))
            start--;
        const char *end = memchr(p, ';', (size_t)(stop - p));
        if (!end)
            break;
        if (!only_directives(start, p) || !parse(start, end, &g))
            continue;
        if (total)
            *total += g.size;
        if (n < max)
            out[n++] = g;
        else if (!total)
            break;
    }
    return n;
}

int sim_ptx_globals(const char *ptx, struct sim_global *out, int max)
{
    return vars(ptx, ptx + strlen(ptx), ".global", out, max, NULL);
}

static size_t bytes_in(const char *ptx, const char *stop, const char *space)
{
    size_t total = 0;
    vars(ptx, stop, space, NULL, 0, &total);
    return total;
}

size_t sim_ptx_const_bytes(const char *ptx)
{
    return bytes_in(ptx, ptx + strlen(ptx), ".const");
}

/* The word after `p` if it is `.NAME` ; its length (0 if none). */
static size_t directive(const char *p, const char *end, const char **word)
{
    while (p < end && isspace((unsigned char)*p))
        p++;
    if (p >= end || *p != '.')
        return 0;
    const char *w = ++p;
    while (p < end && (isalnum((unsigned char)*p) || *p == '_'))
        p++;
    *word = w;
    return (size_t)(p - w);
}

/* One parameter, "[.param] [.align N] .TYPE [.ptr .SPACE .align M] name[N]": its size and alignment. */
static int param(const char *p, const char *end, uint32_t *size, uint32_t *align)
{
    size_t elem = 0, al = 0, n;
    const char *w;
    while ((n = directive(p, end, &w)) > 0) {
        p = w + n;
        if (n == 5 && strncmp(w, "align", 5) == 0) {
            unsigned long a = strtoul(p, (char **)&p, 10);
            if (!elem) /* after the type, in ".ptr ... .align N", it is the pointee's */
                al = a;
        } else if (type_size(w, n))
            elem = type_size(w, n);
    }
    if (!elem)
        return 0;
    const char *b = memchr(p, '[', (size_t)(end - p));
    size_t count = b ? strtoul(b + 1, NULL, 10) : 1;
    *size = (uint32_t)(elem * (count ? count : 1));
    *align = (uint32_t)(al ? al : elem);
    return 1;
}

static void params(const char *open, const char *close, struct sim_kernel_info *k)
{
    uint32_t offset = 0;
    k->n_params = 0;
    for (const char *p = open + 1; p < close && k->n_params < SIM_MAX_PARAMS;) {
        const char *comma = memchr(p, ',', (size_t)(close - p));
        const char *end = comma ? comma : close;
        uint32_t size, align;
        if (param(p, end, &size, &align)) {
            offset = (offset + align - 1) / align * align;
            k->param_offset[k->n_params] = offset;
            k->param_size[k->n_params++] = size;
            offset += size;
        }
        p = end + 1;
    }
}

/* Numbers after a directive, e.g. ".maxntid 256, 1, 1": their product. */
static int product_after(const char *from, const char *to, const char *name)
{
    const char *d = memmem(from, (size_t)(to - from), name, strlen(name));
    if (!d)
        return 0;
    long prod = 1;
    char *p = (char *)d + strlen(name);
    for (int i = 0; i < 3; i++) {
        long v = strtol(p, &p, 10);
        prod *= v > 0 ? v : 1;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p != ',')
            break;
        p++;
    }
    return prod > 1024 ? 1024 : (int)prod;
}

static int registers(const char *body, const char *end, int maxnreg)
{
    long regs = 0;
    const char *w;
    for (const char *p = memmem(body, (size_t)(end - body), ".reg", 4); p;
         p = memmem(p + 4, (size_t)(end - p - 4), ".reg", 4)) {
        size_t n = directive(p + 4, end, &w);
        size_t words = n == 4 && strncmp(w, "pred", 4) == 0 ? 0 : type_size(w, n) == 8 ? 2 : 1;
        const char *semi = memchr(p, ';', (size_t)(end - p));
        const char *lt = semi ? memchr(p, '<', (size_t)(semi - p)) : NULL;
        long count = 1;
        if (lt)
            count = strtol(lt + 1, NULL, 10);
        else if (semi)
            for (const char *c = p; c < semi; c++)
                count += *c == ',';
        regs += (long)words * count;
    }
    int cap = maxnreg > 0 && maxnreg < 255 ? maxnreg : 255;
    return regs < 2 ? 2 : regs > cap ? cap : (int)regs;
}

/* The kernel name after the ".entry" at p, and its length (0 if none). */
static const char *entry_name(const char *p, size_t *len)
{
    const char *q = p + 6;
    while (*q == ' ' || *q == '\t')
        q++;
    *len = strcspn(q, " \t\r\n(");
    return q;
}

char *sim_ptx_entries(const char *text)
{
    size_t cap = 64, len = 0, n;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    for (const char *p = strstr(text, ".entry"); p; p = strstr(p + 6, ".entry")) {
        const char *q = entry_name(p, &n);
        if (n == 0)
            continue;
        if (len + n + 2 > cap) {
            cap = (len + n + 2) * 2;
            char *grown = realloc(out, cap);
            if (!grown) {
                free(out);
                return NULL;
            }
            out = grown;
        }
        memcpy(out + len, q, n);
        len += n;
        out[len++] = 0;
    }
    out[len] = 0;
    return out;
}

int sim_ptx_kernel(const char *ptx, const char *name, struct sim_kernel_info *k)
{
    size_t len = strlen(name), n;
    for (const char *p = strstr(ptx, ".entry"); p; p = strstr(p + 6, ".entry")) {
        const char *q = entry_name(p, &n);
        if (n != len || strncmp(q, name, len) != 0)
            continue;
        const char *open = strchr(q, '('), *brace = strchr(q, '{');
        if (!brace)
            return 0;
        const char *close = open && open < brace ? strchr(open, ')') : NULL;
        int depth = 0;
        const char *end = brace;
        for (; *end; end++) /* the body's matching brace */
            if (*end == '{')
                depth++;
            else if (*end == '}' && --depth == 0)
                break;
        memset(k, 0, sizeof *k);
        if (close)
            params(open, close, k);
        const char *dirs = close ? close : q + len;
        k->max_threads = product_after(dirs, brace, ".maxntid");
        if (!k->max_threads)
            k->max_threads = product_after(dirs, brace, ".reqntid");
        const char *mr = memmem(dirs, (size_t)(brace - dirs), ".maxnreg", 8);
        k->regs = registers(brace, end, mr ? atoi(mr + 8) : 0);
        k->shared = bytes_in(brace, end, ".shared");
        k->local = bytes_in(brace, end, ".local");
        return 1;
    }
    return 0;
}

int sim_ptx_target(const char *ptx)
{
    const char *t = strstr(ptx, ".target");
    const char *sm = t ? strstr(t, "sm_") : NULL;
    return sm && sm - t < 32 ? atoi(sm + 3) : 0;
}
