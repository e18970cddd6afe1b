/*
 * Compute pacing (paper §4.1, Eq. 1-2 and PID): a token bucket in front of
 * every kernel launch whose refill rate a controller thread sets once per
 * XCUDA_CONTROL_PERIOD_MS from the node agent's per-GPU record.
 *
 * Launches take numbered tickets (one fetch_add) and run while their ticket
 * is within `granted`; only the controller writes `granted`. So the launch
 * path is lock-free and makes no syscall, reads no clock, logs nothing. A
 * launch finds the bucket empty only when it is being paced; it then sleeps
 * in the slow path below, which is the pacing delay itself.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <time.h>

#include "control.h"
#include "shm_read.h"
#include "xcuda.h"
#include "xcuda_stats.h"

#define OPEN_SLACK (1ull << 62)  /* granted this far ahead: the gate is open */

struct xc_pace xc_pace;

enum ctl_state { CTL_NONE, CTL_RUNNING, CTL_FAILED };
static _Atomic int ctl_state;
static pthread_mutex_t ctl_lock = PTHREAD_MUTEX_INITIALIZER;

enum ctl_mode { MODE_START, MODE_FALLBACK, MODE_CONTROL };

struct controller {
    const struct xc_config *cfg;
    struct xc_shm_reader reader;
    struct xc_pacer_params params;
    struct xc_pacer pacer;
    struct xc_pid pid;
    struct xc_meter meter;
    enum ctl_mode mode;
    int warned_fallback;
    int was_open;
    double frac;             /* fractional tokens carried to the next period */
    double period_s;
    uint64_t last_ns, last_taken;
    struct xc_stats_pub stats;   /* this process's counters for the node agent (XCUDA_STATS_DIR) */
};

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Tokens for one period; `taken` as read at the start of the tick. */
static void grant(struct controller *c, int open, double rate, double dt, uint64_t taken)
{
    if (open) {
        atomic_store_explicit(&xc_pace.granted, taken + OPEN_SLACK, memory_order_relaxed);
        atomic_store_explicit(&xc_pace.rate_milli, 0, memory_order_relaxed);
        c->was_open = 1;
        c->frac = 0.0;
        return;
    }
    uint64_t g = atomic_load_explicit(&xc_pace.granted, memory_order_relaxed);
    if (c->was_open || g > taken + OPEN_SLACK / 2) {
        g = taken;  /* closing: forget the open gate's slack */
        c->was_open = 0;
    }
    c->frac += rate * dt;
    uint64_t add = (uint64_t)c->frac;
    c->frac -= (double)add;
    /* An idle job may bank two periods' worth, no more. */
    double burst_d = ceil(2.0 * rate * c->period_s);
    uint64_t cap = taken + (burst_d < 1.0 ? 1 : (uint64_t)burst_d);
    uint64_t next = g + add;
    if (next > cap)
        next = g > cap ? g : cap;
    atomic_store_explicit(&xc_pace.granted, next, memory_order_relaxed);
    atomic_store_explicit(&xc_pace.rate_milli, (uint64_t)(rate * 1000.0) + 1, memory_order_relaxed);
}

