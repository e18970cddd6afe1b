/*
 * The per-process record xCUDA publishes and the node agent reads: the live
 * counters of one process's launch gate and memory quota, for the agent's
 * Prometheus endpoint (docs/OBSERVABILITY.md). One file per process,
 * <XCUDA_STATS_DIR>/xcuda-<pid>.stats, 128 bytes, little-endian, written by
 * the pacing controller thread once per control period: the launch path
 * itself writes nothing more than it did (its counters were already there).
 * executors/node/xcuda/stats.py reads the same layout; README.md documents it.
 *
 *   off size type  field
 *     0    8 u64   magic            "MXFXSTAT" read as a little-endian u64
 *     8    4 u32   version          1
 *    12    4 u32   record_size      >= 128
 *    16    8 u64   seq              seqlock: odd while the writer is mid-update
 *    24    8 u64   checksum         FNV-1a 64 of bytes 32..127
 *    32    8 u64   timestamp_ns     CLOCK_MONOTONIC time of the update
 *    40    4 u32   pid              the publishing process
 *    44    4 u32   flags            bit 0: fallback pacing (no usable GPU record); bit 1: gate open
 *    48    8 u64   launches         kernel launches through the gate (cost units)
 *    56    8 u64   waits            launches that waited at the gate
 *    64    8 u64   waited_ns        total time launches waited
 *    72    8 f64   rate             paced launch rate, launches/s (0 when the gate is open)
 *    80    8 u64   mem_used_bytes   memory charged to the quota now
 *    88    8 u64   mem_peak_bytes   the most ever charged
 *    96    8 u64   mem_quota_bytes  the quota (UINT64_MAX: none; 0: not resolved yet)
 *   104    8 u64   mem_refused      allocations refused by the quota
 *   112   16       reserved, 0
 */
#ifndef XCUDA_STATS_H
#define XCUDA_STATS_H

#include <stddef.h>
#include <stdint.h>

#define XCUDA_STATS_MAGIC 0x544154535846584dULL /* bytes "MXFXSTAT" little-endian */
#define XCUDA_STATS_VERSION 1u
#define XCUDA_STATS_SIZE 128u
#define XCUDA_STATS_FLAG_FALLBACK 1u
#define XCUDA_STATS_FLAG_OPEN 2u

struct xcuda_stats_record {
    uint64_t magic;
    uint32_t version;
    uint32_t record_size;
    uint64_t seq;
    uint64_t checksum;
    uint64_t timestamp_ns;
    uint32_t pid;
    uint32_t flags;
    uint64_t launches;
    uint64_t waits;
    uint64_t waited_ns;
    double rate;
    uint64_t mem_used_bytes;
    uint64_t mem_peak_bytes;
    uint64_t mem_quota_bytes;
    uint64_t mem_refused;
    uint8_t reserved[16];
};

_Static_assert(sizeof(struct xcuda_stats_record) == XCUDA_STATS_SIZE, "record is 128 bytes");
_Static_assert(offsetof(struct xcuda_stats_record, timestamp_ns) == 32, "layout");
_Static_assert(offsetof(struct xcuda_stats_record, launches) == 48, "layout");
_Static_assert(offsetof(struct xcuda_stats_record, mem_refused) == 104, "layout");

/* stats.c: the publisher (the controller thread); each call is a no-op without XCUDA_STATS_DIR. */
struct xc_stats_pub {
    struct xcuda_stats_record *rec;  /* the mapped file, or NULL */
    int tried;
};
void xc_stats_open(struct xc_stats_pub *p, const char *dir);
void xc_stats_publish(struct xc_stats_pub *p, uint64_t now_ns, int fallback, int open);
uint64_t xc_stats_checksum(const struct xcuda_stats_record *r);

#endif
