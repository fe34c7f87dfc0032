/* What this process holds, for the frees: a lock-free open-addressing hash
 * from (pointer or handle, kind) to bytes and slice GPU.  No lock, no
 * syscall; a probe walks neighbouring slots only.  The array is mapped once,
 * at attach time. */
#define _GNU_SOURCE
#include <string.h>
#include <sys/mman.h>

#include "wrap.h"

#define CAP (1u << 17) /* 131072 live allocations per process */
#define MAX_PROBE 8192
#define EMPTY 0ull
#define TOMB 1ull
#define BUSY 2ull

static struct gs_entry *slots;

static struct gs_entry *table(void)
{
    struct gs_entry *t = __atomic_load_n(&slots, __ATOMIC_ACQUIRE);
    if (t)
        return t;
    void *m = mmap(NULL, CAP * sizeof *t, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    struct gs_entry *expected = NULL;
    if (!__atomic_compare_exchange_n(&slots, &expected, (struct gs_entry *)m, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        munmap(m, CAP * sizeof *t);
        return expected;
    }
    return m;
}

static uint32_t hash(uint64_t key, uint32_t kind)
{
    key ^= (uint64_t)kind << 56;
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return (uint32_t)key & (CAP - 1);
}

int gs_table_put(const struct gs_entry *in)
{
    struct gs_entry *t = table();
    if (!t || in->key <= BUSY)
        return -1;
    uint32_t h = hash(in->key, in->kind);
    for (uint32_t i = 0; i < MAX_PROBE; i++) {
        struct gs_entry *e = &t[(h + i) & (CAP - 1)];
        uint64_t k = __atomic_load_n(&e->key, __ATOMIC_ACQUIRE);
        if ((k == EMPTY || k == TOMB) &&
            __atomic_compare_exchange_n(&e->key, &k, BUSY, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            e->bytes = in->bytes;
            e->owner = in->owner;
            e->gpu = in->gpu;
            e->kind = in->kind;
            e->as = in->as;
            __atomic_store_n(&e->key, in->key, __ATOMIC_RELEASE);
            return 0;
        }
    }
    return -1;
}

/* The slot holding (key, kind), or NULL: probing stops at an empty slot. */
static struct gs_entry *find(uint64_t key, uint32_t kind)
{
    struct gs_entry *t = __atomic_load_n(&slots, __ATOMIC_ACQUIRE);
    if (!t || key <= BUSY)
        return NULL;
    uint32_t h = hash(key, kind);
    for (uint32_t i = 0; i < MAX_PROBE; i++) {
        struct gs_entry *e = &t[(h + i) & (CAP - 1)];
        uint64_t k = __atomic_load_n(&e->key, __ATOMIC_ACQUIRE);
        if (k == EMPTY)
            return NULL;
        if (k == key && e->kind == kind)
            return e;
    }
    return NULL;
}

static void copy_out(const struct gs_entry *e, uint64_t key, struct gs_entry *out)
{
    out->key = key;
    out->bytes = e->bytes;
    out->owner = e->owner;
    out->gpu = e->gpu;
    out->as = e->as;
}

int gs_table_take(uint64_t key, struct gs_entry *out)
{
    struct gs_entry *e;
    while ((e = find(key, out->kind))) {
        uint64_t k = key;
        if (__atomic_compare_exchange_n(&e->key, &k, BUSY, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            copy_out(e, key, out);
            __atomic_store_n(&e->key, TOMB, __ATOMIC_RELEASE);
            return 0;
        }
    }
    return -1;
}

void gs_table_reset(void)
{
    struct gs_entry *t = __atomic_load_n(&slots, __ATOMIC_ACQUIRE);
    if (t)
        memset(t, 0, CAP * sizeof *t);
}

int gs_table_get(uint64_t key, struct gs_entry *out)
{
    struct gs_entry *e = find(key, out->kind);
    if (!e)
        return -1;
    copy_out(e, key, out);
    return 0;
}

void gs_table_drop_owner(uint64_t owner, void (*fn)(const struct gs_entry *))
{
    struct gs_entry *t = __atomic_load_n(&slots, __ATOMIC_ACQUIRE);
    if (!t || !owner)
        return;
    for (uint32_t i = 0; i < CAP; i++) {
        struct gs_entry *e = &t[i];
        uint64_t k = __atomic_load_n(&e->key, __ATOMIC_ACQUIRE);
        if (k <= BUSY || e->owner != owner)
            continue;
        if (!__atomic_compare_exchange_n(&e->key, &k, BUSY, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            continue;
        struct gs_entry copy = *e;
        copy.key = k;
        __atomic_store_n(&e->key, TOMB, __ATOMIC_RELEASE);
        fn(&copy);
    }
}
