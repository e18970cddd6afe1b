/*
 * Reads a GPU record with xCUDA's own reader and prints what it decoded, so
 * the tests can check executors/node/xcuda/shm.py against the C layout.
 *
 *   xcuda_shm_dump --layout          field offsets of struct xcuda_shm_record
 *   xcuda_shm_dump PATH [STALE_MS [SHIFT_MS]]
 *       status and fields, as xCUDA would see them now (plus SHIFT_MS, which may be negative)
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../src/shm_read.h"
#include "../src/xcuda_shm.h"

#define FIELD(f) printf("%s\"%s\": [%zu, %zu]", first ? "" : ", ", #f, offsetof(struct xcuda_shm_record, f), \
                        sizeof(((struct xcuda_shm_record *)0)->f)), first = 0

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--layout")) {
        int first = 1;
        printf("{\"size\": %zu, \"magic\": %llu, \"version\": %u, \"fields\": {", sizeof(struct xcuda_shm_record),
               (unsigned long long)XCUDA_SHM_MAGIC, XCUDA_SHM_VERSION);
        FIELD(magic); FIELD(version); FIELD(record_size); FIELD(seq); FIELD(checksum); FIELD(timestamp_ns);
        FIELD(gpu_index); FIELD(flags); FIELD(u_sm); FIELD(sm_clock_mhz); FIELD(clock_threshold_mhz);
        FIELD(clock_max_mhz); FIELD(target_util); FIELD(sm_occupancy); FIELD(gpu_util); FIELD(mem_used_bytes);
        FIELD(u_sm_integral_s); FIELD(reserved);
        printf("}}\n");
        return 0;
    }
    if (argc < 2)
        return 2;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    unsigned long long now = (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
    unsigned long long stale_ms = argc > 2 ? strtoull(argv[2], NULL, 10) : 1000;
    long long shift_ms = argc > 3 ? strtoll(argv[3], NULL, 10) : 0;
    now = (unsigned long long)((long long)now + shift_ms * 1000000ll);
    struct xc_shm_reader r;
    /* A test tool: its own user's records count as the agent's (root's, when run as root). */
    xc_shm_reader_init(&r, argv[1], (unsigned)geteuid());
    struct xcuda_shm_record s;
    memset(&s, 0, sizeof s);
    enum xc_shm_status st = xc_shm_read(&r, now, stale_ms * 1000000ull, &s);
    printf("{\"status\": \"%s\", \"seq\": %llu, \"timestamp_ns\": %llu, \"gpu_index\": %u, \"flags\": %u, "
           "\"u_sm\": %.17g, \"sm_clock_mhz\": %.17g, \"clock_threshold_mhz\": %.17g, \"clock_max_mhz\": %.17g, "
           "\"target_util\": %.17g, \"sm_occupancy\": %.17g, \"gpu_util\": %.17g, \"mem_used_bytes\": %llu, "
           "\"u_sm_integral_s\": %.17g}\n",
           xc_shm_status_name(st), (unsigned long long)s.seq, (unsigned long long)s.timestamp_ns, s.gpu_index,
           s.flags, s.u_sm, s.sm_clock_mhz, s.clock_threshold_mhz, s.clock_max_mhz, s.target_util, s.sm_occupancy,
           s.gpu_util, (unsigned long long)s.mem_used_bytes, s.u_sm_integral_s);
    xc_shm_reader_close(&r);
    return 0;
}
