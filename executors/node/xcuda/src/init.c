/*
 * Lazy initialisation: configuration, the driver's real entry points, the
 * memory tables. Nothing runs at load time, so processes of a job that never
 * touch CUDA (the shell, data loaders) pay nothing but the dlsym check.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "xcuda.h"

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

static void do_init(void)
{
    char msgs[2048];
    int problems = xc_config_parse((const char *const *)environ, &xc_g.cfg, msgs, sizeof msgs);
    atomic_store(&xc_log_level, (int)xc_g.cfg.log_level);
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
