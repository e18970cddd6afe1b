#ifndef XCUDA_HARNESS_H
#define XCUDA_HARNESS_H

#include <stdint.h>

#include "../src/cuda_api.h"
#include "test_ids.h"

typedef void (*harness_caller)(void *fn);
extern const harness_caller harness_callers[TID_COUNT];
extern void *const harness_direct[TID_COUNT];

#endif
