/* Unit tests of the XCUDA_* parser (src/config.c): values, units, and every
 * kind of malformed input, which must give a message and the default. */
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../src/config.h"

#include "check.h"

static int parse(const char *const *env, struct xc_config *cfg, char *msgs, size_t len)
{
    return xc_config_parse(env, cfg, msgs, len);
}

static void test_defaults(void)
{
    const char *env[] = {"PATH=/usr/bin", "HOME=/root", NULL};
    struct xc_config c;
    char msgs[512];
    CHECK(parse(env, &c, msgs, sizeof msgs) == 0, "no problems without XCUDA_*: %s", msgs);
    CHECK(c.quota_kind == XC_QUOTA_PERCENT && c.quota_pct == 40.0, "default quota 40%% (paper)");
    CHECK(!strcmp(c.shm_path, "/dev/shm/muxflow-gpu-0"), "default path %s", c.shm_path);
    CHECK(c.target_util == 0.9 && c.kp == 1.0 && c.ki == 20.0 && c.kd == 0.0, "default controller");
    CHECK(c.fallback_rate == 2000.0 && c.min_rate == 10.0 && c.control_period_ms == 20, "default pacing");
    CHECK(c.log_level == XC_LOG_WARN, "default log level");
    CHECK(parse(NULL, &c, NULL, 0) == 0, "NULL environment and no message buffer");
}

static void test_sizes(void)
{
    struct {
        const char *in;
        enum xc_quota_kind kind;
        unsigned long long bytes;
        double pct;
    } ok[] = {
        {"4GiB", XC_QUOTA_BYTES, 4ull << 30, 0},
        {"4G", XC_QUOTA_BYTES, 4ull << 30, 0},
        {"4gb", XC_QUOTA_BYTES, 4000000000ull, 0},
        {" 512 MiB ", XC_QUOTA_BYTES, 512ull << 20, 0},
        {"1.5GiB", XC_QUOTA_BYTES, 3ull << 29, 0},
        {"123", XC_QUOTA_BYTES, 123, 0},
        {"123B", XC_QUOTA_BYTES, 123, 0},
        {"64k", XC_QUOTA_BYTES, 65536, 0},
        {"2TiB", XC_QUOTA_BYTES, 2ull << 40, 0},
        {"1e3", XC_QUOTA_BYTES, 1000, 0},
        {"40%", XC_QUOTA_PERCENT, 0, 40.0},
        {"12.5 %", XC_QUOTA_PERCENT, 0, 12.5},
        {"100%", XC_QUOTA_PERCENT, 0, 100.0},
        {"none", XC_QUOTA_NONE, 0, 0},
        {"Unlimited", XC_QUOTA_NONE, 0, 0},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        enum xc_quota_kind kind = XC_QUOTA_NONE;
        uint64_t bytes = 0;
        double pct = 0;
        int rc = xc_parse_quota(ok[i].in, &kind, &bytes, &pct);
        CHECK(rc == 0 && kind == ok[i].kind && (kind != XC_QUOTA_BYTES || bytes == ok[i].bytes) &&
                  (kind != XC_QUOTA_PERCENT || pct == ok[i].pct),
              "quota '%s': rc %d kind %d bytes %llu pct %g", ok[i].in, rc, kind, (unsigned long long)bytes, pct);
    }
    const char *bad[] = {"", " ", "abc", "4XB", "-1G", "+4G", "0", "0.1", "0%", "101%", "nan", "inf", "1e400",
                         "99999999999T", "4 G B", "4GiBs", "%", "0x10", "1,5G", "--1", "1..2G", "G"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        enum xc_quota_kind kind;
        uint64_t bytes;
        double pct;
        CHECK(xc_parse_quota(bad[i], &kind, &bytes, &pct) != 0, "quota '%s' must be rejected", bad[i]);
    }
}

