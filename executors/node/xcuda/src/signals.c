/*
 * Graceful exit (paper §4.2): 99 % of the errors MPS propagates to the online
 * service come from offline processes killed by SIGINT/SIGTERM mid-kernel.
 * On those signals xCUDA freezes new launches and synchronises the CUDA
 * contexts, and only then lets the signal do what the program intended:
 *  - terminate (no handler): the contexts are released first, then the
 *    process dies of the signal, with no kernel of its own in flight;
 *  - run the program's handler: the contexts are kept and launches resume.
 *    A training job's handler checkpoints, which needs its device memory; on
 *    a real driver a released context fails the job's next call ("invalid
 *    argument") and the checkpoint is lost. The handler starts with no kernel
 *    in flight, so one that exits at once is as safe as a default action;
 *  - ignore it: nothing happens.
 *
 * To stay in front of handlers the program installs later (Python, PyTorch
 * and training loops install their own), sigaction() and signal() are
 * interposed for SIGINT and SIGTERM once the process has called cuInit: the
 * program's action is recorded and reported back, xCUDA's handler stays
 * installed (with the program's mask and flags) and chains to it. SIG_IGN is
 * installed for real, so an ignored signal stays ignored across exec.
 *
 * The handler itself only flips atomics and posts a semaphore; the CUDA calls
 * run on a dedicated thread, which then re-sends the signal to the process.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "xcuda.h"

#define N_MANAGED 2

#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif
#define REDELIVER_MAGIC 0x78637564  /* "xcud": marks the signal xCUDA re-sends */

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
typedef sighandler_t (*signal_fn)(int, sighandler_t);

_Atomic int xc_exit_state = XC_EXIT_IDLE;

static struct sigaction prog_act[N_MANAGED];  /* what the program asked for */
static atomic_flag act_lock = ATOMIC_FLAG_INIT;
static _Atomic(sigaction_fn) real_sigaction_p;
static _Atomic(signal_fn) real_signal_p;

static _Atomic int worker_alive;
static sem_t exit_sem;
static volatile sig_atomic_t exit_sig;
static siginfo_t exit_info;
static _Atomic uint64_t exit_start_ns;

static int managed_index(int sig)
{
    return sig == SIGINT ? 0 : (sig == SIGTERM ? 1 : -1);
}

static sigaction_fn real_sigaction(void)
{
    sigaction_fn p = atomic_load_explicit(&real_sigaction_p, memory_order_acquire);
    if (p == NULL) {
        xc_dlsym_fn d = xc_real_dlsym();
        p = d != NULL ? (sigaction_fn)d(RTLD_NEXT, "sigaction") : NULL;
        atomic_store_explicit(&real_sigaction_p, p, memory_order_release);
    }
    return p;
}

static signal_fn real_signal(void)
{
    signal_fn p = atomic_load_explicit(&real_signal_p, memory_order_acquire);
    if (p == NULL) {
        xc_dlsym_fn d = xc_real_dlsym();
        p = d != NULL ? (signal_fn)d(RTLD_NEXT, "signal") : NULL;
        atomic_store_explicit(&real_signal_p, p, memory_order_release);
    }
    return p;
}

/* Serialises the recorded actions. Signals are blocked while it is held, so a
 * handler can never wait for a lock its own thread holds. */
static void lock_acts(sigset_t *saved)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, saved);
    while (atomic_flag_test_and_set_explicit(&act_lock, memory_order_acquire))
        CPU_RELAX();
}

static void unlock_acts(const sigset_t *saved)
{
    atomic_flag_clear_explicit(&act_lock, memory_order_release);
    pthread_sigmask(SIG_SETMASK, saved, NULL);
}

static void on_signal(int sig, siginfo_t *info, void *uc);

/* Puts xCUDA's handler (or a real SIG_IGN) in place for the program's action. */
static int install_for(int sig, const struct sigaction *prog)
{
    sigaction_fn real = real_sigaction();
    if (real == NULL)
        return -1;
    if (prog->sa_handler == SIG_IGN)
        return real(sig, prog, NULL);
    struct sigaction mine;
    memset(&mine, 0, sizeof mine);
    mine.sa_sigaction = on_signal;
    mine.sa_mask = prog->sa_mask;
    mine.sa_flags = SA_SIGINFO | (prog->sa_flags & (SA_ONSTACK | SA_RESTART | SA_NODEFER));
    return real(sig, &mine, NULL);
}

static void chain(int idx, int sig, siginfo_t *info, void *uc)
{
    sigset_t saved;
    lock_acts(&saved);
    struct sigaction prog = prog_act[idx];
    if (prog.sa_flags & SA_RESETHAND) {
        prog_act[idx].sa_handler = SIG_DFL;
        prog_act[idx].sa_flags &= ~(SA_SIGINFO | SA_RESETHAND);
    }
    unlock_acts(&saved);

    if (prog.sa_handler == SIG_IGN)
        return;
    if (prog.sa_handler == SIG_DFL) {
        /* Terminate as the signal intends: default action, then re-raise. The
         * signal is blocked while this handler runs, so it lands on return. */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction_fn real = real_sigaction();
        if (real != NULL)
            real(sig, &dfl, NULL);
        raise(sig);
        return;
    }
    if (prog.sa_flags & SA_SIGINFO)
        prog.sa_sigaction(sig, info, uc);
    else
        prog.sa_handler(sig);
}

