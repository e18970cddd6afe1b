/* See memtrack.h. */
#include "memtrack.h"

#include <sys/mman.h>

#define EMPTY 0ull
#define TOMB UINT64_MAX
/* Tombstones are reused but never cleared (that is not safe without a lock),
 * so after enough churn few slots are EMPTY and a miss would scan the whole
 * table. A key is therefore stored within MAX_PROBE slots of its hash, and
 * look-ups stop there: a miss costs at most MAX_PROBE loads. */
#define MAX_PROBE 128

static uint64_t mix(uint64_t x)  /* splitmix64 finaliser: device pointers share low bits */
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

int xc_table_init(struct xc_table *t, unsigned capacity_log2)
{
    if (capacity_log2 < 4 || capacity_log2 > 30)
        return -1;
    size_t cap = (size_t)1 << capacity_log2;
    void *mem = mmap(NULL, 2 * cap * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED)
        return -1;
    t->keys = mem;
    t->vals = (_Atomic uint64_t *)mem + cap;
    t->mask = cap - 1;
    atomic_init(&t->live, 0);
    return 0;
}

void xc_table_destroy(struct xc_table *t)
{
    if (t->keys != NULL)
        munmap((void *)t->keys, 2 * (t->mask + 1) * sizeof(uint64_t));
    t->keys = NULL;
    t->vals = NULL;
}

int xc_table_insert(struct xc_table *t, uint64_t key, uint64_t val)
{
    if (key == EMPTY || key == TOMB || t->keys == NULL)
        return 0;
    size_t h = (size_t)mix(key), probes = t->mask + 1 < MAX_PROBE ? t->mask + 1 : MAX_PROBE;
    for (size_t i = 0; i < probes; i++) {
        size_t slot = (h + i) & t->mask;
        uint64_t k = atomic_load_explicit(&t->keys[slot], memory_order_relaxed);
        while (k == EMPTY || k == TOMB) {
            /* A key is never present twice: the driver hands an address out
             * again only after its free removed the old entry. So the first
             * free slot is as good as any. */
            if (atomic_compare_exchange_weak_explicit(&t->keys[slot], &k, key, memory_order_acq_rel,
                                                      memory_order_relaxed)) {
                atomic_store_explicit(&t->vals[slot], val, memory_order_release);
                atomic_fetch_add_explicit(&t->live, 1, memory_order_relaxed);
                return 1;
            }
        }
    }
    return 0;
}

int xc_table_remove(struct xc_table *t, uint64_t key, uint64_t *val)
{
    if (key == EMPTY || key == TOMB || t->keys == NULL)
        return 0;
    size_t h = (size_t)mix(key), probes = t->mask + 1 < MAX_PROBE ? t->mask + 1 : MAX_PROBE;
    for (size_t i = 0; i < probes; i++) {
        size_t slot = (h + i) & t->mask;
        uint64_t k = atomic_load_explicit(&t->keys[slot], memory_order_acquire);
        if (k == EMPTY)
            return 0;
        if (k != key)
            continue;
        uint64_t v = atomic_load_explicit(&t->vals[slot], memory_order_acquire);
        if (atomic_compare_exchange_strong_explicit(&t->keys[slot], &k, TOMB, memory_order_acq_rel,
                                                    memory_order_relaxed)) {
            atomic_fetch_sub_explicit(&t->live, 1, memory_order_relaxed);
            *val = v;
            return 1;
        }
        return 0;  /* freed twice at once by the program: only one wins */
    }
    return 0;
}

size_t xc_table_live(const struct xc_table *t)
{
    return atomic_load_explicit(&((struct xc_table *)t)->live, memory_order_relaxed);
}
