/* Unit tests of where the limits come from: the plan file's text (src/config.c xc_config_resolve), the job's
 * environment only tightening it, the trust checks on the plan file (src/plan.c xc_plan_read) and the step
 * daemon found from /proc (xc_stepd_job, on a made-up /proc), and the root xcuda.conf beside the library that
 * names the plan directory (xc_conf_parse, xc_conf_plan_dir). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../src/config.h"
#include "../src/plan.h"

#include "check.h"

static const char PLAN[] = "slurm=4711\njob=12\nkind=place\ngpu=2\npct=35\nmem=4294967296\nkp=0.5\nki=12.5\n"
                           "kd=0.02\nnode=n1\nuid=1000\n";

static int resolve(const char *const *env, const char *plan, struct xc_config *c, long long *uid, char *msgs,
                   size_t len)
{
    return xc_config_resolve(env, plan, plan ? strlen(plan) : 0, c, uid, msgs, len);
}

static void test_plan_fields(void)
{
    const char *env[] = {NULL};
    struct xc_config c;
    long long uid;
    char msgs[1024];
    CHECK(resolve(env, PLAN, &c, &uid, msgs, sizeof msgs) == 0, "a plan of the Prolog's parses: %s", msgs);
    CHECK(c.gpu_index == 2 && !strcmp(c.shm_path, "/dev/shm/muxflow-gpu-2"), "the plan's GPU and its record: %u %s",
          c.gpu_index, c.shm_path);
    CHECK(c.quota_kind == XC_QUOTA_BYTES && c.quota_bytes == 4294967296ull && c.quota_pct == 0,
          "the plan's quota, bytes alone");
    CHECK(c.kp == 0.5 && c.ki == 12.5 && c.kd == 0.02, "the plan's gains");
    CHECK(c.target_util == 0.9 && c.fallback_rate == 2000.0 && c.min_rate == 10.0, "defaults for the rest");
    CHECK(uid == 1000, "the plan's uid: %lld", uid);

    const char *op = "gpu=1\nshm=/run/rec-1\ntarget=0.5\nfallback=100\nfloor=5\nperiod=40\nstale=500\nal=4\nah=0.25\n";
    CHECK(resolve(env, op, &c, &uid, msgs, sizeof msgs) == 0, "every key: %s", msgs);
    CHECK(!strcmp(c.shm_path, "/run/rec-1") && c.target_util == 0.5 && c.fallback_rate == 100 && c.min_rate == 5 &&
          c.control_period_ms == 40 && c.shm_stale_ms == 500 && c.a_l == 4 && c.a_h == 0.25, "operator keys");
    CHECK(uid == -1, "no uid line: -1");
    CHECK(c.quota_kind == XC_QUOTA_PERCENT && c.quota_pct == 40.0, "no mem: the default 40%%");

    CHECK(resolve(env, "mem=none\ngpu=x\nuid=root\n", &c, &uid, msgs, sizeof msgs) == 3, "bad values: %s", msgs);
    CHECK(c.quota_kind == XC_QUOTA_PERCENT && c.quota_pct == 40.0 && c.gpu_index == 0, "bad values: defaults");
    CHECK(uid == -2, "a uid that is no uid matches no one");

    CHECK(resolve(env, NULL, &c, &uid, msgs, sizeof msgs) == 0, "no plan: %s", msgs);
    CHECK(c.quota_kind == XC_QUOTA_PERCENT && c.quota_pct == 40.0 && !strcmp(c.shm_path, "/dev/shm/muxflow-gpu-0") &&
          c.fallback_rate == 2000.0, "no plan: strict defaults, never unlimited");
}

static void test_env_cannot_loosen(void)
{
    const char *attack[] = {"XCUDA_FALLBACK_LAUNCH_RATE=1e9", "XCUDA_MIN_LAUNCH_RATE=1e6", "XCUDA_MEM_QUOTA_BYTES=none",
                            "XCUDA_SHM_PATH=/tmp/mine", "XCUDA_TARGET_UTIL=2", "XCUDA_GPU_INDEX=3", "XCUDA_KP=1000",
                            "XCUDA_KI=0", "XCUDA_CONTROL_PERIOD_MS=10000", "XCUDA_SHM_STALE_MS=3600000",
                            "XCUDA_A_L=0", "XCUDA_A_H=0", "XCUDA_EXIT_TIMEOUT_MS=600000", NULL};
    for (int with_plan = 0; with_plan < 2; with_plan++) {
        struct xc_config c, want;
        long long uid;
        char msgs[4096];
        resolve((const char *[]){NULL}, with_plan ? PLAN : NULL, &want, &uid, NULL, 0);
        int n = resolve(attack, with_plan ? PLAN : NULL, &c, &uid, msgs, sizeof msgs);
        CHECK(n == 13, "every looser setting is reported (%d): %s", n, msgs);
        CHECK(strstr(msgs, "XCUDA_MEM_QUOTA_BYTES") && strstr(msgs, "may only make xCUDA stricter"), "%s", msgs);
        CHECK(c.quota_kind == want.quota_kind && c.quota_bytes == want.quota_bytes && c.quota_pct == want.quota_pct,
              "quota kept");
        CHECK(c.fallback_rate == want.fallback_rate && c.min_rate == want.min_rate, "rates kept: %g %g",
              c.fallback_rate, c.min_rate);
        CHECK(!strcmp(c.shm_path, want.shm_path) && c.gpu_index == want.gpu_index, "record kept: %s", c.shm_path);
        CHECK(c.target_util == want.target_util && c.target_cap == 2.0, "target kept");
        CHECK(c.kp == want.kp && c.ki == want.ki && c.control_period_ms == want.control_period_ms &&
              c.shm_stale_ms == want.shm_stale_ms && c.a_l == want.a_l && c.a_h == want.a_h &&
              c.exit_timeout_ms == want.exit_timeout_ms, "controller kept");
    }
}

static void test_env_can_tighten(void)
{
    struct xc_config c;
    long long uid;
    char msgs[1024];
    const char *tight[] = {"XCUDA_FALLBACK_LAUNCH_RATE=50", "XCUDA_MIN_LAUNCH_RATE=2", "XCUDA_MEM_QUOTA_BYTES=1GiB",
                           "XCUDA_TARGET_UTIL=0.4", "XCUDA_EXIT_TIMEOUT_MS=500", "XCUDA_LOG_LEVEL=debug",
                           "XCUDA_STATS_DIR=/run/muxflow/jobs/4711", NULL};
    CHECK(resolve(tight, PLAN, &c, &uid, msgs, sizeof msgs) == 0, "stricter settings pass: %s", msgs);
    CHECK(c.fallback_rate == 50 && c.min_rate == 2 && c.quota_bytes == 1ull << 30 && c.target_util == 0.4 &&
          c.target_cap == 0.4 && c.exit_timeout_ms == 500, "stricter settings taken");
    CHECK(c.log_level == XC_LOG_DEBUG && !strcmp(c.stats_dir, "/run/muxflow/jobs/4711"), "the job's own settings");

    /* What the TaskProlog exports is the plan's: silent. */
    const char *same[] = {"XCUDA_GPU_INDEX=2", "XCUDA_MEM_QUOTA_BYTES=4294967296", "XCUDA_KP=0.5", "XCUDA_KI=12.5",
                          "XCUDA_KD=0.02", NULL};
    CHECK(resolve(same, PLAN, &c, &uid, msgs, sizeof msgs) == 0, "the TaskProlog's exports: %s", msgs);

    /* A percentage next to the plan's bytes (and bytes next to the default percentage): both apply. */
    CHECK(resolve((const char *[]){"XCUDA_MEM_QUOTA_BYTES=10%", NULL}, PLAN, &c, &uid, msgs, sizeof msgs) == 0,
          "%s", msgs);
    CHECK(c.quota_kind == XC_QUOTA_BYTES && c.quota_bytes == 4294967296ull && c.quota_pct == 10.0, "bytes and 10%%");
    CHECK(resolve((const char *[]){"XCUDA_MEM_QUOTA_BYTES=1GiB", NULL}, NULL, &c, &uid, msgs, sizeof msgs) == 0,
          "%s", msgs);
    CHECK(c.quota_kind == XC_QUOTA_PERCENT && c.quota_pct == 40.0 && c.quota_bytes == 1ull << 30, "40%% and 1 GiB");
    /* A larger percentage than the default is looser. */
    CHECK(resolve((const char *[]){"XCUDA_MEM_QUOTA_BYTES=100%", NULL}, NULL, &c, &uid, msgs, sizeof msgs) == 1,
          "%s", msgs);
    CHECK(c.quota_pct == 40.0, "100%% ignored");
}

