/*
 * cuGetProcAddress interposition: modern CUDA runtimes (and PyTorch through
 * them) obtain every driver entry point from cuGetProcAddress, so dlsym alone
 * would miss them. The driver is asked first, so versions, per-thread stream
 * variants and errors stay the driver's; a pointer to a hooked entry point is
 * then swapped for xCUDA's wrapper, including cuGetProcAddress itself.
 */
#include "xcuda.h"

static void *map(const char *symbol, void *fn, int version, cuuint64_t flags)
{
    int id = xc_hook_by_real(fn);
    if (id >= 0)
        return xc_hooks[id].kind == XC_KIND_REAL ? fn : xc_hooks[id].wrapper;
    /* A pointer dlsym did not give us: pick the entry by name and version. */
    id = xc_hook_by_proc(symbol, version, flags);
    if (id < 0 || xc_hooks[id].kind == XC_KIND_REAL)
        return fn;
    void *expected = NULL;
    atomic_compare_exchange_strong(&xc_real[id], &expected, fn);
    return xc_hooks[id].wrapper;
}

CUresult xc_w_cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    CUresult r = xc_real_cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && symbol != NULL && pfn != NULL && *pfn != NULL)
        *pfn = map(symbol, *pfn, cudaVersion, flags);
    return r;
}
XC_EXPORT(cuGetProcAddress)

CUresult xc_w_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult *symbolStatus)
{
    CUresult r = xc_real_cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && symbol != NULL && pfn != NULL && *pfn != NULL)
        *pfn = map(symbol, *pfn, cudaVersion, flags);
    return r;
}
XC_EXPORT(cuGetProcAddress_v2)