static void on_signal(int sig, siginfo_t *info, void *uc)
{
    int saved_errno = errno;
    int idx = managed_index(sig);
    if (idx >= 0) {
        int ours = info != NULL && info->si_code == SI_QUEUE && info->si_pid == getpid() &&
                   info->si_value.sival_int == REDELIVER_MAGIC;
        int st = atomic_load(&xc_exit_state);
        if (ours) {
            chain(idx, sig, &exit_info, uc);
        } else if (st == XC_EXIT_ARMED && atomic_load(&worker_alive)) {
            int expected = XC_EXIT_ARMED;
            if (atomic_compare_exchange_strong(&xc_exit_state, &expected, XC_EXIT_RUNNING)) {
                exit_sig = sig;
                if (info != NULL)
                    exit_info = *info;
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC, &ts);  /* async-signal-safe */
                atomic_store(&exit_start_ns, (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec);
                atomic_store(&xc_pace.frozen, 1);
                sem_post(&exit_sem);
            }
        } else if (st != XC_EXIT_RUNNING) {
            /* Done already, or nobody to release contexts (a forked child). */
            chain(idx, sig, info, uc);
        }
        /* RUNNING: the sequence in progress ends by delivering its signal. */
    }
    errno = saved_errno;
}

static _Atomic int passed_on;

/* Whether the program has a handler of its own for the signal (not the
 * default action, not ignored): it then goes on after the signal. */
static int program_handles(int sig)
{
    int idx = managed_index(sig);
    if (idx < 0)
        return 0;
    sigset_t saved;
    lock_acts(&saved);
    sighandler_t h = prog_act[idx].sa_handler;
    unlock_acts(&saved);
    return h != SIG_DFL && h != SIG_IGN;
}

/* Hands the signal to the program, once, its contexts released, then lets
 * held launches fail. The signal goes first: a program thread held at the
 * launch gate dies of the signal before it sees its launch fail. */
/* Sends the signal again, marked as xCUDA's (on_signal chains it at once). */
static void redeliver(int sig)
{
    union sigval v;
    v.sival_int = REDELIVER_MAGIC;
    if (sigqueue(getpid(), sig, v) != 0)
        kill(getpid(), sig);
}

static void pass_on(void)
{
    if (atomic_exchange(&passed_on, 1))
        return;
    redeliver(exit_sig);
    atomic_store(&xc_exit_state, XC_EXIT_DONE);
}

/* Hands the signal to the program's handler with its contexts kept: launches
 * resume and the sequence is armed again, so a later signal is handled the
 * same way (a handler the program resets to the default then releases). */
static void pass_on_keeping(int sig)
{
    if (atomic_exchange(&passed_on, 1))
        return;  /* the watchdog passed it on already, as a release */
    atomic_store(&xc_pace.frozen, 0);
    atomic_store(&xc_exit_state, XC_EXIT_ARMED);
    atomic_store(&passed_on, 0);
    redeliver(sig);
}

#define DRAIN_TIMEOUT_MS 2000

/* Waits until no launch is between the gate and the driver's return (they
 * see `frozen` from now on and never enter). 1 when drained in time. */
