/*
 * Lazy initialisation: configuration, the driver's real entry points, the
 * memory tables. Nothing runs at load time, so processes of a job that never
 * touch CUDA (the shell, data loaders) pay nothing but the dlsym check.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "plan.h"
#include "xcuda.h"

#ifndef XCUDA_PLAN_DIR
#define XCUDA_PLAN_DIR "/run/muxflow/plans"  /* the node scripts' @PLAN_DIR@; make PLAN_DIR=... */
#endif

struct xc_state xc_g;

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int in_init;
static _Atomic int missing_logged[XC_HOOK_COUNT];
static _Atomic int cuda_ready;
static pthread_mutex_t ready_lock = PTHREAD_MUTEX_INITIALIZER;

uint64_t xc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void atfork_child(void)
{
    /* Only the forking thread survives: the controller and exit threads are
     * gone. They are started again if the child uses CUDA itself. */
    atomic_store(&cuda_ready, 0);
    pthread_mutex_init(&ready_lock, NULL);
    pthread_mutex_init(&init_lock, NULL);  /* another thread may have held it at fork */
    xc_pacing_atfork_child();
    xc_signals_atfork_child();
}

static void log_config(const struct xc_config *c)
{
    char quota[64];
    if (c->quota_kind == XC_QUOTA_NONE)
        snprintf(quota, sizeof quota, "none");
    else if (c->quota_kind == XC_QUOTA_PERCENT)
        snprintf(quota, sizeof quota, "%g%% of device memory", c->quota_pct);
    else
        snprintf(quota, sizeof quota, "%llu bytes", (unsigned long long)c->quota_bytes);
    xc_log(XC_LOG_INFO,
           "memory quota %s; GPU record %s; target U_GPU %g; PID kp=%g ki=%g kd=%g; a_L=%g a_H=%g; "
           "fallback %g launches/s, floor %g/s; period %u ms",
           quota, c->shm_path, c->target_util, c->kp, c->ki, c->kd, c->a_l, c->a_h, c->fallback_rate,
           c->min_rate, c->control_period_ms);
}

/* Whose files count as root's: root's, but in the test build (XCUDA_TEST_HOOKS) this process's own user, so that
 * the tests, run by anyone, can play the Prolog and the step daemon. The production library has no such switch. */
static unsigned trusted_uid(void)
{
#ifdef XCUDA_TEST_HOOKS
    return (unsigned)geteuid();
#else
    return 0;
#endif
}

/* The plan directory: the one the root xcuda.conf beside this library names, else the compiled-in one. The path is
 * the one the loader was given (LD_PRELOAD's, links unresolved), so a user's link to the real library in a
 * directory of his, beside a file of his, finds his directory and gets the compiled-in one. Says why in *note, at
 * the level in *level. */
static const char *plan_dir(char *buf, size_t cap, char *note, size_t note_len, enum xc_log_level *level)
{
    Dl_info info = {0};
    const char *why = "the library's path is unknown", *lib = "libxcuda.so";
    int rc = 0;
    if (dladdr((void *)(uintptr_t)&xc_ensure_init, &info) != 0 && info.dli_fname != NULL) {
        lib = info.dli_fname;
        rc = xc_conf_plan_dir(lib, trusted_uid(), buf, cap, &why);
    }
    if (rc == 1) {
        *level = XC_LOG_INFO;
        snprintf(note, note_len, "plan directory %s, from %s's " XC_CONF_NAME, buf, lib);
        return buf;
    }
    *level = rc == 0 ? XC_LOG_INFO : XC_LOG_WARN;
    snprintf(note, note_len, "plan directory %s (compiled in): %s: %s", XCUDA_PLAN_DIR, lib, why);
    return XCUDA_PLAN_DIR;
}

/* The configuration: the plan of this process's job, the environment only making it stricter (config.h). */
static int configure(char *msgs, size_t len, char *plan_note, size_t note_len, char *dir_note, size_t dir_note_len,
                     enum xc_log_level *dir_level)
{
    static char conf_dir[XC_PATH_MAX];
    const char *dir = plan_dir(conf_dir, sizeof conf_dir, dir_note, dir_note_len, dir_level);
#ifdef XCUDA_TEST_HOOKS
    /* The test build only: the environment as the plan, as before plans (the tests of everything but where the
     * limits come from), or a plan directory of the test's. */
    const char *legacy = getenv("XCUDA_TEST_ENV_CONFIG");
    if (legacy != NULL && !strcmp(legacy, "1")) {
        snprintf(plan_note, note_len, "test build: the environment is the plan");
        dir_note[0] = '\0';
        return xc_config_parse((const char *const *)environ, &xc_g.cfg, msgs, len);
    }
    const char *test_dir = getenv("XCUDA_TEST_PLAN_DIR");
    if (test_dir != NULL && test_dir[0] == '/') {
        dir = test_dir;
        snprintf(dir_note, dir_note_len, "test build: plan directory %s, from XCUDA_TEST_PLAN_DIR", dir);
        *dir_level = XC_LOG_INFO;
    }
#endif
    static char plan[XC_PLAN_MAX + 1];
    const char *why = "not under a Slurm step daemon";
    ssize_t n = -1;
    long long job = xc_stepd_job("/proc", getppid(), trusted_uid());
    if (job >= 0)
        n = xc_plan_read(dir, job, trusted_uid(), plan, sizeof plan, &why);
    long long plan_uid = -1;
    int problems = xc_config_resolve((const char *const *)environ, n >= 0 ? plan : NULL, n >= 0 ? (size_t)n : 0,
                                     &xc_g.cfg, &plan_uid, msgs, len);
    if (n >= 0 && plan_uid != -1 && plan_uid != (long long)getuid()) {
        /* Another user's plan (a pid of a step daemon reused under us): not ours, so none. */
        why = "the plan is another user's";
        n = -1;
        problems = xc_config_resolve((const char *const *)environ, NULL, 0, &xc_g.cfg, &plan_uid, msgs, len);
    }
    if (n >= 0)
        snprintf(plan_note, note_len, "plan %s/%lld.plan", dir, job);
    else if (job >= 0)
        snprintf(plan_note, note_len, "job %lld: %s: built-in defaults", job, why);
    else
        snprintf(plan_note, note_len, "%s: built-in defaults", why);
    return problems;
}

