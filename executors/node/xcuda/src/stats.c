/* See xcuda_stats.h: this process's counters in a small shared file, written by the controller thread only. */
#include "xcuda_stats.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shm_read.h"
#include "xcuda.h"

uint64_t xc_stats_checksum(const struct xcuda_stats_record *r)
{
    return xc_shm_checksum((const unsigned char *)r + 32, XCUDA_STATS_SIZE - 32);  /* the GPU record's FNV-1a */
}

void xc_stats_open(struct xc_stats_pub *p, const char *dir)
{
    if (p->tried)
        return;
    p->tried = 1;
    p->rec = NULL;
    if (dir == NULL || dir[0] == '\0')
        return;
    char path[XC_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/xcuda-%ld.stats", dir, (long)getpid());
    /* The job's own directory, written as the job's user: no link followed, a file of this process's own. */
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        xc_log(XC_LOG_WARN, "cannot publish counters at %s: %s", path, strerror(errno));
        return;
    }
    void *m = MAP_FAILED;
    if (ftruncate(fd, XCUDA_STATS_SIZE) == 0)
        m = mmap(NULL, XCUDA_STATS_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (m == MAP_FAILED) {
        xc_log(XC_LOG_WARN, "cannot publish counters at %s: %s", path, strerror(err));
        unlink(path);
        return;
    }
    p->rec = m;
    memset(p->rec, 0, XCUDA_STATS_SIZE);
    p->rec->magic = XCUDA_STATS_MAGIC;
    p->rec->version = XCUDA_STATS_VERSION;
    p->rec->record_size = XCUDA_STATS_SIZE;
    p->rec->pid = (uint32_t)getpid();
    xc_log(XC_LOG_INFO, "counters published at %s", path);
}

void xc_stats_publish(struct xc_stats_pub *p, uint64_t now_ns, int fallback, int open)
{
    struct xcuda_stats_record *r = p->rec;
    if (r == NULL)
        return;
    _Atomic uint64_t *seq = (_Atomic uint64_t *)&r->seq;
    uint64_t s = atomic_load_explicit(seq, memory_order_relaxed);
    atomic_store_explicit(seq, s + 1, memory_order_relaxed);   /* odd: mid-update */
    atomic_thread_fence(memory_order_release);
    r->timestamp_ns = now_ns;
    r->flags = (fallback ? XCUDA_STATS_FLAG_FALLBACK : 0u) | (open ? XCUDA_STATS_FLAG_OPEN : 0u);
    r->launches = atomic_load_explicit(&xc_pace.taken, memory_order_relaxed);
    r->waits = atomic_load_explicit(&xc_pace.waits, memory_order_relaxed);
    r->waited_ns = atomic_load_explicit(&xc_pace.waited_ns, memory_order_relaxed);
    uint64_t milli = atomic_load_explicit(&xc_pace.rate_milli, memory_order_relaxed);
    r->rate = milli > 0 ? (double)(milli - 1) / 1000.0 : 0.0;
    xc_mem_stats(&r->mem_used_bytes, &r->mem_peak_bytes, &r->mem_quota_bytes, &r->mem_refused);
    r->checksum = xc_stats_checksum(r);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(seq, s + 2, memory_order_relaxed);   /* even: whole */
}
