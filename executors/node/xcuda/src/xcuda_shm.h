/*
 * The per-GPU record the node agent writes and xCUDA reads: the GPU's current
 * metrics for compute pacing (paper §4.1). One file per GPU, by default
 * /dev/shm/muxflow-gpu-<index>, 128 bytes, little-endian, naturally aligned.
 * executors/node/xcuda/shm.py writes the same layout; README.md documents it.
 *
 *   off size type  field
 *     0    8 u64   magic            "MXFXCUDA" read as a little-endian u64
 *     8    4 u32   version          1; bumped only for incompatible changes
 *    12    4 u32   record_size      >= 128; later versions may append fields
 *    16    8 u64   seq              seqlock: odd while the writer is mid-update
 *    24    8 u64   checksum         FNV-1a 64 of bytes 32..127
 *    32    8 u64   timestamp_ns     CLOCK_MONOTONIC time of the sample
 *    40    4 u32   gpu_index
 *    44    4 u32   flags            bit 0: u_sm_integral_s is published; other bits 0
 *    48    8 f64   u_sm             SM activity U_SM, fraction [0, 1]
 *    56    8 f64   sm_clock_mhz     current SM clock C_SM
 *    64    8 f64   clock_threshold_mhz  T_SM (0: no clock information)
 *    72    8 f64   clock_max_mhz    highest SM clock C_H
 *    80    8 f64   target_util      target U_GPU; 0: use XCUDA_TARGET_UTIL
 *    88    8 f64   sm_occupancy     informational
 *    96    8 f64   gpu_util         informational
 *   104    8 u64   mem_used_bytes   informational
 *   112    8 f64   u_sm_integral_s  running integral of U_SM over time (seconds of full SM
 *                                   activity since the writer started), with flag bit 0
 *   120    8       reserved, 0
 *
 * The integral is an addition within version 1: older writers leave it 0 and
 * the flag clear, and older readers never looked at it.
 * Writer: seq += 1 (odd); write bytes 32..127; write checksum; seq += 1.
 * Reader: read the record; accept it only if seq is even, unchanged when read
 * again afterwards, and the checksum matches. The checksum also catches the
 * torn copies a writer without memory fences (Python) can produce.
 */
#ifndef XCUDA_SHM_H
#define XCUDA_SHM_H

#include <stddef.h>
#include <stdint.h>

#define XCUDA_SHM_MAGIC 0x414455435846584dULL /* bytes "MXFXCUDA" little-endian: see shm.py */
#define XCUDA_SHM_VERSION 1u
#define XCUDA_SHM_SIZE 128u
#define XCUDA_SHM_PAYLOAD_OFFSET 32u

struct xcuda_shm_record {
    uint64_t magic;
    uint32_t version;
    uint32_t record_size;
    uint64_t seq;
    uint64_t checksum;
    uint64_t timestamp_ns;
    uint32_t gpu_index;
    uint32_t flags;
    double u_sm;
    double sm_clock_mhz;
    double clock_threshold_mhz;
    double clock_max_mhz;
    double target_util;
    double sm_occupancy;
    double gpu_util;
    uint64_t mem_used_bytes;
    double u_sm_integral_s;
    uint8_t reserved[8];
};

#define XCUDA_SHM_FLAG_INTEGRAL 1u

_Static_assert(sizeof(struct xcuda_shm_record) == XCUDA_SHM_SIZE, "record is 128 bytes");
_Static_assert(offsetof(struct xcuda_shm_record, seq) == 16, "layout");
_Static_assert(offsetof(struct xcuda_shm_record, timestamp_ns) == XCUDA_SHM_PAYLOAD_OFFSET, "layout");
_Static_assert(offsetof(struct xcuda_shm_record, u_sm) == 48, "layout");
_Static_assert(offsetof(struct xcuda_shm_record, mem_used_bytes) == 104, "layout");
_Static_assert(offsetof(struct xcuda_shm_record, u_sm_integral_s) == 112, "layout");
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the record is little-endian");

#endif