static void test_numbers(void)
{
    double d;
    uint64_t u;
    CHECK(xc_parse_double("0.85", &d) == 0 && d == 0.85, "0.85");
    CHECK(xc_parse_double(" -2.5e-1 ", &d) == 0 && d == -0.25, "-2.5e-1");
    CHECK(xc_parse_double("7", &d) == 0 && d == 7.0, "7");
    CHECK(xc_parse_double(".5", &d) == 0 && d == 0.5, ".5");
    const char *bad[] = {"", "nan", "NaN", "inf", "-inf", "1e999", "0x1p3", "1.2.3", "1e", "e5", "1,5", "one",
                         "5 6", "."};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(xc_parse_double(bad[i], &d) != 0, "double '%s' must be rejected", bad[i]);
    CHECK(xc_parse_uint("20", 100, &u) == 0 && u == 20, "20");
    CHECK(xc_parse_uint("101", 100, &u) != 0, "over the maximum");
    CHECK(xc_parse_uint("-1", 100, &u) != 0, "negative");
    CHECK(xc_parse_uint("18446744073709551616", UINT64_MAX, &u) != 0, "overflow");
    CHECK(xc_parse_uint("1.5", 100, &u) != 0, "fraction");
    CHECK(xc_parse_fraction("85%", &d) == 0 && fabs(d - 0.85) < 1e-15, "85%%");
    CHECK(xc_parse_fraction("0.85", &d) == 0 && d == 0.85, "0.85 as fraction");
    enum xc_log_level l;
    CHECK(xc_parse_log_level("DEBUG", &l) == 0 && l == XC_LOG_DEBUG, "DEBUG");
    CHECK(xc_parse_log_level("2", &l) == 0 && l == XC_LOG_INFO, "2");
    CHECK(xc_parse_log_level("loud", &l) != 0, "loud");
}

static void test_locale_independent(void)
{
    /* A program may switch LC_NUMERIC to a locale whose decimal point is ','. */
    if (setlocale(LC_NUMERIC, "de_DE.UTF-8") == NULL && setlocale(LC_NUMERIC, "fr_FR.UTF-8") == NULL)
        return;  /* no such locale installed: nothing to prove here */
    double d;
    CHECK(xc_parse_double("0.85", &d) == 0 && d == 0.85, "0.85 under a ',' locale");
    setlocale(LC_NUMERIC, "C");
}

static void test_environment(void)
{
    const char *env[] = {
        "XCUDA_MEM_QUOTA_BYTES=6GiB", "XCUDA_GPU_INDEX=3", "XCUDA_TARGET_UTIL=80%", "XCUDA_KP=0.5",
        "XCUDA_KI=4", "XCUDA_KD=0.01", "XCUDA_A_L=8", "XCUDA_A_H=0.25", "XCUDA_FALLBACK_LAUNCH_RATE=500",
        "XCUDA_MIN_LAUNCH_RATE=5", "XCUDA_CONTROL_PERIOD_MS=10", "XCUDA_SHM_STALE_MS=250",
        "XCUDA_EXIT_TIMEOUT_MS=3000", "XCUDA_LOG_LEVEL=info", "XCUDA_FAKE_TOTAL_MEM=1",
        "XCUDA_MEM_QUOTA_BYTES=1GiB", /* a second definition: the first wins, like getenv */
        NULL};
    struct xc_config c;
    char msgs[1024];
    int n = parse(env, &c, msgs, sizeof msgs);
    CHECK(n == 0, "valid environment: %d problem(s): %s", n, msgs);
    CHECK(c.quota_kind == XC_QUOTA_BYTES && c.quota_bytes == (6ull << 30), "quota");
    CHECK(c.gpu_index == 3 && !strcmp(c.shm_path, "/dev/shm/muxflow-gpu-3"), "path from the index: %s", c.shm_path);
    CHECK(fabs(c.target_util - 0.8) < 1e-15 && c.kp == 0.5 && c.ki == 4 && c.kd == 0.01, "controller");
    CHECK(c.a_l == 8 && c.a_h == 0.25 && c.fallback_rate == 500 && c.min_rate == 5, "pacing");
    CHECK(c.control_period_ms == 10 && c.shm_stale_ms == 250 && c.exit_timeout_ms == 3000, "periods");
    CHECK(c.log_level == XC_LOG_INFO, "log level");

    const char *path_env[] = {"XCUDA_GPU_INDEX=2", "XCUDA_SHM_PATH=/tmp/rec", NULL};
    CHECK(parse(path_env, &c, msgs, sizeof msgs) == 0 && !strcmp(c.shm_path, "/tmp/rec"), "explicit path wins");
}

