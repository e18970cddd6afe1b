/* Unit tests of the lock-free allocation table (src/memtrack.c). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "../src/memtrack.h"

#include "check.h"

static void test_basics(void)
{
    struct xc_table t;
    uint64_t v = 0;
    CHECK(xc_table_init(&t, 3) != 0 && xc_table_init(&t, 31) != 0, "capacity bounds");
    CHECK(xc_table_init(&t, 10) == 0, "init");
    CHECK(!xc_table_insert(&t, 0, 1) && !xc_table_insert(&t, UINT64_MAX, 1), "reserved keys");
    CHECK(xc_table_insert(&t, 0x7f0000001000, 4096) && xc_table_live(&t) == 1, "insert");
    CHECK(!xc_table_remove(&t, 0x7f0000002000, &v), "absent key");
    CHECK(xc_table_remove(&t, 0x7f0000001000, &v) && v == 4096, "remove gives the size back");
    CHECK(!xc_table_remove(&t, 0x7f0000001000, &v), "removed once only");
    CHECK(xc_table_live(&t) == 0, "empty again");
    xc_table_destroy(&t);
}

static void test_churn_and_fill(void)
{
    struct xc_table t;
    uint64_t v;
    xc_table_init(&t, 10);
    /* A million allocations and frees with ever new addresses: tombstones pile up. */
    for (uint64_t i = 1; i <= 1000000; i++) {
        if (!xc_table_insert(&t, i * 512, i) || !xc_table_remove(&t, i * 512, &v) || v != i) {
            CHECK(0, "churn step %llu", (unsigned long long)i);
            break;
        }
    }
    /* Misses stay cheap (bounded probes), so a million of them is quick. */
    for (uint64_t i = 1; i <= 1000000; i++)
        if (xc_table_remove(&t, (i << 20) + 7, &v))
            CHECK(0, "phantom key");
    size_t stored = 0;
    while (xc_table_insert(&t, (stored + 1) * 4096, 1))
        stored++;
    CHECK(stored >= 1024 * 9 / 10 && stored <= 1024, "fills to %zu of 1024 before refusing", stored);
    CHECK(xc_table_live(&t) == stored, "live count");
    for (size_t i = 1; i <= stored; i++)
        CHECK(xc_table_remove(&t, i * 4096, &v), "every stored key is found");
    xc_table_destroy(&t);
}

static struct xc_table shared;

static void *worker(void *arg)
{
    uint64_t base = (uint64_t)(uintptr_t)arg << 40, v;
    for (uint64_t i = 1; i <= 200000; i++) {
        uint64_t k = base + i * 256;
        if (!xc_table_insert(&shared, k, i) || !xc_table_remove(&shared, k, &v) || v != i) {
            CHECK(0, "thread %llu step %llu", (unsigned long long)(base >> 40), (unsigned long long)i);
            break;
        }
    }
    return NULL;
}

static void test_concurrent(void)
{
    pthread_t th[4];
    xc_table_init(&shared, 12);
    for (uintptr_t i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, worker, (void *)(i + 1));
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    CHECK(xc_table_live(&shared) == 0, "live %zu after balanced work", xc_table_live(&shared));
    xc_table_destroy(&shared);
}

int main(void)
{
    test_basics();
    test_churn_and_fill();
    test_concurrent();
    if (failures) {
        fprintf(stderr, "test_memtrack: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_memtrack: ok\n");
    return 0;
}
