/* See shm_read.h and the layout in xcuda_shm.h. Runs on the controller thread only. */
#include "shm_read.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "xcuda_shm.h"

#define REOPEN_INTERVAL_NS 1000000000ull  /* look for a missing record once a second */
#define READ_ATTEMPTS 8

const char *xc_shm_status_name(enum xc_shm_status s)
{
    static const char *const names[XC_SHM_STATUS_COUNT] = {
        [XC_SHM_OK] = "ok",
        [XC_SHM_MISSING] = "no such file",
        [XC_SHM_SHORT] = "file shorter than a record",
        [XC_SHM_BAD_MAGIC] = "bad magic",
        [XC_SHM_BAD_VERSION] = "unsupported version",
        [XC_SHM_BUSY] = "writer always mid-update",
        [XC_SHM_BAD_CHECKSUM] = "checksum mismatch",
        [XC_SHM_BAD_VALUES] = "values out of range",
        [XC_SHM_STALE] = "stale (node agent not updating it)",
        [XC_SHM_UNTRUSTED] = "untrusted (a symlink, not a regular file, not owned by root, or writable by others)",
    };
    return (unsigned)s < XC_SHM_STATUS_COUNT ? names[s] : "?";
}

uint64_t xc_shm_checksum(const unsigned char *payload, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= payload[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static int fraction_ok(double x, double hi)
{
    return isfinite(x) && x >= 0.0 && x <= hi;
}

enum xc_shm_status xc_shm_decode(const unsigned char *buf, size_t len, struct xcuda_shm_record *out)
{
    struct xcuda_shm_record rec;
    if (len < XCUDA_SHM_SIZE)
        return XC_SHM_SHORT;
    memcpy(&rec, buf, sizeof rec);
    if (rec.magic != XCUDA_SHM_MAGIC)
        return XC_SHM_BAD_MAGIC;
    if (rec.version != XCUDA_SHM_VERSION || rec.record_size < XCUDA_SHM_SIZE)
        return XC_SHM_BAD_VERSION;
    if (rec.seq & 1u)
        return XC_SHM_BUSY;
    if (rec.checksum != xc_shm_checksum(buf + XCUDA_SHM_PAYLOAD_OFFSET, XCUDA_SHM_SIZE - XCUDA_SHM_PAYLOAD_OFFSET))
        return XC_SHM_BAD_CHECKSUM;
    if (!fraction_ok(rec.u_sm, 1.0) || !fraction_ok(rec.sm_clock_mhz, 1e6) ||
        !fraction_ok(rec.clock_threshold_mhz, 1e6) || !fraction_ok(rec.clock_max_mhz, 1e6) ||
        !fraction_ok(rec.target_util, 2.0) || !fraction_ok(rec.sm_occupancy, 1.0) ||
        !fraction_ok(rec.gpu_util, 1.0))
        return XC_SHM_BAD_VALUES;
    if ((rec.flags & XCUDA_SHM_FLAG_INTEGRAL) && !fraction_ok(rec.u_sm_integral_s, 1e15))
        return XC_SHM_BAD_VALUES;
    *out = rec;
    return XC_SHM_OK;
}

void xc_shm_reader_init(struct xc_shm_reader *r, const char *path, unsigned owner_uid)
{
    r->owner_uid = owner_uid;
    size_t n = strnlen(path, sizeof r->path - 1);
    memcpy(r->path, path, n);
    r->path[n] = '\0';
    r->fd = -1;
    r->next_open_ns = 0;
    r->last = XC_SHM_MISSING;
}

void xc_shm_reader_close(struct xc_shm_reader *r)
{
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
}

int xc_shm_trusted(int fd, unsigned owner_uid)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    if (st.st_uid != owner_uid)
        return 0;
    return (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

static ssize_t read_at(int fd, void *buf, size_t len, off_t off)
{
    ssize_t n;
    do
        n = pread(fd, buf, len, off);
    while (n < 0 && errno == EINTR);
    return n;
}

enum xc_shm_status xc_shm_read(struct xc_shm_reader *r, uint64_t now_ns, uint64_t stale_ns,
                               struct xcuda_shm_record *out)
{
    if (r->fd < 0) {
        if (now_ns < r->next_open_ns)
            return r->last;
        r->next_open_ns = now_ns + REOPEN_INTERVAL_NS;
        /* O_NOFOLLOW: a symlink at the path is someone's redirection, not the agent's record. O_NONBLOCK: a FIFO
         * planted there cannot block the open. */
        r->fd = open(r->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
        if (r->fd < 0)
            return r->last = errno == ELOOP ? XC_SHM_UNTRUSTED : XC_SHM_MISSING;
        if (!xc_shm_trusted(r->fd, r->owner_uid)) {
            xc_shm_reader_close(r);
            return r->last = XC_SHM_UNTRUSTED;
        }
    }
    enum xc_shm_status st = XC_SHM_BUSY;
    for (int attempt = 0; attempt < READ_ATTEMPTS; attempt++) {
        unsigned char buf[XCUDA_SHM_SIZE];
        uint64_t seq_before, seq_after;
        ssize_t n = read_at(r->fd, buf, sizeof buf, 0);
        if (n < (ssize_t)sizeof buf) {
            st = n < 0 ? XC_SHM_MISSING : XC_SHM_SHORT;
            break;
        }
        st = xc_shm_decode(buf, sizeof buf, out);
        if (st == XC_SHM_BUSY)
            continue;
        if (st != XC_SHM_OK && st != XC_SHM_BAD_CHECKSUM)
            break;
        /* A write that began while we copied shows as a changed seq (and
         * usually a bad checksum): that copy is torn, not the record. */
        memcpy(&seq_before, buf + 16, sizeof seq_before);
        if (read_at(r->fd, &seq_after, sizeof seq_after, 16) != (ssize_t)sizeof seq_after) {
            st = XC_SHM_SHORT;
            break;
        }
        if (seq_after == seq_before)
            break;
        st = XC_SHM_BUSY;
    }
    /* A sample written after `now` was taken is fresh, not from the future. */
    if (st == XC_SHM_OK && (out->timestamp_ns > now_ns ? out->timestamp_ns - now_ns > stale_ns
                                                       : now_ns - out->timestamp_ns > stale_ns))
        st = XC_SHM_STALE;
    if (st != XC_SHM_OK && st != XC_SHM_BUSY) {
        /* The agent may have replaced the file: open it afresh next time. */
        xc_shm_reader_close(r);
        if (st != XC_SHM_MISSING)
            r->next_open_ns = now_ns + REOPEN_INTERVAL_NS / 10;
    }
    return r->last = st;
}
