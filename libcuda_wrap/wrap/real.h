/* The real library's functions as the interposer's hooks call them: a
 * gs_real_<name> pointer for every name the library exports (EXPORTS, its
 * list, given at build time) and REAL(name), that pointer with the exact type
 * of our hook of the same name. Filled in by real.c. */
#ifndef GS_WRAP_REAL_H
#define GS_WRAP_REAL_H

#define FWD(name) extern void *gs_real_##name;
#include EXPORTS
#undef FWD

#define REAL(name) ((__typeof__(&name))gs_real_##name)

#endif
