/* XCUDA_* parsing: pure, locale-independent, never fails hard (see config.h). */
#include "config.h"

#include <ctype.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define DEFAULT_QUOTA_PCT 40.0  /* paper §6: offline memory quota is 40 % of the device */

void xc_config_defaults(struct xc_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->quota_kind = XC_QUOTA_PERCENT;
    cfg->quota_pct = DEFAULT_QUOTA_PCT;
    cfg->gpu_index = 0;
    snprintf(cfg->shm_path, sizeof cfg->shm_path, "/dev/shm/muxflow-gpu-%u", cfg->gpu_index);
    cfg->target_util = 0.9;
    cfg->target_cap = 2.0;
    cfg->kp = 1.0;
    cfg->ki = 20.0;
    cfg->kd = 0.0;
    cfg->a_l = 5.0;
    cfg->a_h = 0.5;
    cfg->fallback_rate = 2000.0;
    cfg->min_rate = 10.0;
    cfg->control_period_ms = 20;
    cfg->shm_stale_ms = 1000;
    cfg->exit_timeout_ms = 10000;
    cfg->log_level = XC_LOG_WARN;
}

/* -- primitives ----------------------------------------------------------- */

/* Copies s without surrounding blanks into buf; 0 if it fits and is non-empty. */
static int trimmed(const char *s, char *buf, size_t len)
{
    if (s == NULL)
        return -1;
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    if (n == 0 || n >= len)
        return -1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    return 0;
}

/* Length of the decimal number at the start of s ([+-]d*[.d*][e[+-]d+]), 0 if none. */
static size_t number_prefix(const char *s)
{
    size_t i = 0, digits = 0;
    if (s[i] == '+' || s[i] == '-')
        i++;
    while (isdigit((unsigned char)s[i]))
        i++, digits++;
    if (s[i] == '.') {
        i++;
        while (isdigit((unsigned char)s[i]))
            i++, digits++;
    }
    if (digits == 0)
        return 0;
    if (s[i] == 'e' || s[i] == 'E') {
        size_t j = i + 1;
        if (s[j] == '+' || s[j] == '-')
            j++;
        if (isdigit((unsigned char)s[j])) {
            while (isdigit((unsigned char)s[j]))
                j++;
            i = j;
        }
    }
    return i;
}

/* strtod in the C locale: a program may have set LC_NUMERIC to one with ','. */
static double c_strtod(const char *s)
{
    static locale_t c_loc;
    if (c_loc == (locale_t)0)
        c_loc = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (c_loc != (locale_t)0)
        return strtod_l(s, NULL, c_loc);
    return strtod(s, NULL);
}

int xc_parse_double(const char *s, double *out)
{
    char buf[64];
    if (trimmed(s, buf, sizeof buf) != 0)
        return -1;
    size_t n = number_prefix(buf);
    if (n == 0 || buf[n] != '\0')
        return -1;
    double v = c_strtod(buf);
    if (!isfinite(v))
        return -1;
    *out = v;
    return 0;
}

int xc_parse_uint(const char *s, uint64_t max, uint64_t *out)
{
    char buf[32];
    if (trimmed(s, buf, sizeof buf) != 0)
        return -1;
    uint64_t v = 0;
    for (const char *p = buf; *p; p++) {
        if (!isdigit((unsigned char)*p))
            return -1;
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    if (v > max)
        return -1;
    *out = v;
    return 0;
}

int xc_parse_quota(const char *s, enum xc_quota_kind *kind, uint64_t *bytes, double *pct)
{
    char buf[64];
    if (trimmed(s, buf, sizeof buf) != 0)
        return -1;
    if (!strcasecmp(buf, "none") || !strcasecmp(buf, "unlimited") || !strcasecmp(buf, "off")) {
        *kind = XC_QUOTA_NONE;
        return 0;
    }
    size_t n = number_prefix(buf);
    if (n == 0 || buf[0] == '-' || buf[0] == '+')
        return -1;
    char num[64];
    memcpy(num, buf, n);
    num[n] = '\0';
    double v = c_strtod(num);
    const char *unit = buf + n;
    while (*unit == ' ')
        unit++;
    if (!isfinite(v) || v <= 0)
        return -1;
    if (!strcmp(unit, "%")) {
        if (v > 100.0)
            return -1;
        *kind = XC_QUOTA_PERCENT;
        *pct = v;
        return 0;
    }
    static const struct { const char *unit; double factor; } units[] = {
        {"", 1.0}, {"b", 1.0},
        {"k", 1024.0}, {"kib", 1024.0}, {"kb", 1e3},
        {"m", 1048576.0}, {"mib", 1048576.0}, {"mb", 1e6},
        {"g", 1073741824.0}, {"gib", 1073741824.0}, {"gb", 1e9},
        {"t", 1099511627776.0}, {"tib", 1099511627776.0}, {"tb", 1e12},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(unit, units[i].unit) != 0)
            continue;
        double b = floor(v * units[i].factor);
        if (b < 1.0 || b > 9.2e18)
            return -1;
        *kind = XC_QUOTA_BYTES;
        *bytes = (uint64_t)b;
        return 0;
    }
    return -1;
}

