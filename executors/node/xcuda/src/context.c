/*
 * cuInit and contexts: the first marks the process as a CUDA user (signals
 * armed, threads started); contexts the program creates are remembered so
 * that a graceful exit (paper §4.2) can synchronise them, and destroy them
 * when the signal is to end the process. Primary contexts, which the runtime
 * uses, are found from the driver then.
 */
#include <pthread.h>

#include "xcuda.h"

#define MAX_CONTEXTS 64

static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext created[MAX_CONTEXTS];
static int n_created;
static _Atomic int warned_many;

void xc_ctx_track(CUcontext ctx)
{
    pthread_mutex_lock(&ctx_lock);
    if (n_created < MAX_CONTEXTS)
        created[n_created++] = ctx;
    else
        XC_LOG_ONCE(warned_many, XC_LOG_WARN, "more than %d contexts: a graceful exit releases the first %d only",
                    MAX_CONTEXTS, MAX_CONTEXTS);
    pthread_mutex_unlock(&ctx_lock);
}

void xc_ctx_untrack(CUcontext ctx)
{
    pthread_mutex_lock(&ctx_lock);
    for (int i = 0; i < n_created; i++) {
        if (created[i] == ctx) {
            created[i] = created[--n_created];
            break;
        }
    }
    pthread_mutex_unlock(&ctx_lock);
}

/* Synchronises every context the process has (the ones it created, the active
 * primary ones) and, with `release`, destroys the created ones and resets the
 * primary ones; without, leaves them as they were (a primary context is
 * retained for the call and released after, so its reference count ends as it
 * was). The number released (or synchronized). */
static int each_context(int release)
{
    CUcontext mine[MAX_CONTEXTS];
    int n, done = 0;
    pthread_mutex_lock(&ctx_lock);
    n = n_created;
    for (int i = 0; i < n; i++)
        mine[i] = created[i];
    if (release)
        n_created = 0;
    pthread_mutex_unlock(&ctx_lock);

    for (int i = 0; i < n; i++) {
        CUresult rs = xc_real_cuCtxSetCurrent(mine[i]);
        if (rs == CUDA_SUCCESS)
            rs = xc_real_cuCtxSynchronize();
        CUresult rd = release ? xc_real_cuCtxDestroy_v2(mine[i]) : rs;
        xc_log(XC_LOG_DEBUG, "context %p: synchronize %d, %s %d", (void *)mine[i], (int)rs,
               release ? "destroy" : "kept", (int)rd);
        done += rd == CUDA_SUCCESS;
    }
    int devices = 0;
    if (xc_real_cuDeviceGetCount(&devices) != CUDA_SUCCESS)
        devices = 0;
    for (CUdevice d = 0; d < devices; d++) {
        unsigned int flags = 0;
        int active = 0;
        CUcontext primary = NULL;
        if (xc_real_cuDevicePrimaryCtxGetState(d, &flags, &active) != CUDA_SUCCESS || !active)
            continue;
        if (xc_real_cuDevicePrimaryCtxRetain(&primary, d) != CUDA_SUCCESS)
            continue;
        CUresult rs = xc_real_cuCtxSetCurrent(primary);
        if (rs == CUDA_SUCCESS)
            rs = xc_real_cuCtxSynchronize();
        /* To release, a reset: it destroys the context whatever its reference count. */
        CUresult rr = release ? xc_real_cuDevicePrimaryCtxReset_v2(d) : xc_real_cuDevicePrimaryCtxRelease_v2(d);
        xc_log(XC_LOG_DEBUG, "device %d primary context: synchronize %d, %s %d", d, (int)rs,
               release ? "reset" : "release", (int)rr);
        done += (release ? rr : rs) == CUDA_SUCCESS;
    }
    return done;
}

int xc_ctx_release_all(void)
{
    return each_context(1);
}

/* Waits for the work of every context and leaves them as they are: a program
 * that handles SIGINT/SIGTERM itself (a checkpoint) goes on using them. */
int xc_ctx_synchronize_all(void)
{
    return each_context(0);
}

CUresult xc_w_cuInit(unsigned int Flags)
{
    CUresult r = xc_real_cuInit(Flags);
    if (r == CUDA_SUCCESS)
        xc_cuda_ready();
    return r;
}
XC_EXPORT(cuInit)

#define CREATED(call, pctx)                              \
    do {                                                 \
        xc_cuda_ready();                                 \
        CUresult r_ = call;                              \
        if (r_ == CUDA_SUCCESS && (pctx) != NULL)        \
            xc_ctx_track(*(pctx));                       \
        return r_;                                       \
    } while (0)

CUresult xc_w_cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CREATED(xc_real_cuCtxCreate_v2(pctx, flags, dev), pctx);
}
XC_EXPORT(cuCtxCreate_v2)

CUresult xc_w_cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
                             CUdevice dev)
{
    CREATED(xc_real_cuCtxCreate_v3(pctx, paramsArray, numParams, flags, dev), pctx);
}
XC_EXPORT(cuCtxCreate_v3)

CUresult xc_w_cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                             CUdevice dev)
{
    CREATED(xc_real_cuCtxCreate_v4(pctx, ctxCreateParams, flags, dev), pctx);
}
XC_EXPORT(cuCtxCreate_v4)

CUresult xc_w_cuCtxDestroy_v2(CUcontext ctx)
{
    xc_ctx_untrack(ctx);
    return xc_real_cuCtxDestroy_v2(ctx);
}
XC_EXPORT(cuCtxDestroy_v2)