static void tick(struct controller *c, uint64_t now)
{
    const struct xc_config *cfg = c->cfg;
    double dt = c->mode == MODE_START ? c->period_s : (double)(now - c->last_ns) / 1e9;
    if (!(dt > 0.0))
        dt = c->period_s;
    uint64_t taken = atomic_load_explicit(&xc_pace.taken, memory_order_relaxed);
    double demand = (double)(taken - c->last_taken) / dt;
    c->last_taken = taken;
    c->last_ns = now;

    struct xcuda_shm_record s;
    enum xc_shm_status st = xc_shm_read(&c->reader, now, (uint64_t)cfg->shm_stale_ms * 1000000ull, &s);
    if (st == XC_SHM_BUSY && c->mode == MODE_CONTROL) {
        /* The agent was mid-write each time: keep the last decision. */
        grant(c, c->pacer.mode == XC_PACER_OPEN, c->pacer.rate, dt, taken);
        return;
    }
    if (st == XC_SHM_OK) {
        if (c->mode != MODE_CONTROL) {
            xc_log(c->mode == MODE_FALLBACK ? XC_LOG_WARN : XC_LOG_INFO,
                   "GPU record %s in use: closed-loop pacing of kernel launches", c->reader.path);
            xc_pacer_reset(&c->pacer, cfg->fallback_rate);
            xc_pid_init(&c->pid, cfg->kp, cfg->ki, cfg->kd);
            xc_meter_reset(&c->meter);
            c->mode = MODE_CONTROL;
        }
        double u_sm = xc_meter_update(&c->meter, s.u_sm, (s.flags & XCUDA_SHM_FLAG_INTEGRAL) != 0,
                                      s.u_sm_integral_s, s.timestamp_ns);
        double target = s.target_util > 0.0 ? s.target_util : cfg->target_util;
        if (target > cfg->target_cap)
            target = cfg->target_cap;  /* the job asked for less */
        double a_c = xc_clock_factor(s.sm_clock_mhz, s.clock_threshold_mhz, s.clock_max_mhz, cfg->a_l, cfg->a_h);
        double u_gpu = xc_gpu_load(u_sm, a_c);
        xc_pacer_step(&c->params, &c->pacer, &c->pid, u_gpu, target, demand, dt);
        /* One line per period at debug level, every input and output at full precision: the controller's trace,
         * replayed through the Python mirror by executors.node.xcuda.trace (docs/GPU.md). */
        xc_log(XC_LOG_DEBUG,
               "pace ts=%llu flags=%u u_sm=%.17g integral=%.17g c_sm=%.17g t_sm=%.17g c_h=%.17g target=%.17g "
               "demand=%.17g dt=%.17g u=%.17g u_gpu=%.17g mode=%d rate=%.17g",
               (unsigned long long)s.timestamp_ns, (unsigned)s.flags, s.u_sm, s.u_sm_integral_s, s.sm_clock_mhz,
               s.clock_threshold_mhz, s.clock_max_mhz, target, demand, dt, u_sm, u_gpu, (int)c->pacer.mode,
               c->pacer.rate);
        grant(c, c->pacer.mode == XC_PACER_OPEN, c->pacer.rate, dt, taken);
        return;
    }
    if (c->mode != MODE_FALLBACK) {
        /* Said once at warning level; later losses of the record at info. */
        xc_log(c->warned_fallback ? XC_LOG_INFO : XC_LOG_WARN,
               "no usable GPU record at %s (%s): pacing kernel launches at the fixed safe rate of %g/s",
               c->reader.path, xc_shm_status_name(st), cfg->fallback_rate);
        c->warned_fallback = 1;
        c->mode = MODE_FALLBACK;
    }
    grant(c, 0, cfg->fallback_rate, dt, taken);
}

