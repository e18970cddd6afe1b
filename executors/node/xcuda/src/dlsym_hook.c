/*
 * dlsym interposition. The CUDA runtime dlopens libcuda.so.1 and asks dlsym
 * for cuGetProcAddress (then everything else through it); other callers
 * (Triton, cupy, ...) dlsym driver functions directly. Hooked names get
 * xCUDA's wrapper; all other look-ups go to glibc's dlsym as a tail call, so
 * glibc still sees the program as the caller and RTLD_NEXT keeps its meaning.
 * This file is therefore built with sibling-call optimisation on.
 */
#include <dlfcn.h>
#include <stddef.h>

#include "xcuda.h"

static _Atomic(xc_dlsym_fn) real_dlsym_p;

xc_dlsym_fn xc_real_dlsym(void)
{
    xc_dlsym_fn p = atomic_load_explicit(&real_dlsym_p, memory_order_acquire);
    if (XC_LIKELY(p != NULL))
        return p;
    /* dlvsym is not interposed, so it reaches glibc's own dlsym. */
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    for (size_t i = 0; p == NULL && i < sizeof versions / sizeof versions[0]; i++)
        p = (xc_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (p != NULL)
        atomic_store_explicit(&real_dlsym_p, p, memory_order_release);
    return p;
}

__attribute__((noinline))
static void *hooked(void *handle, const char *symbol, int id)
{
    /* The global scope holds xCUDA's export itself: that is the answer. */
    if (handle == RTLD_DEFAULT || handle == RTLD_NEXT)
        return xc_hooks[id].wrapper;
    xc_dlsym_fn real = xc_real_dlsym();
    void *p = real != NULL ? real(handle, symbol) : NULL;
    return p != NULL ? xc_hooks[id].wrapper : NULL;  /* keep "not in that library" */
}

void *xc_w_dlsym(void *handle, const char *symbol);
void *xc_w_dlsym(void *handle, const char *symbol)
{
    if (symbol != NULL && symbol[0] == 'c' && symbol[1] == 'u') {
        int id = xc_hook_by_export(symbol);
        if (id >= 0)
            return hooked(handle, symbol, id);
    }
    xc_dlsym_fn real = xc_real_dlsym();
    if (XC_UNLIKELY(real == NULL))
        return NULL;
    return real(handle, symbol);  /* tail call: see the comment at the top */
}

extern __typeof__(xc_w_dlsym) dlsym __attribute__((alias("xc_w_dlsym"), visibility("default")));
