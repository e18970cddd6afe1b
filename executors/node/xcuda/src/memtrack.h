/*
 * Sizes of live allocations by pointer or handle, so that frees return
 * exactly what the allocation charged: a fixed-capacity, lock-free
 * open-addressing table (linear probing within a bounded window, tombstones
 * reused). Keys 0 and UINT64_MAX are reserved and cannot be stored.
 */
#ifndef XCUDA_MEMTRACK_H
#define XCUDA_MEMTRACK_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct xc_table {
    _Atomic uint64_t *keys;
    _Atomic uint64_t *vals;
    size_t mask;               /* capacity - 1, capacity a power of two */
    _Atomic size_t live;
};

/* capacity_log2 in [4, 30]; memory comes from mmap (untouched pages cost nothing). */
int xc_table_init(struct xc_table *t, unsigned capacity_log2);
void xc_table_destroy(struct xc_table *t);

/* 1 when stored, 0 when the key is reserved or the table is full. */
int xc_table_insert(struct xc_table *t, uint64_t key, uint64_t val);
/* 1 and *val when the key was present (it is removed), else 0. */
int xc_table_remove(struct xc_table *t, uint64_t key, uint64_t *val);
size_t xc_table_live(const struct xc_table *t);

#endif