int xc_parse_fraction(const char *s, double *out)
{
    char buf[64];
    if (trimmed(s, buf, sizeof buf) != 0)
        return -1;
    size_t n = strlen(buf);
    double scale = 1.0;
    if (buf[n - 1] == '%') {
        buf[--n] = '\0';
        scale = 0.01;
    }
    double v;
    if (xc_parse_double(buf, &v) != 0)
        return -1;
    *out = v * scale;
    return 0;
}

int xc_parse_log_level(const char *s, enum xc_log_level *out)
{
    char buf[16];
    if (trimmed(s, buf, sizeof buf) != 0)
        return -1;
    static const struct { const char *name; enum xc_log_level level; } names[] = {
        {"error", XC_LOG_ERROR}, {"warn", XC_LOG_WARN}, {"warning", XC_LOG_WARN},
        {"info", XC_LOG_INFO}, {"debug", XC_LOG_DEBUG},
        {"0", XC_LOG_ERROR}, {"1", XC_LOG_WARN}, {"2", XC_LOG_INFO}, {"3", XC_LOG_DEBUG},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!strcasecmp(buf, names[i].name)) {
            *out = names[i].level;
            return 0;
        }
    }
    return -1;
}

/* -- the XCUDA_* variables ------------------------------------------------ */

struct msgbuf {
    char *buf;
    size_t len, used;
    int count;
};

