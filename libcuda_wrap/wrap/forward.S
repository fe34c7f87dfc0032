/* One trampoline per exported name: an indirect jump through the pointer the
 * loader filled from the real library (real.c).  The trampolines are weak, so
 * the intercepted functions, defined in C, replace theirs at link time.
 * EXPORTS is the X-macro list (symbols/cuda_exports.def or nvml_exports.def). */
#if defined(__x86_64__)
#define FWD(name)                            \
    .text;                                   \
    .weak name;                              \
    .type name, @function;                   \
    .p2align 4;                              \
name:                                        \
    jmp *gs_real_##name(%rip);               \
    .size name, .-name;
#elif defined(__aarch64__)
#define FWD(name)                            \
    .text;                                   \
    .weak name;                              \
    .type name, %function;                   \
    .p2align 4;                              \
name:                                        \
    adrp x16, gs_real_##name;                \
    ldr x16, [x16, :lo12:gs_real_##name];    \
    br x16;                                  \
    .size name, .-name;
#else
#error "gpuslice: trampolines exist for x86_64 and aarch64"
#endif

#include EXPORTS

    .section .note.GNU-stack, "", %progbits