static int drain_launches_in_flight(void)
{
    for (int waited_us = 0; waited_us < DRAIN_TIMEOUT_MS * 1000; waited_us += 100) {
        if (atomic_load_explicit(&xc_pace.in_flight, memory_order_seq_cst) == 0)
            return 1;
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return atomic_load_explicit(&xc_pace.in_flight, memory_order_seq_cst) == 0;
}

static void *exit_worker(void *arg)
{
    (void)arg;
    for (;;) {
        while (sem_wait(&exit_sem) != 0 && errno == EINTR)
            ;
        if (atomic_load(&xc_exit_state) != XC_EXIT_RUNNING)
            continue;
        int sig = exit_sig;
        const char *name = sig == SIGINT ? "SIGINT" : "SIGTERM";
        int keep = program_handles(sig);
        xc_log(XC_LOG_INFO, "%s: kernel launches frozen; synchronizing %s the CUDA context(s)", name,
               keep ? "(the program handles the signal: its contexts are kept)" : "and releasing");
        if (!drain_launches_in_flight())
            xc_log(XC_LOG_WARN, "%s: a kernel launch is still inside the driver after %d ms; %s anyway",
                   name, DRAIN_TIMEOUT_MS, keep ? "synchronizing" : "releasing");
        if (keep) {
            int n = xc_ctx_synchronize_all();
            if (!atomic_load(&passed_on)) {
                xc_log(XC_LOG_INFO, "%s: %d context(s) synchronized and kept; launches resume; passing the "
                       "signal on to the program's handler", name, n);
                pass_on_keeping(sig);
            }
            continue;
        }
        int n = xc_ctx_release_all();
        if (!atomic_load(&passed_on)) {
            xc_log(XC_LOG_INFO, "%s: %d context(s) released; passing the signal on", name, n);
            pass_on();
        }
    }
    return NULL;
}

void xc_exit_watchdog(uint64_t now_ns)
{
    if (atomic_load(&xc_exit_state) != XC_EXIT_RUNNING)
        return;
    uint64_t start = atomic_load(&exit_start_ns);
    if (now_ns < start || now_ns - start < (uint64_t)xc_g.cfg.exit_timeout_ms * 1000000ull)
        return;
    if (!atomic_load(&passed_on)) {
        xc_log(XC_LOG_WARN, "graceful exit did not finish within %u ms; passing the signal on without it",
               xc_g.cfg.exit_timeout_ms);
        pass_on();
    }
}

void xc_signals_arm(void)
{
    sigaction_fn real = real_sigaction();
    if (real == NULL) {
        xc_log(XC_LOG_ERROR, "cannot find sigaction: no graceful exit on SIGINT/SIGTERM");
        return;
    }
    sigset_t saved;
    lock_acts(&saved);
    if (atomic_load(&xc_exit_state) == XC_EXIT_IDLE) {
        static const int sigs[N_MANAGED] = {SIGINT, SIGTERM};
        for (int i = 0; i < N_MANAGED; i++) {
            real(sigs[i], NULL, &prog_act[i]);
            install_for(sigs[i], &prog_act[i]);
        }
        atomic_store(&xc_exit_state, XC_EXIT_ARMED);
    }
    unlock_acts(&saved);
}

void xc_signals_start_worker(void)
{
    if (atomic_load(&worker_alive))
        return;
    if (sem_init(&exit_sem, 0, 0) != 0 || xc_spawn("xcuda-exit", exit_worker) != 0) {
        xc_log(XC_LOG_ERROR, "no graceful-exit thread: SIGINT/SIGTERM go straight to the program");
        return;
    }
    atomic_store(&worker_alive, 1);
}

void xc_signals_atfork_child(void)
{
    atomic_store(&worker_alive, 0);
    atomic_store(&passed_on, 0);
    atomic_flag_clear(&act_lock);
    int st = atomic_load(&xc_exit_state);
    if (st == XC_EXIT_RUNNING || st == XC_EXIT_DONE)
        atomic_store(&xc_exit_state, XC_EXIT_ARMED);
}

/* -- the interposed sigaction() and signal() -------------------------------- */

static int virtual_sigaction(int idx, int sig, const struct sigaction *act, struct sigaction *old)
{
    sigaction_fn real = real_sigaction();
    if (real == NULL) {
        errno = ENOSYS;
        return -1;
    }
    sigset_t saved;
    lock_acts(&saved);
    int rc = 0;
    if (atomic_load(&xc_exit_state) == XC_EXIT_IDLE) {
        rc = real(sig, act, old);
    } else {
        struct sigaction prev = prog_act[idx];
        if (act != NULL) {
            rc = install_for(sig, act);
            if (rc == 0)
                prog_act[idx] = *act;
        }
        if (rc == 0 && old != NULL)
            *old = prev;
    }
    unlock_acts(&saved);
    return rc;
}

int xc_w_sigaction(int sig, const struct sigaction *act, struct sigaction *old);
int xc_w_sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    int idx = managed_index(sig);
    if (idx >= 0)
        return virtual_sigaction(idx, sig, act, old);
    sigaction_fn real = real_sigaction();
    if (real == NULL) {
        errno = ENOSYS;
        return -1;
    }
    return real(sig, act, old);
}
extern __typeof__(xc_w_sigaction) sigaction __attribute__((alias("xc_w_sigaction"), visibility("default")));

sighandler_t xc_w_signal(int sig, sighandler_t handler);
sighandler_t xc_w_signal(int sig, sighandler_t handler)
{
    int idx = managed_index(sig);
    if (idx < 0 || atomic_load(&xc_exit_state) == XC_EXIT_IDLE) {
        signal_fn real = real_signal();
        if (real == NULL) {
            errno = ENOSYS;
            return SIG_ERR;
        }
        return real(sig, handler);
    }
    /* glibc's signal(): BSD semantics, restartable, the signal blocked in its handler. */
    struct sigaction act, old;
    memset(&act, 0, sizeof act);
    act.sa_handler = handler;
    sigemptyset(&act.sa_mask);
    act.sa_flags = SA_RESTART;
    if (virtual_sigaction(idx, sig, &act, &old) != 0)
        return SIG_ERR;
    return old.sa_handler;
}
extern __typeof__(xc_w_signal) signal __attribute__((alias("xc_w_signal"), visibility("default")));
