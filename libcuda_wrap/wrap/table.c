/* What this process holds, for the frees: a lock-free open-addressing hash
 * from (pointer or handle, kind) to bytes and slice GPU.  No lock, no
 * syscall; a probe walks neighbouring slots only.  The array is mapped once,
 * at attach time.
 *
 * A slot's key says who may touch the rest: EMPTY or TOMB (free), BUSY (one
 * thread writing or taking it), or the entry's key.  The words behind the key
 * are read by whoever saw it, while the slot may be taken and filled again by
 * another thread: they are stored and loaded word by word, relaxed (the key's
 * release and acquire order them), and what a reader decides from them is
 * checked again once its compare-and-swap holds the slot. */
#define _GNU_SOURCE
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>

#include "wrap.h"

#define CAP (1u << 17) /* 131072 live allocations per process */
#define MAX_PROBE 8192
#define EMPTY 0ull
#define TOMB 1ull
#define BUSY 2ull

#define WORDS ((sizeof(struct gs_entry) - sizeof(uint64_t)) / sizeof(uint64_t))
struct slot {
    uint64_t key;
    uint64_t w[WORDS]; /* the entry after its key */
};
_Static_assert(offsetof(struct gs_entry, key) == 0 && sizeof(struct slot) == sizeof(struct gs_entry),
               "a slot is an entry: its key, then whole words");

static struct slot *slots;

static struct slot *table(void)
{
    struct slot *t = __atomic_load_n(&slots, __ATOMIC_ACQUIRE);
    if (t)
        return t;
    void *m = mmap(NULL, CAP * sizeof *t, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    struct slot *expected = NULL;
    if (!__atomic_compare_exchange_n(&slots, &expected, (struct slot *)m, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
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

/* The entry behind a slot's key, as it reads now (the key as the caller saw it). */
static void load(const struct slot *e, uint64_t key, struct gs_entry *out)
{
    uint64_t w[WORDS];
    for (size_t i = 0; i < WORDS; i++)
        w[i] = __atomic_load_n(&e->w[i], __ATOMIC_RELAXED);
    memcpy((char *)out + sizeof out->key, w, sizeof w);
    out->key = key;
}

int gs_table_put(const struct gs_entry *in)
{
    struct slot *t = table();
    if (!t || in->key <= BUSY)
        return -1;
    uint64_t w[WORDS];
    memcpy(w, (const char *)in + sizeof in->key, sizeof w);
    uint32_t h = hash(in->key, in->kind);
    for (uint32_t i = 0; i < MAX_PROBE; i++) {
        struct slot *e = &t[(h + i) & (CAP - 1)];
        uint64_t k = __atomic_load_n(&e->key, __ATOMIC_ACQUIRE);
        if ((k == EMPTY || k == TOMB) &&
            __atomic_compare_exchange_n(&e->key, &k, BUSY, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            for (size_t j = 0; j < WORDS; j++)
                __atomic_store_n(&e->w[j], w[j], __ATOMIC_RELAXED);
            __atomic_store_n(&e->key, in->key, __ATOMIC_RELEASE);
            return 0;
        }
    }
    return -1;
}

/* One field of the words behind a slot's key, as it reads now. */
#define WORD_OF(field) ((offsetof(struct gs_entry, field) - sizeof(uint64_t)) / sizeof(uint64_t))
static uint32_t kind_of(const struct slot *e)
{
    uint64_t w = __atomic_load_n(&e->w[WORD_OF(kind)], __ATOMIC_RELAXED);
    uint32_t kind;
    memcpy(&kind, (const char *)&w + offsetof(struct gs_entry, kind) % sizeof w, sizeof kind);
    return kind;
}

/* The slot holding (key, kind), or NULL: probing stops at an empty slot. */
static struct slot *find(uint64_t key, uint32_t kind)
{
    struct slot *t = __atomic_load_n(&slots, __ATOMIC_ACQUIRE);
    if (!t || key <= BUSY)
        return NULL;
    uint32_t h = hash(key, kind);
    for (uint32_t i = 0; i < MAX_PROBE; i++) {
        struct slot *e = &t[(h + i) & (CAP - 1)];
        uint64_t k = __atomic_load_n(&e->key, __ATOMIC_ACQUIRE);
        if (k == EMPTY)
            return NULL;
        if (k == key && kind_of(e) == kind)
            return e;
    }
    return NULL;
}

/* Hold a slot whose key was `key` (BUSY now) if what it holds still passes `keep`;
 * else leave it as it was. */
static int hold(struct slot *e, uint64_t key, struct gs_entry *out, int (*keep)(const struct gs_entry *, uint64_t),
                uint64_t arg)
{
    uint64_t k = key;
    if (!__atomic_compare_exchange_n(&e->key, &k, BUSY, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return 0;
    load(e, key, out); /* ours now: it holds still */
    if (keep(out, arg))
        return 1;
    __atomic_store_n(&e->key, key, __ATOMIC_RELEASE); /* taken and filled again between the reads */
    return 0;
}

static int of_kind(const struct gs_entry *e, uint64_t kind) { return e->kind == kind; }
static int of_owner(const struct gs_entry *e, uint64_t owner) { return e->owner == owner; }

int gs_table_take(uint64_t key, struct gs_entry *out)
{
    uint32_t kind = out->kind;
    struct slot *e;
    while ((e = find(key, kind))) {
        if (hold(e, key, out, of_kind, kind)) {
            __atomic_store_n(&e->key, TOMB, __ATOMIC_RELEASE);
            return 0;
        }
    }
    out->kind = kind;
    return -1;
}

void gs_table_reset(void)
{
    struct slot *t = __atomic_load_n(&slots, __ATOMIC_ACQUIRE);
    if (t)
        memset(t, 0, CAP * sizeof *t);
}

int gs_table_get(uint64_t key, struct gs_entry *out)
{
    uint32_t kind = out->kind;
    struct slot *e = find(key, kind);
    if (e)
        load(e, key, out);
    if (e && out->kind == kind) /* else taken and filled again as it was read: gone */
        return 0;
    out->kind = kind;
    return -1;
}

void gs_table_drop_owner(uint64_t owner, void (*fn)(const struct gs_entry *))
{
    struct slot *t = __atomic_load_n(&slots, __ATOMIC_ACQUIRE);
    if (!t || !owner)
        return;
    for (uint32_t i = 0; i < CAP; i++) {
        struct slot *e = &t[i];
        uint64_t k = __atomic_load_n(&e->key, __ATOMIC_ACQUIRE);
        if (k <= BUSY || __atomic_load_n(&e->w[WORD_OF(owner)], __ATOMIC_RELAXED) != owner)
            continue;
        struct gs_entry copy;
        if (!hold(e, k, &copy, of_owner, owner))
            continue;
        __atomic_store_n(&e->key, TOMB, __ATOMIC_RELEASE);
        fn(&copy);
    }
}