__attribute__((format(printf, 2, 3)))
static void problem(struct msgbuf *m, const char *fmt, ...)
{
    m->count++;
    if (m->buf == NULL || m->len == 0 || m->used + 1 >= m->len)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(m->buf + m->used, m->len - m->used, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    m->used += (size_t)n;
    if (m->used >= m->len - 1) {
        m->used = m->len - 1;
        m->buf[m->used - 1] = '\n';  /* keep the last visible line terminated */
    } else {
        m->buf[m->used++] = '\n';
        m->buf[m->used] = '\0';
    }
}

/* Shown in messages: the value as given, cut short and with control bytes masked. */
static const char *shown(const char *v, char *buf, size_t len)
{
    size_t i = 0;
    for (; v[i] && i + 4 < len; i++)
        buf[i] = (v[i] >= 0x20 && v[i] < 0x7f) ? v[i] : '?';
    if (v[i])
        buf[i++] = '.', buf[i++] = '.', buf[i++] = '.';
    buf[i] = '\0';
    return buf;
}

enum var_id {
    V_QUOTA, V_GPU_INDEX, V_SHM_PATH, V_TARGET, V_KP, V_KI, V_KD, V_A_L, V_A_H,
    V_FALLBACK, V_MIN_RATE, V_PERIOD, V_STALE, V_EXIT_TIMEOUT, V_LOG_LEVEL, V_STATS_DIR, V_COUNT
};

static const char *const var_names[V_COUNT] = {
    [V_QUOTA] = "XCUDA_MEM_QUOTA_BYTES",
    [V_GPU_INDEX] = "XCUDA_GPU_INDEX",
    [V_SHM_PATH] = "XCUDA_SHM_PATH",
    [V_TARGET] = "XCUDA_TARGET_UTIL",
    [V_KP] = "XCUDA_KP",
    [V_KI] = "XCUDA_KI",
    [V_KD] = "XCUDA_KD",
    [V_A_L] = "XCUDA_A_L",
    [V_A_H] = "XCUDA_A_H",
    [V_FALLBACK] = "XCUDA_FALLBACK_LAUNCH_RATE",
    [V_MIN_RATE] = "XCUDA_MIN_LAUNCH_RATE",
    [V_PERIOD] = "XCUDA_CONTROL_PERIOD_MS",
    [V_STALE] = "XCUDA_SHM_STALE_MS",
    [V_EXIT_TIMEOUT] = "XCUDA_EXIT_TIMEOUT_MS",
    [V_LOG_LEVEL] = "XCUDA_LOG_LEVEL",
    [V_STATS_DIR] = "XCUDA_STATS_DIR",
};

/* A double in [lo, hi]; lo_open excludes lo itself. */
static void real_in(struct msgbuf *m, const char *name, const char *value, double lo, int lo_open, double hi,
                    double *field)
{
    double v;
    char sbuf[48];
    if (xc_parse_double(value, &v) != 0 || v < lo || (lo_open && v == lo) || v > hi)
        problem(m, "%s='%s': expected a number in %s%g, %g]; using %g", name, shown(value, sbuf, sizeof sbuf),
                lo_open ? "(" : "[", lo, hi, *field);
    else
        *field = v;
}

static void uint_in(struct msgbuf *m, const char *name, const char *value, uint64_t lo, uint64_t hi,
                    unsigned *field)
{
    uint64_t v;
    char sbuf[48];
    if (xc_parse_uint(value, hi, &v) != 0 || v < lo)
        problem(m, "%s='%s': expected a whole number in [%llu, %llu]; using %u", name,
                shown(value, sbuf, sizeof sbuf), (unsigned long long)lo, (unsigned long long)hi, *field);
    else
        *field = (unsigned)v;
}

/* The XCUDA_* entries of envp into values[] (the first of each name counts, like getenv). */
static void collect(const char *const *envp, const char *values[V_COUNT], struct msgbuf *m)
{
    for (size_t i = 0; envp != NULL && envp[i] != NULL; i++) {
        const char *e = envp[i];
        if (strncmp(e, "XCUDA_", 6) != 0)
            continue;
        const char *eq = strchr(e, '=');
        if (eq == NULL)
            continue;
        size_t nlen = (size_t)(eq - e);
        if ((nlen >= 11 && !strncmp(e, "XCUDA_FAKE_", 11)) || (nlen >= 11 && !strncmp(e, "XCUDA_TEST_", 11)))
            continue;  /* the test driver's and the test build's own variables */
        int known = 0;
        for (int v = 0; v < V_COUNT; v++) {
            if (strlen(var_names[v]) == nlen && !strncmp(e, var_names[v], nlen)) {
                known = 1;
                if (values[v] == NULL)
                    values[v] = eq + 1;
                break;
            }
        }
        if (!known)
            problem(m, "%.*s: unknown variable, ignored (typo?)", (int)(nlen > 64 ? 64 : nlen), e);
    }
}

static void apply_log_and_stats(const char *const values[V_COUNT], struct xc_config *cfg, struct msgbuf *m)
{
    char sbuf[48];
    if (values[V_LOG_LEVEL] && xc_parse_log_level(values[V_LOG_LEVEL], &cfg->log_level) != 0)
        problem(m, "%s='%s': expected error, warn, info or debug; using warn", var_names[V_LOG_LEVEL],
                shown(values[V_LOG_LEVEL], sbuf, sizeof sbuf));
    if (values[V_STATS_DIR]) {
        const char *p = values[V_STATS_DIR];
        size_t n = strlen(p);
        int ok = p[0] == '/' && n + 32 < sizeof cfg->stats_dir;  /* room for "/xcuda-<pid>.stats" */
        for (size_t i = 0; ok && i < n; i++)
            ok = (unsigned char)p[i] >= 0x20 && p[i] != 0x7f;
        if (ok)
            memcpy(cfg->stats_dir, p, n + 1);
        else
            problem(m, "%s='%s': expected an absolute directory shorter than %d bytes; counters not published",
                    var_names[V_STATS_DIR], shown(p, sbuf, sizeof sbuf), XC_PATH_MAX - 32);
    }
}

static int path_ok(const char *p, size_t room)
{
    size_t n = strlen(p);
    int ok = p[0] == '/' && n < room;
    for (size_t i = 0; ok && i < n; i++)
        ok = (unsigned char)p[i] >= 0x20 && p[i] != 0x7f;
    return ok;
}

/* The limits among values[] onto cfg, as given (each checked for form and range only). */
static void apply_limits(const char *const values[V_COUNT], struct xc_config *cfg, struct msgbuf *m)
{
    char sbuf[48];
    if (values[V_QUOTA]) {
        enum xc_quota_kind kind;
        uint64_t bytes = 0;
        double pct = 0;
        if (xc_parse_quota(values[V_QUOTA], &kind, &bytes, &pct) != 0) {
            problem(m, "%s='%s': expected bytes with an optional unit (4GiB, 512M), a percentage of device "
                       "memory (40%%) or none; using %g%% of device memory",
                    var_names[V_QUOTA], shown(values[V_QUOTA], sbuf, sizeof sbuf), DEFAULT_QUOTA_PCT);
        } else {
            cfg->quota_kind = kind;
            cfg->quota_bytes = bytes;
            cfg->quota_pct = pct;
        }
    }

    if (values[V_GPU_INDEX]) {
        uint_in(m, var_names[V_GPU_INDEX], values[V_GPU_INDEX], 0, 4095, &cfg->gpu_index);
        snprintf(cfg->shm_path, sizeof cfg->shm_path, "/dev/shm/muxflow-gpu-%u", cfg->gpu_index);
    }
    if (values[V_SHM_PATH]) {
        const char *p = values[V_SHM_PATH];
        if (path_ok(p, sizeof cfg->shm_path))
            memcpy(cfg->shm_path, p, strlen(p) + 1);
        else
            problem(m, "%s='%s': expected an absolute path shorter than %d bytes; using %s", var_names[V_SHM_PATH],
                    shown(p, sbuf, sizeof sbuf), XC_PATH_MAX, cfg->shm_path);
    }

    if (values[V_TARGET]) {
        double v;
        if (xc_parse_fraction(values[V_TARGET], &v) != 0 || !(v > 0.0) || v > 2.0)
            problem(m, "%s='%s': expected a load in (0, 2] such as 0.9 or 90%%; using %g", var_names[V_TARGET],
                    shown(values[V_TARGET], sbuf, sizeof sbuf), cfg->target_util);
        else
            cfg->target_util = v;
    }
    if (values[V_KP])
        real_in(m, var_names[V_KP], values[V_KP], 0.0, 0, 1000.0, &cfg->kp);
    if (values[V_KI])
        real_in(m, var_names[V_KI], values[V_KI], 0.0, 0, 1000.0, &cfg->ki);
    if (values[V_KD])
        real_in(m, var_names[V_KD], values[V_KD], 0.0, 0, 10.0, &cfg->kd);
    if (values[V_A_L])
        real_in(m, var_names[V_A_L], values[V_A_L], 0.0, 0, 1000.0, &cfg->a_l);
    if (values[V_A_H])
        real_in(m, var_names[V_A_H], values[V_A_H], 0.0, 0, 1.0, &cfg->a_h);
    if (values[V_FALLBACK])
        real_in(m, var_names[V_FALLBACK], values[V_FALLBACK], 0.0, 1, 1e9, &cfg->fallback_rate);
    if (values[V_MIN_RATE])
        real_in(m, var_names[V_MIN_RATE], values[V_MIN_RATE], 0.0, 1, 1e9, &cfg->min_rate);
    if (values[V_PERIOD])
        uint_in(m, var_names[V_PERIOD], values[V_PERIOD], 1, 10000, &cfg->control_period_ms);
    if (values[V_STALE])
        uint_in(m, var_names[V_STALE], values[V_STALE], 1, 3600000, &cfg->shm_stale_ms);
    if (values[V_EXIT_TIMEOUT])
        uint_in(m, var_names[V_EXIT_TIMEOUT], values[V_EXIT_TIMEOUT], 1, 600000, &cfg->exit_timeout_ms);
}

static void floor_under_fallback(struct xc_config *cfg, struct msgbuf *m)
{
    if (cfg->min_rate > cfg->fallback_rate) {
        problem(m, "%s=%g is above %s=%g; using %g for both", var_names[V_MIN_RATE], cfg->min_rate,
                var_names[V_FALLBACK], cfg->fallback_rate, cfg->fallback_rate);
        cfg->min_rate = cfg->fallback_rate;
    }
}

int xc_config_parse(const char *const *envp, struct xc_config *cfg, char *msgs, size_t msgs_len)
{
    struct msgbuf m = {msgs, msgs_len, 0, 0};
    const char *values[V_COUNT] = {0};

    xc_config_defaults(cfg);
    if (msgs != NULL && msgs_len > 0)
        msgs[0] = '\0';
    collect(envp, values, &m);
    apply_log_and_stats(values, cfg, &m);
    apply_limits(values, cfg, &m);
    floor_under_fallback(cfg, &m);
    return m.count;
}

/* -- the plan file and the job's stricter settings ------------------------ */

/* Plan keys (executors/slurm/plan.py writes gpu, mem, kp, ki, kd; the others are the operator's) and the variable
 * each one bounds. Keys the plan has for others (slurm, job, kind, pct, run, node) are skipped. */
static const struct { const char *key; enum var_id var; } plan_keys[] = {
    {"gpu", V_GPU_INDEX}, {"mem", V_QUOTA}, {"kp", V_KP}, {"ki", V_KI}, {"kd", V_KD}, {"target", V_TARGET},
    {"al", V_A_L}, {"ah", V_A_H}, {"fallback", V_FALLBACK}, {"floor", V_MIN_RATE}, {"period", V_PERIOD},
    {"stale", V_STALE}, {"shm", V_SHM_PATH},
};

static void apply_plan(const char *plan, size_t len, struct xc_config *cfg, long long *plan_uid, struct msgbuf *m)
{
    /* Copies of the values, NUL-ended, so apply_limits can parse them like the environment's. */
    char vals[V_COUNT][XC_PATH_MAX];
    const char *values[V_COUNT] = {0};
    size_t i = 0;
    while (i < len) {
        size_t e = i;
        while (e < len && plan[e] != '\n')
            e++;
        const char *line = plan + i;
        size_t n = e - i;
        i = e + 1;
        const char *eq = memchr(line, '=', n);
        if (eq == NULL)
            continue;
        size_t klen = (size_t)(eq - line), vlen = n - klen - 1;
        if (klen == 3 && !strncmp(line, "uid", 3)) {
            char buf[24];
            uint64_t u;
            if (vlen < sizeof buf) {
                memcpy(buf, eq + 1, vlen);
                buf[vlen] = '\0';
            }
            if (vlen >= sizeof buf || xc_parse_uint(buf, 0xfffffffeull, &u) != 0) {
                problem(m, "plan: uid is not a uid; no one's plan");
                *plan_uid = -2;  /* matches no process */
            } else {
                *plan_uid = (long long)u;
            }
            continue;
        }
        for (size_t k = 0; k < sizeof plan_keys / sizeof plan_keys[0]; k++) {
            if (strlen(plan_keys[k].key) != klen || strncmp(line, plan_keys[k].key, klen) != 0)
                continue;
            enum var_id v = plan_keys[k].var;
            if (vlen >= sizeof vals[v]) {
                problem(m, "plan: %s is too long; ignored", plan_keys[k].key);
            } else if (values[v] == NULL) {
                memcpy(vals[v], eq + 1, vlen);
                vals[v][vlen] = '\0';
                values[v] = vals[v];
            }
            break;
        }
    }
    /* The plan's memory is bytes: "none" or a percentage there would be no plan of MuxFlow's. */
    if (values[V_QUOTA]) {
        uint64_t b;
        if (xc_parse_uint(values[V_QUOTA], UINT64_MAX, &b) != 0 || b == 0) {
            problem(m, "plan: mem='%.40s' is not a number of bytes; using %g%% of device memory", values[V_QUOTA],
                    DEFAULT_QUOTA_PCT);
            values[V_QUOTA] = NULL;
        }
    }
    const char *shm = values[V_SHM_PATH];
    values[V_SHM_PATH] = NULL;
    apply_limits(values, cfg, m);  /* gpu first sets the record path; the plan's own path then wins */
    if (shm != NULL) {
        const char *only[V_COUNT] = {0};
        only[V_SHM_PATH] = shm;
        apply_limits(only, cfg, m);
    }
    floor_under_fallback(cfg, m);
}

__attribute__((format(printf, 3, 4)))
static void looser(struct msgbuf *m, enum var_id v, const char *fmt, ...)
{
    char why[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    problem(m, "%s: %s; ignored (the environment may only make xCUDA stricter)", var_names[v], why);
}

int xc_config_resolve(const char *const *envp, const char *plan, size_t plan_len, struct xc_config *cfg,
                      long long *plan_uid, char *msgs, size_t msgs_len)
{
    struct msgbuf m = {msgs, msgs_len, 0, 0};
    const char *values[V_COUNT] = {0};

    xc_config_defaults(cfg);
    *plan_uid = -1;
    if (msgs != NULL && msgs_len > 0)
        msgs[0] = '\0';
    collect(envp, values, &m);
    apply_log_and_stats(values, cfg, &m);
    if (plan != NULL)
        apply_plan(plan, plan_len, cfg, plan_uid, &m);

    /* What the environment asks for, parsed against the plan's values, then taken only where it is stricter. */
    struct xc_config e = *cfg;
    apply_limits(values, &e, &m);
    const char *src = plan != NULL ? "the plan's" : "the default";

    if (values[V_QUOTA] && (e.quota_kind != cfg->quota_kind || e.quota_bytes != cfg->quota_bytes ||
                            e.quota_pct != cfg->quota_pct)) {
        if (e.quota_kind == XC_QUOTA_NONE)
            looser(&m, V_QUOTA, "no quota is looser than %s", src);
        else if (e.quota_kind == XC_QUOTA_BYTES && cfg->quota_kind == XC_QUOTA_BYTES)
            e.quota_bytes <= cfg->quota_bytes ? (void)(cfg->quota_bytes = e.quota_bytes)
                                              : looser(&m, V_QUOTA, "%llu bytes is more than %s %llu",
                                                       (unsigned long long)e.quota_bytes, src,
                                                       (unsigned long long)cfg->quota_bytes);
        else if (e.quota_kind == XC_QUOTA_PERCENT && cfg->quota_kind == XC_QUOTA_PERCENT)
            e.quota_pct <= cfg->quota_pct ? (void)(cfg->quota_pct = e.quota_pct)
                                          : looser(&m, V_QUOTA, "%g%% is more than %s %g%%", e.quota_pct, src,
                                                   cfg->quota_pct);
        else if (e.quota_kind == XC_QUOTA_BYTES)  /* the plan's is a percentage: both apply, the smaller wins */
            cfg->quota_bytes = cfg->quota_bytes > 0 && cfg->quota_bytes < e.quota_bytes ? cfg->quota_bytes
                                                                                         : e.quota_bytes;
        else
            cfg->quota_pct = cfg->quota_pct > 0 && cfg->quota_pct < e.quota_pct ? cfg->quota_pct : e.quota_pct;
    }
    if (values[V_TARGET] && e.target_util != cfg->target_util) {
        if (e.target_util < cfg->target_util)
            cfg->target_util = cfg->target_cap = e.target_util;
        else
            looser(&m, V_TARGET, "%g is above %s %g", e.target_util, src, cfg->target_util);
    }
    if (values[V_FALLBACK] && e.fallback_rate != cfg->fallback_rate) {
        if (e.fallback_rate < cfg->fallback_rate)
            cfg->fallback_rate = e.fallback_rate;
        else
            looser(&m, V_FALLBACK, "%g launches/s is above %s %g", e.fallback_rate, src, cfg->fallback_rate);
    }
    if (values[V_MIN_RATE] && e.min_rate != cfg->min_rate) {
        if (e.min_rate < cfg->min_rate)
            cfg->min_rate = e.min_rate;
        else
            looser(&m, V_MIN_RATE, "%g launches/s is above %s %g", e.min_rate, src, cfg->min_rate);
    }
    if (values[V_EXIT_TIMEOUT] && e.exit_timeout_ms != cfg->exit_timeout_ms) {
        if (e.exit_timeout_ms < cfg->exit_timeout_ms)
            cfg->exit_timeout_ms = e.exit_timeout_ms;
        else
            looser(&m, V_EXIT_TIMEOUT, "%u ms is longer than %s %u", e.exit_timeout_ms, src, cfg->exit_timeout_ms);
    }
    /* No direction is stricter for these: they are the plan's (the TaskProlog exports the same values, which
     * pass silently). */
    if (values[V_GPU_INDEX] && e.gpu_index != cfg->gpu_index)
        looser(&m, V_GPU_INDEX, "GPU %u is not %s GPU %u", e.gpu_index, src, cfg->gpu_index);
    if (values[V_SHM_PATH] && strcmp(e.shm_path, cfg->shm_path) != 0)
        looser(&m, V_SHM_PATH, "the record is %s %s", src, cfg->shm_path);
    static const enum var_id fixed[] = {V_KP, V_KI, V_KD, V_A_L, V_A_H, V_PERIOD, V_STALE};
    for (size_t k = 0; k < sizeof fixed / sizeof fixed[0]; k++) {
        enum var_id v = fixed[k];
        int differs = v == V_KP ? e.kp != cfg->kp : v == V_KI ? e.ki != cfg->ki : v == V_KD ? e.kd != cfg->kd
                    : v == V_A_L ? e.a_l != cfg->a_l : v == V_A_H ? e.a_h != cfg->a_h
                    : v == V_PERIOD ? e.control_period_ms != cfg->control_period_ms
                                    : e.shm_stale_ms != cfg->shm_stale_ms;
        if (values[v] && differs)
            looser(&m, v, "differs from %s value", src);
    }
    floor_under_fallback(cfg, &m);
    return m.count;
}