static void test_malformed(void)
{
    const char *env[] = {
        "XCUDA_MEM_QUOTA_BYTES=lots", "XCUDA_GPU_INDEX=-1", "XCUDA_SHM_PATH=relative/path",
        "XCUDA_TARGET_UTIL=3", "XCUDA_KP=nan", "XCUDA_KI=-4", "XCUDA_KD=", "XCUDA_A_L=1e9",
        "XCUDA_A_H=2", "XCUDA_FALLBACK_LAUNCH_RATE=0", "XCUDA_MIN_LAUNCH_RATE=fast",
        "XCUDA_CONTROL_PERIOD_MS=0", "XCUDA_SHM_STALE_MS=1.5", "XCUDA_EXIT_TIMEOUT_MS=99999999999",
        "XCUDA_LOG_LEVEL=loud", "XCUDA_MEM_QUOTA=4G", "XCUDA_=x", "XCUDA_NOVALUE", NULL};
    struct xc_config c, d;
    char msgs[4096];
    int n = parse(env, &c, msgs, sizeof msgs);
    xc_config_defaults(&d);
    CHECK(n == 17, "17 problems, got %d:\n%s", n, msgs);
    CHECK(c.quota_kind == d.quota_kind && c.quota_pct == d.quota_pct, "quota default");
    CHECK(!strcmp(c.shm_path, d.shm_path) && c.gpu_index == 0, "path default");
    CHECK(c.target_util == d.target_util && c.kp == d.kp && c.ki == d.ki && c.kd == d.kd, "controller defaults");
    CHECK(c.a_l == d.a_l && c.a_h == d.a_h, "clock defaults");
    CHECK(c.fallback_rate == d.fallback_rate && c.min_rate == d.min_rate, "rate defaults");
    CHECK(c.control_period_ms == d.control_period_ms && c.shm_stale_ms == d.shm_stale_ms &&
              c.exit_timeout_ms == d.exit_timeout_ms && c.log_level == d.log_level,
          "period defaults");
    const char *named[] = {"XCUDA_MEM_QUOTA_BYTES='lots'", "XCUDA_KP='nan'", "XCUDA_SHM_PATH='relative/path'",
                           "XCUDA_MEM_QUOTA: unknown variable", "XCUDA_LOG_LEVEL='loud'", "using 10"};
    for (size_t i = 0; i < sizeof named / sizeof *named; i++)
        CHECK(strstr(msgs, named[i]) != NULL, "messages name '%s':\n%s", named[i], msgs);

    /* Control bytes and long values are masked and cut in messages. */
    const char *nasty[] = {"XCUDA_KP=\x1b[31mred\x1b[0m", NULL};
    n = parse(nasty, &c, msgs, sizeof msgs);
    CHECK(n == 1 && strchr(msgs, '\x1b') == NULL, "escape bytes masked: %s", msgs);
    char longval[600] = "XCUDA_KI=";
    memset(longval + 9, '9', sizeof longval - 10);
    longval[sizeof longval - 1] = '\0';
    const char *toolong[] = {longval, NULL};
    n = parse(toolong, &c, msgs, sizeof msgs);
    CHECK(n == 1 && strlen(msgs) < 200 && c.ki == d.ki, "long value rejected and cut: %zu", strlen(msgs));

    /* A tiny message buffer still counts every problem and stays terminated. */
    char tiny[16];
    n = parse(env, &c, tiny, sizeof tiny);
    CHECK(n == 17 && strlen(tiny) < sizeof tiny, "tiny buffer: %d", n);

    const char *minmax[] = {"XCUDA_FALLBACK_LAUNCH_RATE=50", "XCUDA_MIN_LAUNCH_RATE=100", NULL};
    n = parse(minmax, &c, msgs, sizeof msgs);
    CHECK(n == 1 && c.min_rate == 50 && c.fallback_rate == 50, "floor above the fallback: %s", msgs);
}

int main(void)
{
    test_defaults();
    test_sizes();
    test_numbers();
    test_locale_independent();
    test_environment();
    test_malformed();
    if (failures) {
        fprintf(stderr, "test_config: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_config: ok\n");
    return 0;
}
