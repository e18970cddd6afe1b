/* Tables generated from hooks.def, and the look-ups over them. */
#include <string.h>

#include "xcuda.h"

const struct xc_hook_info xc_hooks[XC_HOOK_COUNT] = {
#define XCUDA_HOOK(name, proc, ver, ptds, params, args) \
    [XC_ID_##name] = {#name, proc, ver, ptds, XC_KIND_HOOK, (void *)xc_w_##name},
#define XCUDA_LAUNCH(name, proc, ver, ptds, cost, params, args) \
    [XC_ID_##name] = {#name, proc, ver, ptds, XC_KIND_LAUNCH, (void *)xc_w_##name},
#define XCUDA_REAL(name, proc, ver, ptds, params, args) \
    [XC_ID_##name] = {#name, proc, ver, ptds, XC_KIND_REAL, NULL},
#include "hooks.def"
#undef XCUDA_HOOK
#undef XCUDA_LAUNCH
#undef XCUDA_REAL
};

_Atomic(void *) xc_real[XC_HOOK_COUNT];

int xc_hook_by_export(const char *name)
{
    for (int i = 0; i < XC_HOOK_COUNT; i++)
        if (xc_hooks[i].kind != XC_KIND_REAL && !strcmp(xc_hooks[i].name, name))
            return i;
    return -1;
}

int xc_hook_by_real(const void *fn)
{
    if (fn == NULL)
        return -1;
    for (int i = 0; i < XC_HOOK_COUNT; i++)
        if (atomic_load_explicit(&xc_real[i], memory_order_acquire) == fn)
            return i;
    return -1;
}

static int best_by_proc(const char *proc, int version, int ptds)
{
    int best = -1;
    for (int i = 0; i < XC_HOOK_COUNT; i++) {
        const struct xc_hook_info *h = &xc_hooks[i];
        if (h->ptds != ptds || h->version > version || strcmp(h->proc, proc) != 0)
            continue;
        if (best < 0 || h->version > xc_hooks[best].version)
            best = i;
    }
    return best;
}

int xc_hook_by_proc(const char *proc, int version, cuuint64_t flags)
{
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        int id = best_by_proc(proc, version, 1);
        if (id >= 0)
            return id;
    }
    return best_by_proc(proc, version, 0);
}
