/* The interposer: shared declarations. */
#ifndef GPUSLICE_WRAP_H
#define GPUSLICE_WRAP_H

#include <stdint.h>

#include "gpuslice_constants.h"
#include "gpuslice_slice.h"

#define WRAP_API __attribute__((visibility("default")))

/* real.c: the real library's functions.  gs_real_<name> is what the
 * trampoline of <name> jumps through. */
void *gs_real_lookup(const char *name);
int gs_real_loaded(void);
const char *gs_real_path(void);
void gs_load_real(void);

/* log.c: one line on stderr, quiet by default (GPUSLICE_LOG=1 raises it). */
void gs_log(int always, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* slice.c: this process's slice. */
enum gs_mode { GS_UNATTACHED = 0, GS_SLICE = 1, GS_UNSLICED = 2, GS_REFUSED = 3 };
struct gs_slice {
    int mode;
    uint32_t slot;
    const struct gpuslice_limits *limits;
    struct gpuslice_usage *usage;
};
extern struct gs_slice gs;
int gs_attach(void); /* 0: GS_SLICE or GS_UNSLICED; -1: refused (already said why) */
int gs_gpu_of_uuid(const unsigned char uuid[16]); /* slice GPU index or -1 */
int gs_gpu_of_uuid_text(const char *uuid);

/* the ledger atomics are declared in gpuslice_slice.h */

/* table.c: what the process holds, for the frees. */
struct gs_vmm_refs { /* a VMM handle's references (vmm.c): the driver frees it when none is left */
    uint16_t maps;    /* live mappings of it */
    uint16_t retains; /* references retained beyond the creation's */
    uint8_t released; /* the creation's reference was released */
    uint8_t pinned;   /* exported, or more than the counts hold: charged until the process ends */
};
struct gs_entry {
    uint64_t key;
    uint64_t bytes;
    uint64_t owner; /* the context (or pool, or executable graph) whose end frees it; 0: none */
    uint32_t gpu;
    uint32_t kind;
    union {
        struct gs_vmm_refs vmm; /* K_VMM_HANDLE */
        uint64_t handle;        /* K_VMM_MAP: the handle mapped there */
        uint64_t overridden;    /* GS_KIND_GRAPH_EXEC: a node has parameters of its own in this exec */
    } as;
};
int gs_table_put(const struct gs_entry *e); /* e->key, e->kind select; 0 or -1: full */
/* Take every entry of an owner (a context or pool that is going away); calls
 * fn for each.  A scan: only for context and pool ends, never a hot path. */
void gs_table_drop_owner(uint64_t owner, void (*fn)(const struct gs_entry *));
int gs_table_take(uint64_t key, struct gs_entry *out); /* out->kind selects */
int gs_table_get(uint64_t key, struct gs_entry *out);
void gs_table_reset(void);

#define GS_KIND_GRAPH_EXEC 100 /* table entries of gate.c: an executable graph's cost */
#define GS_KIND_EXEC_NODE 101  /* and a kernel node's threads in one exec, once set there */

/* context.c, CUDA interposer only (weak: the NVML one has none) */
__attribute__((weak)) void gs_contexts_forget(void);
int gs_current_gpu(void); /* the slice GPU of the current context, or -1 */

#endif
