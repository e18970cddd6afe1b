/*
 * Tables generated from hooks.def: ids, function-pointer types, the wrappers'
 * prototypes, the real-function table and one inline caller per entry point.
 */
#ifndef XCUDA_HOOKS_H
#define XCUDA_HOOKS_H

#include <stdatomic.h>
#include <stdint.h>

#include "cuda_types.h"

enum xc_hook_id {
#define XCUDA_HOOK(name, proc, ver, ptds, params, args) XC_ID_##name,
#define XCUDA_LAUNCH(name, proc, ver, ptds, cost, params, args) XC_ID_##name,
#define XCUDA_REAL(name, proc, ver, ptds, params, args) XC_ID_##name,
#include "hooks.def"
#undef XCUDA_HOOK
#undef XCUDA_LAUNCH
#undef XCUDA_REAL
    XC_HOOK_COUNT
};

enum xc_hook_kind { XC_KIND_HOOK, XC_KIND_LAUNCH, XC_KIND_REAL };

struct xc_hook_info {
    const char *name;  /* exported symbol */
    const char *proc;  /* cuGetProcAddress name */
    int version;
    int ptds;
    enum xc_hook_kind kind;
    void *wrapper;     /* NULL for XC_KIND_REAL */
};

extern const struct xc_hook_info xc_hooks[XC_HOOK_COUNT];
extern _Atomic(void *) xc_real[XC_HOOK_COUNT];

#define XCUDA_HOOK(name, proc, ver, ptds, params, args) \
    typedef CUresult (*xc_pfn_##name) params; CUresult xc_w_##name params;
#define XCUDA_LAUNCH(name, proc, ver, ptds, cost, params, args) \
    typedef CUresult (*xc_pfn_##name) params; CUresult xc_w_##name params;
#define XCUDA_REAL(name, proc, ver, ptds, params, args) typedef CUresult (*xc_pfn_##name) params;
#include "hooks.def"
#undef XCUDA_HOOK
#undef XCUDA_LAUNCH
#undef XCUDA_REAL

/* Resolves the driver on first use; NULL while that is impossible. */
void *xc_real_slow(int id);
/* Logs once that the driver lacks `id`; returns CUDA_ERROR_NOT_FOUND. */
CUresult xc_real_missing(int id);

static inline void *xc_real_ptr(int id)
{
    void *p = atomic_load_explicit(&xc_real[id], memory_order_acquire);
    if (__builtin_expect(p == NULL, 0))
        p = xc_real_slow(id);
    return p;
}

/* xc_real_<name>(args...): call the driver's own entry point. */
#define XCUDA_HOOK(name, proc, ver, ptds, params, args)                     \
    static inline CUresult xc_real_##name params                            \
    {                                                                       \
        xc_pfn_##name fn_ = (xc_pfn_##name)xc_real_ptr(XC_ID_##name);       \
        if (__builtin_expect(fn_ == NULL, 0))                               \
            return xc_real_missing(XC_ID_##name);                           \
        return fn_ args;                                                    \
    }
#define XCUDA_LAUNCH(name, proc, ver, ptds, cost, params, args) XCUDA_HOOK(name, proc, ver, ptds, params, args)
#define XCUDA_REAL(name, proc, ver, ptds, params, args) XCUDA_HOOK(name, proc, ver, ptds, params, args)
#include "hooks.def"
#undef XCUDA_HOOK
#undef XCUDA_LAUNCH
#undef XCUDA_REAL

/* Exports `name` as an alias of its hidden wrapper xc_w_<name>. Taking the
 * wrapper's address through the hidden name keeps the tables pointing at
 * xCUDA even where the driver was loaded first and would win the lookup. */
#define XC_EXPORT(name) \
    extern __typeof__(xc_w_##name) name __attribute__((alias("xc_w_" #name), visibility("default")));

/* Lookups used by dlsym and cuGetProcAddress (not hot paths). */
int xc_hook_by_export(const char *name);  /* interposed entries only; -1 if none */
int xc_hook_by_real(const void *fn);      /* any entry whose real pointer is fn */
int xc_hook_by_proc(const char *proc, int version, cuuint64_t flags);

#endif