static void do_init(void)
{
    char msgs[2048], note[XC_PATH_MAX + 96], dir_note[2 * XC_PATH_MAX + 96] = "";
    enum xc_log_level dir_level = XC_LOG_INFO;
    int problems = configure(msgs, sizeof msgs, note, sizeof note, dir_note, sizeof dir_note, &dir_level);
    xc_g.trusted_uid = trusted_uid();
    atomic_store(&xc_log_level, (int)xc_g.cfg.log_level);
    if (dir_note[0])
        xc_log(dir_level, "%s", dir_note);
    xc_log(XC_LOG_INFO, "limits: %s", note);
    for (char *line = msgs, *end; problems > 0 && *line; line = end + 1) {
        end = strchr(line, '\n');
        if (end == NULL)
            break;
        *end = '\0';
        xc_log(XC_LOG_ERROR, "invalid configuration: %s", line);
    }
    log_config(&xc_g.cfg);

    xc_mem_init();

    xc_dlsym_fn real_dlsym = xc_real_dlsym();
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        h = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL || real_dlsym == NULL) {
        xc_log(XC_LOG_ERROR, "cannot load the CUDA driver (libcuda.so.1): %s", h == NULL ? dlerror() : "no dlsym");
    } else {
        xc_g.libcuda = h;
        for (int i = 0; i < XC_HOOK_COUNT; i++) {
            void *p = real_dlsym(h, xc_hooks[i].name);
            if (p != NULL && p != xc_hooks[i].wrapper)
                atomic_store_explicit(&xc_real[i], p, memory_order_release);
        }
    }
    pthread_atfork(NULL, NULL, atfork_child);
}

void xc_ensure_init(void)
{
    if (XC_LIKELY(atomic_load_explicit(&xc_g.inited, memory_order_acquire)))
        return;
    if (in_init)
        return;  /* re-entered while the driver loads: callers see NULL reals */
    pthread_mutex_lock(&init_lock);
    if (!atomic_load_explicit(&xc_g.inited, memory_order_relaxed)) {
        in_init = 1;
        do_init();
        in_init = 0;
        atomic_store_explicit(&xc_g.inited, 1, memory_order_release);
    }
    pthread_mutex_unlock(&init_lock);
}

void *xc_real_slow(int id)
{
    xc_ensure_init();
    return atomic_load_explicit(&xc_real[id], memory_order_acquire);
}

CUresult xc_real_missing(int id)
{
    XC_LOG_ONCE(missing_logged[id], XC_LOG_WARN, "the CUDA driver has no %s; returning CUDA_ERROR_NOT_FOUND",
                xc_hooks[id].name);
    return CUDA_ERROR_NOT_FOUND;
}

int xc_spawn(const char *name, void *(*fn)(void *))
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);  /* the thread inherits it: signals go to the program's threads */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    pthread_t t;
    int rc = pthread_create(&t, &attr, fn, NULL);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0)
        pthread_setname_np(t, name);
    else
        xc_log(XC_LOG_ERROR, "cannot start thread %s: %s", name, strerror(rc));
    return rc;
}

void xc_cuda_ready(void)
{
    if (XC_LIKELY(atomic_load_explicit(&cuda_ready, memory_order_acquire)))
        return;
    xc_ensure_init();
    pthread_mutex_lock(&ready_lock);
    if (!atomic_load_explicit(&cuda_ready, memory_order_relaxed)) {
        xc_signals_arm();
        xc_signals_start_worker();
        xc_pacing_start();
        atomic_store_explicit(&cuda_ready, 1, memory_order_release);
    }
    pthread_mutex_unlock(&ready_lock);
}

__attribute__((destructor))
static void report_at_exit(void)
{
    if (!atomic_load(&xc_g.inited))
        return;
    uint64_t used, peak, quota, refused;
    xc_mem_stats(&used, &peak, &quota, &refused);
    xc_log(XC_LOG_INFO,
           "exit: %llu launches, %llu waited %.1f ms in total; memory peak %llu bytes of quota %llu, "
           "%llu allocations refused",
           (unsigned long long)atomic_load(&xc_pace.taken), (unsigned long long)atomic_load(&xc_pace.waits),
           (double)atomic_load(&xc_pace.waited_ns) / 1e6, (unsigned long long)peak,
           (unsigned long long)quota, (unsigned long long)refused);
}
