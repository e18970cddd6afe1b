/*
 * Kernel launches (paper §4.1, compute pacing): one wrapper per launch entry
 * point of hooks.def, each passing the pacing gate before the driver.
 */
#include "xcuda.h"

#define XCUDA_HOOK(name, proc, ver, ptds, params, args)
#define XCUDA_REAL(name, proc, ver, ptds, params, args)
#define XCUDA_LAUNCH(name, proc, ver, ptds, cost, params, args)       \
    CUresult xc_w_##name params                                       \
    {                                                                 \
        CUresult gate_ = xc_gate((uint64_t)(cost));                   \
        if (XC_UNLIKELY(gate_ != CUDA_SUCCESS))                       \
            return gate_;                                             \
        while (XC_UNLIKELY(!xc_launch_enter())) {                     \
            CUresult held_ = xc_gate_frozen();                        \
            if (held_ != CUDA_SUCCESS)                                \
                return held_;                                         \
        }                                                             \
        CUresult rc_ = xc_real_##name args;                           \
        xc_launch_leave();                                            \
        return rc_;                                                   \
    }                                                                 \
    XC_EXPORT(name)
#include "hooks.def"
#undef XCUDA_HOOK
#undef XCUDA_LAUNCH
#undef XCUDA_REAL
