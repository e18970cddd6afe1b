/*
 * Plain CUDA driver prototypes and pointer types for every entry point in
 * hooks.def, for the test driver and harness (xCUDA itself uses hooks.h).
 */
#ifndef XCUDA_CUDA_API_H
#define XCUDA_CUDA_API_H

#include "cuda_types.h"

#ifndef XCUDA_API
#define XCUDA_API
#endif

#define XCUDA_HOOK(name, proc, ver, ptds, params, args) \
    typedef CUresult (*pfn_##name) params; XCUDA_API CUresult name params;
#define XCUDA_LAUNCH(name, proc, ver, ptds, cost, params, args) XCUDA_HOOK(name, proc, ver, ptds, params, args)
#define XCUDA_REAL(name, proc, ver, ptds, params, args) XCUDA_HOOK(name, proc, ver, ptds, params, args)
#include "hooks.def"
#undef XCUDA_HOOK
#undef XCUDA_LAUNCH
#undef XCUDA_REAL

#endif
