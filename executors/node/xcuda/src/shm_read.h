/* Reading the node agent's per-GPU record (layout in xcuda_shm.h). */
#ifndef XCUDA_SHM_READ_H
#define XCUDA_SHM_READ_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "xcuda_shm.h"

enum xc_shm_status {
    XC_SHM_OK = 0,
    XC_SHM_MISSING,       /* no file */
    XC_SHM_SHORT,         /* file shorter than a record */
    XC_SHM_BAD_MAGIC,
    XC_SHM_BAD_VERSION,
    XC_SHM_BUSY,          /* the writer was mid-update every time we looked */
    XC_SHM_BAD_CHECKSUM,
    XC_SHM_BAD_VALUES,    /* NaN, negative clocks, U_SM outside [0, 1] ... */
    XC_SHM_STALE,         /* older than XCUDA_SHM_STALE_MS: the agent stopped */
    XC_SHM_UNTRUSTED,     /* not a record only root could have written: see xc_shm_trusted */
    XC_SHM_STATUS_COUNT
};

const char *xc_shm_status_name(enum xc_shm_status s);

uint64_t xc_shm_checksum(const unsigned char *payload, size_t len);

/* Whether the open file is one only the node agent could have written: a regular file owned by `owner_uid` (root,
 * the agent; the test build passes its own user) and writable by neither group nor others. The record lives in a
 * world-writable directory (/dev/shm): a file a user planted there (before the agent created its own, or under a
 * name it does not manage), his job's own included, is refused, so no user can pace his own or another user's jobs
 * by a record of his. Opened with O_NOFOLLOW: a symlink at the path is refused too. */
int xc_shm_trusted(int fd, unsigned owner_uid);

/* Pure: validates a record's bytes and decodes them. No staleness check. */
enum xc_shm_status xc_shm_decode(const unsigned char *buf, size_t len, struct xcuda_shm_record *out);

struct xc_shm_reader {
    char path[XC_PATH_MAX];
    int fd;                  /* -1 while not open */
    uint64_t next_open_ns;   /* when to try opening again */
    enum xc_shm_status last; /* what the last read found */
    unsigned owner_uid;      /* whose record is trusted: xc_shm_trusted */
};

void xc_shm_reader_init(struct xc_shm_reader *r, const char *path, unsigned owner_uid);
void xc_shm_reader_close(struct xc_shm_reader *r);

/* Reads the current sample (pread: a file truncated under us cannot SIGBUS). */
enum xc_shm_status xc_shm_read(struct xc_shm_reader *r, uint64_t now_ns, uint64_t stale_ns,
                               struct xcuda_shm_record *out);

#endif