static void *controller_main(void *arg)
{
    (void)arg;
    struct controller c = {0};
    c.cfg = &xc_g.cfg;
    c.period_s = (double)c.cfg->control_period_ms / 1000.0;
    xc_shm_reader_init(&c.reader, c.cfg->shm_path, xc_g.trusted_uid);
    xc_pacer_params_default(&c.params, c.cfg->min_rate);
    xc_pacer_reset(&c.pacer, c.cfg->fallback_rate);
    xc_pid_init(&c.pid, c.cfg->kp, c.cfg->ki, c.cfg->kd);
    c.mode = MODE_START;
    c.last_taken = atomic_load(&xc_pace.taken);
    xc_stats_open(&c.stats, c.cfg->stats_dir);
    uint64_t period_ns = (uint64_t)c.cfg->control_period_ms * 1000000ull;
    uint64_t next = xc_now_ns();
    for (;;) {
        uint64_t now = xc_now_ns();
        tick(&c, now);
        xc_stats_publish(&c.stats, now, c.mode == MODE_FALLBACK,
                         atomic_load_explicit(&xc_pace.rate_milli, memory_order_relaxed) == 0);
        xc_exit_watchdog(now);
        next += period_ns;
        if (next <= now)
            next = now + period_ns;  /* we were descheduled: do not catch up in a burst */
        struct timespec ts = {(time_t)(next / 1000000000ull), (long)(next % 1000000000ull)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
            ;
    }
    return NULL;
}

void xc_pacing_start(void)
{
    if (atomic_load_explicit(&ctl_state, memory_order_acquire) != CTL_NONE)
        return;
    xc_ensure_init();
    pthread_mutex_lock(&ctl_lock);
    if (atomic_load(&ctl_state) == CTL_NONE) {
        if (xc_spawn("xcuda-pacing", controller_main) == 0) {
            atomic_store(&ctl_state, CTL_RUNNING);
        } else {
            /* Never hang the job on our own failure: launch unpaced. */
            xc_log(XC_LOG_ERROR, "kernel launches are not paced");
            atomic_store(&xc_pace.granted, atomic_load(&xc_pace.taken) + OPEN_SLACK);
            atomic_store(&ctl_state, CTL_FAILED);
        }
    }
    pthread_mutex_unlock(&ctl_lock);
}

void xc_pacing_atfork_child(void)
{
    pthread_mutex_init(&ctl_lock, NULL);
    atomic_store(&ctl_state, CTL_NONE);
    atomic_store(&xc_pace.frozen, 0);
    atomic_store(&xc_pace.in_flight, 0);  /* only the forking thread exists in the child */
    /* No controller in the child yet: the next launch takes the slow path and starts one. */
    atomic_store(&xc_pace.granted, atomic_load(&xc_pace.taken));
}

CUresult xc_gate_wait(uint64_t ticket)
{
    xc_pacing_start();
    uint64_t t0 = xc_now_ns();
    atomic_fetch_add_explicit(&xc_pace.waits, 1, memory_order_relaxed);
    for (;;) {
        if (atomic_load_explicit(&xc_pace.frozen, memory_order_relaxed)) {
            CUresult r = xc_gate_frozen();
            if (r != CUDA_SUCCESS)
                return r;
            if (atomic_load_explicit(&xc_pace.frozen, memory_order_relaxed))
                sleep_ns(1000000);
            continue;  /* the contexts were kept: wait for the ticket as before */
        }
        uint64_t g = atomic_load_explicit(&xc_pace.granted, memory_order_relaxed);
        if (ticket <= g)
            break;
        uint64_t milli = atomic_load_explicit(&xc_pace.rate_milli, memory_order_relaxed);
        /* Sleep about until our ticket comes up, in slices short enough to notice a rate change. */
        double wait_s = milli > 1 ? (double)(ticket - g) * 1000.0 / (double)milli : 50e-6;
        uint64_t ns = (uint64_t)(wait_s * 1e9);
        sleep_ns(ns < 20000 ? 20000 : (ns > 5000000 ? 5000000 : ns));
    }
    atomic_fetch_add_explicit(&xc_pace.waited_ns, xc_now_ns() - t0, memory_order_relaxed);
    return CUDA_SUCCESS;
}

CUresult xc_gate_frozen(void)
{
    /* A graceful exit is synchronising the contexts: hold the launch until
     * they are released, then fail it, so no new work reaches a dying
     * context; or until they are kept for the program's handler (the state
     * is armed again), then let it go on (CUDA_SUCCESS: launch it). */
    while (atomic_load_explicit(&xc_exit_state, memory_order_acquire) == XC_EXIT_RUNNING)
        sleep_ns(1000000);
    if (atomic_load_explicit(&xc_exit_state, memory_order_acquire) == XC_EXIT_DONE)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return CUDA_SUCCESS;
}
