/* Our hooks and their real twins, for cuGetProcAddress (procaddr.c). */
#include <stddef.h>

#define HOOK(name) void name(void); extern void *gs_real_##name;
#include "intercepts.def"
#undef HOOK

static const struct {
    void *const *real;
    void (*hook)(void);
} hooks[] = {
#define HOOK(name) {&gs_real_##name, name},
#include "intercepts.def"
#undef HOOK
};

/* Not a hot path: programs resolve each symbol once. */
void *gs_hook_for(void *real)
{
    for (size_t i = 0; i < sizeof hooks / sizeof hooks[0]; i++)
        if (*hooks[i].real == real)
            return (void *)hooks[i].hook;
    return real;
}