static char tmpdir[] = "/tmp/xcuda-test-plan-XXXXXX";

static void put(const char *rel, const char *text, mode_t mode)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", tmpdir, rel);
    unlink(p);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
    chmod(p, mode);
}

static void test_plan_trust(void)
{
    unsigned me = (unsigned)geteuid();
    char buf[XC_PLAN_MAX + 1], p[256], q[256];
    const char *why = "";
    chmod(tmpdir, 0755);
    put("4711.plan", PLAN, 0644);
    CHECK(xc_plan_read(tmpdir, 4711, me, buf, sizeof buf, &why) == (ssize_t)strlen(PLAN) && !strcmp(buf, PLAN),
          "the owner's plan is read: %s", why);
    CHECK(xc_plan_read(tmpdir, 4712, me, buf, sizeof buf, &why) == -1, "no plan for another job");
    CHECK(xc_plan_read(tmpdir, 4711, me + 1, buf, sizeof buf, &why) == -1, "another owner's directory: %s", why);

    put("4711.plan", PLAN, 0664);
    CHECK(xc_plan_read(tmpdir, 4711, me, buf, sizeof buf, &why) == -1, "a group-writable plan: %s", why);
    put("4711.plan", PLAN, 0646);
    CHECK(xc_plan_read(tmpdir, 4711, me, buf, sizeof buf, &why) == -1, "a world-writable plan: %s", why);

    put("elsewhere", PLAN, 0644);
    snprintf(p, sizeof p, "%s/4711.plan", tmpdir);
    snprintf(q, sizeof q, "%s/elsewhere", tmpdir);
    unlink(p);
    CHECK(symlink(q, p) == 0, "symlink");
    CHECK(xc_plan_read(tmpdir, 4711, me, buf, sizeof buf, &why) == -1 && strstr(why, "link"), "a link: %s", why);
    unlink(p);
    CHECK(mkfifo(p, 0644) == 0, "fifo");
    CHECK(xc_plan_read(tmpdir, 4711, me, buf, sizeof buf, &why) == -1, "a FIFO, without blocking: %s", why);
    unlink(p);

    static char big[XC_PLAN_MAX + 2];
    memset(big, 'a', sizeof big - 1);
    put("4711.plan", big, 0644);
    CHECK(xc_plan_read(tmpdir, 4711, me, buf, sizeof buf, &why) == -1, "larger than a plan: %s", why);

    put("4711.plan", PLAN, 0644);
    chmod(tmpdir, 0775);
    CHECK(xc_plan_read(tmpdir, 4711, me, buf, sizeof buf, &why) == -1, "a group-writable directory: %s", why);
    chmod(tmpdir, 01777);
    CHECK(xc_plan_read(tmpdir, 4711, me, buf, sizeof buf, &why) == -1, "a directory like /tmp: %s", why);
    chmod(tmpdir, 0755);

    snprintf(q, sizeof q, "%s-link", tmpdir);
    unlink(q);
    CHECK(symlink(tmpdir, q) == 0, "dir symlink");
    CHECK(xc_plan_read(q, 4711, me, buf, sizeof buf, &why) == -1, "a linked directory: %s", why);
    unlink(q);

    if (me == 0) {  /* root can give the file to another user: a plan of anyone but root is none */
        CHECK(chown(p, 1001, 1001) == 0, "chown");
        CHECK(xc_plan_read(tmpdir, 4711, 0, buf, sizeof buf, &why) == -1, "a user's plan file: %s", why);
    }
    unlink(p);
}

