/* State and functions shared by xCUDA's modules (all hidden). */
#ifndef XCUDA_INTERNAL_H
#define XCUDA_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "config.h"
#include "hooks.h"
#include "log.h"

#define XC_LIKELY(x) __builtin_expect(!!(x), 1)
#define XC_UNLIKELY(x) __builtin_expect(!!(x), 0)

struct xc_state {
    struct xc_config cfg;   /* read-only once `inited` */
    void *libcuda;
    unsigned trusted_uid;   /* whose plan and GPU record count: root (the test build: this user) */
    _Atomic int inited;
};
extern struct xc_state xc_g;

/* init.c */
void xc_ensure_init(void);
void xc_cuda_ready(void);   /* after cuInit or a context creation: arm signals, start threads */
int xc_spawn(const char *name, void *(*fn)(void *));  /* detached, every signal blocked */
uint64_t xc_now_ns(void);

/* dlsym_hook.c */
typedef void *(*xc_dlsym_fn)(void *, const char *);
xc_dlsym_fn xc_real_dlsym(void);

/* memory.c */
void xc_mem_init(void);
void xc_mem_stats(uint64_t *used, uint64_t *peak, uint64_t *quota, uint64_t *refused);

/* pacing.c: the launch gate. `taken` counts tickets handed to launches,
 * `granted` how many of them may run; the controller thread raises
 * `granted` at the paced rate (or far ahead when the gate is open). */
struct xc_pace {
    _Alignas(64) _Atomic uint64_t taken;
    _Alignas(64) _Atomic uint64_t granted;
    _Atomic int frozen;         /* graceful exit in progress */
    _Alignas(64) _Atomic uint64_t in_flight; /* launches past the gate, not yet returned from the driver */
    _Atomic uint64_t rate_milli; /* current paced rate x 1000; 0 = open */
    _Alignas(64) _Atomic uint64_t waits;
    _Atomic uint64_t waited_ns;
};
extern struct xc_pace xc_pace;

CUresult xc_gate_wait(uint64_t ticket);
CUresult xc_gate_frozen(void);
void xc_pacing_start(void);
void xc_pacing_atfork_child(void);

/* The hot path: one relaxed load, one fetch_add, one load. No syscall, no lock. */
static inline CUresult xc_gate(uint64_t cost)
{
    if (XC_UNLIKELY(atomic_load_explicit(&xc_pace.frozen, memory_order_relaxed))) {
        CUresult r = xc_gate_frozen();
        if (r != CUDA_SUCCESS)
            return r;
    }
    uint64_t ticket = atomic_fetch_add_explicit(&xc_pace.taken, cost, memory_order_relaxed) + cost;
    if (XC_LIKELY(ticket <= atomic_load_explicit(&xc_pace.granted, memory_order_relaxed)))
        return CUDA_SUCCESS;
    return xc_gate_wait(ticket);
}

/* Brackets the driver call of a launch that passed the gate. The graceful exit
 * sets `frozen`, then waits for `in_flight` to drain before it synchronises:
 * with both sides sequentially consistent, either the launch sees `frozen` here
 * or the exit sees it in flight and waits (no launch reaches a released context). */
static inline int xc_launch_enter(void)
{
    atomic_fetch_add_explicit(&xc_pace.in_flight, 1, memory_order_seq_cst);
    if (XC_UNLIKELY(atomic_load_explicit(&xc_pace.frozen, memory_order_seq_cst))) {
        atomic_fetch_sub_explicit(&xc_pace.in_flight, 1, memory_order_release);
        return 0;
    }
    return 1;
}

static inline void xc_launch_leave(void)
{
    atomic_fetch_sub_explicit(&xc_pace.in_flight, 1, memory_order_release);
}

/* signals.c */
enum xc_exit_state { XC_EXIT_IDLE, XC_EXIT_ARMED, XC_EXIT_RUNNING, XC_EXIT_DONE };
extern _Atomic int xc_exit_state;
void xc_signals_arm(void);
void xc_signals_start_worker(void);
void xc_exit_watchdog(uint64_t now_ns);
void xc_signals_atfork_child(void);

/* context.c */
void xc_ctx_track(CUcontext ctx);
void xc_ctx_untrack(CUcontext ctx);
int xc_ctx_release_all(void);
int xc_ctx_synchronize_all(void);

#endif
