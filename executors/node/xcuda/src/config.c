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

int xc_config_parse(const char *const *envp, struct xc_config *cfg, char *msgs, size_t msgs_len)
{
    struct msgbuf m = {msgs, msgs_len, 0, 0};
    const char *values[V_COUNT] = {0};
    char sbuf[48];

    xc_config_defaults(cfg);
    if (msgs != NULL && msgs_len > 0)
        msgs[0] = '\0';

    for (size_t i = 0; envp != NULL && envp[i] != NULL; i++) {
        const char *e = envp[i];
        if (strncmp(e, "XCUDA_", 6) != 0)
            continue;
        const char *eq = strchr(e, '=');
        if (eq == NULL)
            continue;
        size_t nlen = (size_t)(eq - e);
        if (nlen >= 11 && !strncmp(e, "XCUDA_FAKE_", 11))
            continue;  /* the test driver's own variables */
        int known = 0;
        for (int v = 0; v < V_COUNT; v++) {
            if (strlen(var_names[v]) == nlen && !strncmp(e, var_names[v], nlen)) {
                known = 1;
                if (values[v] == NULL)  /* like getenv: the first one counts */
                    values[v] = eq + 1;
                break;
            }
        }
        if (!known)
            problem(&m, "%.*s: unknown variable, ignored (typo?)", (int)(nlen > 64 ? 64 : nlen), e);
    }

    if (values[V_LOG_LEVEL] && xc_parse_log_level(values[V_LOG_LEVEL], &cfg->log_level) != 0)
        problem(&m, "%s='%s': expected error, warn, info or debug; using warn", var_names[V_LOG_LEVEL],
                shown(values[V_LOG_LEVEL], sbuf, sizeof sbuf));

    if (values[V_QUOTA]) {
        enum xc_quota_kind kind;
        uint64_t bytes = 0;
        double pct = 0;
        if (xc_parse_quota(values[V_QUOTA], &kind, &bytes, &pct) != 0) {
            problem(&m, "%s='%s': expected bytes with an optional unit (4GiB, 512M), a percentage of device "
                        "memory (40%%) or none; using %g%% of device memory",
                    var_names[V_QUOTA], shown(values[V_QUOTA], sbuf, sizeof sbuf), DEFAULT_QUOTA_PCT);
        } else {
            cfg->quota_kind = kind;
            cfg->quota_bytes = bytes;
            cfg->quota_pct = pct;
        }
    }

    if (values[V_GPU_INDEX])
        uint_in(&m, var_names[V_GPU_INDEX], values[V_GPU_INDEX], 0, 4095, &cfg->gpu_index);
    snprintf(cfg->shm_path, sizeof cfg->shm_path, "/dev/shm/muxflow-gpu-%u", cfg->gpu_index);
    if (values[V_SHM_PATH]) {
        const char *p = values[V_SHM_PATH];
        size_t n = strlen(p);
        int ok = p[0] == '/' && n < sizeof cfg->shm_path;
        for (size_t i = 0; ok && i < n; i++)
            ok = (unsigned char)p[i] >= 0x20 && p[i] != 0x7f;
        if (ok)
            memcpy(cfg->shm_path, p, n + 1);
        else
            problem(&m, "%s='%s': expected an absolute path shorter than %d bytes; using %s", var_names[V_SHM_PATH],
                    shown(p, sbuf, sizeof sbuf), XC_PATH_MAX, cfg->shm_path);
    }

    if (values[V_STATS_DIR]) {
        const char *p = values[V_STATS_DIR];
        size_t n = strlen(p);
        int ok = p[0] == '/' && n + 32 < sizeof cfg->stats_dir;  /* room for "/xcuda-<pid>.stats" */
        for (size_t i = 0; ok && i < n; i++)
            ok = (unsigned char)p[i] >= 0x20 && p[i] != 0x7f;
        if (ok)
            memcpy(cfg->stats_dir, p, n + 1);
        else
            problem(&m, "%s='%s': expected an absolute directory shorter than %d bytes; counters not published",
                    var_names[V_STATS_DIR], shown(p, sbuf, sizeof sbuf), XC_PATH_MAX - 32);
    }

    if (values[V_TARGET]) {
        double v;
        if (xc_parse_fraction(values[V_TARGET], &v) != 0 || !(v > 0.0) || v > 2.0)
            problem(&m, "%s='%s': expected a load in (0, 2] such as 0.9 or 90%%; using %g", var_names[V_TARGET],
                    shown(values[V_TARGET], sbuf, sizeof sbuf), cfg->target_util);
        else
            cfg->target_util = v;
    }
    if (values[V_KP])
        real_in(&m, var_names[V_KP], values[V_KP], 0.0, 0, 1000.0, &cfg->kp);
    if (values[V_KI])
        real_in(&m, var_names[V_KI], values[V_KI], 0.0, 0, 1000.0, &cfg->ki);
    if (values[V_KD])
        real_in(&m, var_names[V_KD], values[V_KD], 0.0, 0, 10.0, &cfg->kd);
    if (values[V_A_L])
        real_in(&m, var_names[V_A_L], values[V_A_L], 0.0, 0, 1000.0, &cfg->a_l);
    if (values[V_A_H])
        real_in(&m, var_names[V_A_H], values[V_A_H], 0.0, 0, 1.0, &cfg->a_h);
    if (values[V_FALLBACK])
        real_in(&m, var_names[V_FALLBACK], values[V_FALLBACK], 0.0, 1, 1e9, &cfg->fallback_rate);
    if (values[V_MIN_RATE])
        real_in(&m, var_names[V_MIN_RATE], values[V_MIN_RATE], 0.0, 1, 1e9, &cfg->min_rate);
    if (cfg->min_rate > cfg->fallback_rate) {
        problem(&m, "%s=%g is above %s=%g; using %g for both", var_names[V_MIN_RATE], cfg->min_rate,
                var_names[V_FALLBACK], cfg->fallback_rate, cfg->fallback_rate);
        cfg->min_rate = cfg->fallback_rate;
    }
    if (values[V_PERIOD])
        uint_in(&m, var_names[V_PERIOD], values[V_PERIOD], 1, 10000, &cfg->control_period_ms);
    if (values[V_STALE])
        uint_in(&m, var_names[V_STALE], values[V_STALE], 1, 3600000, &cfg->shm_stale_ms);
    if (values[V_EXIT_TIMEOUT])
        uint_in(&m, var_names[V_EXIT_TIMEOUT], values[V_EXIT_TIMEOUT], 1, 600000, &cfg->exit_timeout_ms);
    return m.count;
}
