/* What the simulator reads from PTX text beyond its kernels' names: the
 * .global variables it declares (cuModuleGetGlobal finds and sizes them).
 * A declaration is a statement of its own, e.g.
 *   .visible .global .align 4 .b8 table[1024];
 *   .global .f32 scale = 1.0;
 * ld.global/st.global instructions and .extern declarations (no storage of
 * their own) are not declarations. */
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

int sim_ptx_globals(const char *ptx, struct sim_global *out, int max)
{
    int n = 0;
    for (const char *p = strstr(ptx, ".global"); p && n < max; p = strstr(p + 7, ".global")) {
        if (p > ptx && !isspace((unsigned char)p[-1]))
            continue; /* ld.global, st.global, cvta.global, ... */
        const char *start = p;
        while (start > ptx && !strchr(";{}\n", start[-1]))
            start--;
        const char *end = strchr(p, ';');
        if (!end)
            break;
        if (only_directives(start, p) && parse(start, end, &out[n]))
            n++;
    }
    return n;
}