static void test_conf_parse(void)
{
    char dir[64];
    const char *why = "";
    CHECK(xc_conf_parse("plan_dir=/run/x/plans\n", dir, sizeof dir, &why) == 0 && !strcmp(dir, "/run/x/plans"),
          "plan_dir: %s", why);
    CHECK(xc_conf_parse("# the dev cluster\n\n  plan_dir = /a b/p  \r\n", dir, sizeof dir, &why) == -1,
          "blanks before '=' are no key: %s", why);
    CHECK(xc_conf_parse("# the dev cluster\n\n  plan_dir= /tmp/s/plans  \r\n", dir, sizeof dir, &why) == 0 &&
          !strcmp(dir, "/tmp/s/plans"), "comments, blank lines, blanks around the value: %s", why);
    const char *bad[] = {"", "# nothing\n", "plan_dir=\n", "plan_dir=relative/plans\n", "plan_dir=/a\nplan_dir=/b\n",
                         "plan_dir=/a\nmem=none\n", "plan_dirx=/a\n", "PLAN_DIR=/a\n",
                         "plan_dir=/a-path-longer-than-the-buffer-of-sixty-four-bytes-it-is-read-into/x\n"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(xc_conf_parse(bad[i], dir, sizeof dir, &why) == -1, "not a conf: %s", bad[i]);
}

static void test_conf_trust(void)
{
    unsigned me = (unsigned)geteuid();
    char dir[XC_PATH_MAX], lib[340], p[300], q[300];
    const char *why = "";
    chmod(tmpdir, 0755);
    snprintf(lib, sizeof lib, "%s/libxcuda.so", tmpdir);  /* only its directory is looked at */
    snprintf(p, sizeof p, "%s/xcuda.conf", tmpdir);
    unlink(p);
    CHECK(xc_conf_plan_dir(lib, me, dir, sizeof dir, &why) == 0 && strstr(why, "no xcuda.conf"), "none: %s", why);
    put("xcuda.conf", "plan_dir=/srv/plans\n", 0644);
    CHECK(xc_conf_plan_dir(lib, me, dir, sizeof dir, &why) == 1 && !strcmp(dir, "/srv/plans"), "the owner's: %s",
          why);
    CHECK(xc_conf_plan_dir(lib, me + 1, dir, sizeof dir, &why) == -1, "another owner's: %s", why);
    CHECK(xc_conf_plan_dir("libxcuda.so", me, dir, sizeof dir, &why) == 0, "a path with no directory");

    put("xcuda.conf", "plan_dir=/srv/plans\n", 0664);
    CHECK(xc_conf_plan_dir(lib, me, dir, sizeof dir, &why) == -1 && strstr(why, "regular file only root"),
          "a group-writable conf: %s", why);
    put("xcuda.conf", "plan_dir=/srv/plans\n", 0646);
    CHECK(xc_conf_plan_dir(lib, me, dir, sizeof dir, &why) == -1, "a world-writable conf: %s", why);
    put("xcuda.conf", "plan_dir=/srv/plans\nmem=none\n", 0644);
    CHECK(xc_conf_plan_dir(lib, me, dir, sizeof dir, &why) == -1, "a conf that does not parse: %s", why);

    put("conf-elsewhere", "plan_dir=/srv/plans\n", 0644);
    snprintf(q, sizeof q, "%s/conf-elsewhere", tmpdir);
    unlink(p);
    CHECK(symlink(q, p) == 0, "symlink");
    CHECK(xc_conf_plan_dir(lib, me, dir, sizeof dir, &why) == -1 && strstr(why, "symbolic link"), "a link: %s", why);
    unlink(p);
    unlink(q);
    CHECK(mkfifo(p, 0644) == 0, "fifo");
    CHECK(xc_conf_plan_dir(lib, me, dir, sizeof dir, &why) == -1, "a FIFO, without blocking: %s", why);
    unlink(p);
    static char big[XC_PLAN_MAX + 16];
    memset(big, '#', sizeof big - 1);
    put("xcuda.conf", big, 0644);
    CHECK(xc_conf_plan_dir(lib, me, dir, sizeof dir, &why) == -1 && strstr(why, "larger"), "too big: %s", why);

    put("xcuda.conf", "plan_dir=/srv/plans\n", 0644);
    chmod(tmpdir, 0775);
    CHECK(xc_conf_plan_dir(lib, me, dir, sizeof dir, &why) == -1 && strstr(why, "directory is not root's"),
          "a group-writable directory: %s", why);
    chmod(tmpdir, 01777);
    CHECK(xc_conf_plan_dir(lib, me, dir, sizeof dir, &why) == -1, "a directory like /tmp: %s", why);
    chmod(tmpdir, 0755);

    snprintf(q, sizeof q, "%s-link", tmpdir);
    unlink(q);
    CHECK(symlink(tmpdir, q) == 0, "dir symlink");
    snprintf(lib, sizeof lib, "%s/libxcuda.so", q);
    CHECK(xc_conf_plan_dir(lib, me, dir, sizeof dir, &why) == -1, "through a linked directory: %s", why);
    unlink(q);

    if (me == 0) {  /* root can give the directory to another user: his directory counts for nothing */
        snprintf(lib, sizeof lib, "%s/libxcuda.so", tmpdir);
        CHECK(chown(tmpdir, 1001, 1001) == 0, "chown");
        CHECK(xc_conf_plan_dir(lib, 0, dir, sizeof dir, &why) == -1, "a user's directory: %s", why);
        CHECK(chown(tmpdir, 0, 0) == 0 && chown(p, 1001, 1001) == 0, "chown");
        CHECK(xc_conf_plan_dir(lib, 0, dir, sizeof dir, &why) == -1, "a user's conf: %s", why);
    }
    unlink(p);
}

static void test_stepd_title(void)
{
    long long job = 0;
    CHECK(xc_stepd_title("slurmstepd: [4711.0]", &job) == 0 && job == 4711, "a step");
    CHECK(xc_stepd_title("slurmstepd: [12.batch]  ", &job) == 0 && job == 12, "the batch step, padded");
    CHECK(xc_stepd_title("slurmstepd: [12.4294967294]", &job) == 0, "a numbered step");
    const char *bad[] = {"slurmstepd", "slurmstepd: [4711]", "slurmstepd: [.0]", "slurmstepd: [1.]",
                         "slurmstepd: [1.0] x", "xslurmstepd: [1.0]", "slurmstepd: [1.0", "slurmstepd: [1.a/b]",
                         "slurmstepd: [1234567890123456789.0]"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(xc_stepd_title(bad[i], &job) != 0, "not a title: %s", bad[i]);
}

/* A made-up /proc: pid, comm, ppid, uids, title. */
static void fake_proc(const char *root, int pid, const char *comm, int ppid, unsigned uid, const char *title)
{
    char p[300];
    snprintf(p, sizeof p, "%s/%d", root, pid);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/%d/stat", root, pid);
    FILE *f = fopen(p, "w");
    fprintf(f, "%d (%s) S %d 1 1 0\n", pid, comm, ppid);
    fclose(f);
    snprintf(p, sizeof p, "%s/%d/status", root, pid);
    f = fopen(p, "w");
    fprintf(f, "Name:\t%s\nUmask:\t0022\nState:\tS\nUid:\t%u\t%u\t%u\t%u\nGid:\t0\t0\t0\t0\n", comm, uid, uid, uid,
            uid);
    fclose(f);
    snprintf(p, sizeof p, "%s/%d/cmdline", root, pid);
    f = fopen(p, "w");
    fwrite(title, 1, strlen(title) + 1, f);
    fclose(f);
}

static void test_stepd_walk(void)
{
    char root[300];
    snprintf(root, sizeof root, "%s/proc", tmpdir);
    mkdir(root, 0755);
    fake_proc(root, 100, "slurmstepd", 1, 0, "slurmstepd: [4711.0]");
    fake_proc(root, 200, "bash", 100, 1000, "bash");
    /* The user's own impostors below the real one: his uid, or root's name without its title. */
    fake_proc(root, 300, "slurmstepd", 200, 1000, "slurmstepd: [9999.0]");
    fake_proc(root, 400, "python3", 300, 1000, "python3");
    CHECK(xc_stepd_job(root, 400, 0) == 4711, "the real step daemon's job, past an impostor");
    CHECK(xc_stepd_job(root, 200, 0) == 4711, "the parent");
    CHECK(xc_stepd_job(root, 400, 1000) == 9999, "(as uid 1000, the impostor is the nearest)");
    fake_proc(root, 500, "python3", 1, 1000, "python3");  /* outside any job */
    CHECK(xc_stepd_job(root, 500, 0) == -1, "no step daemon: none");
    fake_proc(root, 600, "slurmstepd", 1, 0, "slurmstepd");  /* slurmstepd without a job's title */
    fake_proc(root, 700, "x", 600, 1000, "x");
    CHECK(xc_stepd_job(root, 700, 0) == -1, "a step daemon without a title: none");
    fake_proc(root, 800, "x", 800, 1000, "x");  /* a loop ends */
    CHECK(xc_stepd_job(root, 800, 0) == -1, "a loop ends");
    CHECK(xc_stepd_job(root, 999, 0) == -1, "a missing process");
}

int main(void)
{
    if (mkdtemp(tmpdir) == NULL)
        return 2;
    test_plan_fields();
    test_env_cannot_loosen();
    test_env_can_tighten();
    test_plan_trust();
    test_conf_parse();
    test_conf_trust();
    test_stepd_title();
    test_stepd_walk();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        failures++;
    if (failures) {
        fprintf(stderr, "test_plan: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_plan: ok\n");
    return 0;
}
