/*
 * XCUDA_* configuration: parsed once into a struct by a pure function (no
 * environment reads, no I/O) so that every value and every malformed value
 * can be unit-tested. Invalid values get a message and the default.
 */
#ifndef XCUDA_CONFIG_H
#define XCUDA_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define XC_PATH_MAX 256

enum xc_quota_kind { XC_QUOTA_NONE, XC_QUOTA_BYTES, XC_QUOTA_PERCENT };
enum xc_log_level { XC_LOG_ERROR = 0, XC_LOG_WARN = 1, XC_LOG_INFO = 2, XC_LOG_DEBUG = 3 };

struct xc_config {
    enum xc_quota_kind quota_kind;
    /* XC_QUOTA_BYTES: quota_bytes, capped at quota_pct % of the device when quota_pct > 0; XC_QUOTA_PERCENT:
     * quota_pct % of the device, capped at quota_bytes when quota_bytes > 0 (the job's own smaller quota in the
     * other unit: see xc_config_resolve). */
    uint64_t quota_bytes;
    double quota_pct;          /* of device memory, (0, 100] */
    unsigned gpu_index;
    char shm_path[XC_PATH_MAX];
    char stats_dir[XC_PATH_MAX];  /* where this process publishes its counters ("": nowhere) */
    double target_util;        /* target U_GPU */
    double target_cap;         /* ceiling on any target, the record's too (the job's own lower one; 2: none) */
    double kp, ki, kd;         /* PID gains on ln(rate): 1, 1/s, s */
    double a_l, a_h;           /* Eq. 2 */
    double fallback_rate;      /* launches/s without a usable record */
    double min_rate;           /* launches/s floor of the controller */
    unsigned control_period_ms;
    unsigned shm_stale_ms;
    unsigned exit_timeout_ms;
    enum xc_log_level log_level;
};

void xc_config_defaults(struct xc_config *cfg);

/*
 * Parses the XCUDA_* entries of `envp` ("NAME=VALUE" strings, NULL-ended)
 * into `cfg`. Each problem appends one line to `msgs` (truncated to
 * `msgs_len`). Returns the number of problems.
 */
int xc_config_parse(const char *const *envp, struct xc_config *cfg, char *msgs, size_t msgs_len);

/*
 * Production: the limits come from `plan` (the text of the root-owned plan file of this job, `plan_len` bytes;
 * NULL: no verifiable plan, the built-in defaults), and the XCUDA_* entries of `envp` may only make them
 * stricter: a smaller quota, a lower target, lower fallback and floor rates, a shorter exit timeout are taken;
 * anything looser, and any other limit (GPU, record path, gains, period, staleness) that differs from the
 * plan's, is ignored with a message. XCUDA_LOG_LEVEL and XCUDA_STATS_DIR are the job's. `*plan_uid` gets the
 * plan's `uid=` (-1 without one). Returns the number of problems.
 */
int xc_config_resolve(const char *const *envp, const char *plan, size_t plan_len, struct xc_config *cfg,
                      long long *plan_uid, char *msgs, size_t msgs_len);

/* Building blocks, exposed for the unit tests. Each returns 0 on success. */
int xc_parse_double(const char *s, double *out);           /* locale-independent */
int xc_parse_uint(const char *s, uint64_t max, uint64_t *out);
/* "4GiB", "512M", "1.5 GB", "123", "40%", "none". */
int xc_parse_quota(const char *s, enum xc_quota_kind *kind, uint64_t *bytes, double *pct);
int xc_parse_fraction(const char *s, double *out);        /* "0.85" or "85%" */
int xc_parse_log_level(const char *s, enum xc_log_level *out);

#endif
