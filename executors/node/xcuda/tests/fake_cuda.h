/* Test-only API of the fake CUDA driver (build/fake/libcuda.so.1). */
#ifndef XCUDA_FAKE_CUDA_H
#define XCUDA_FAKE_CUDA_H

/* Calls of an entry point, all of them or those made from inside libxcuda.so
 * (the latter counted when XCUDA_FAKE_TRACE_CALLERS=1). */
unsigned long long xcfake_calls(const char *name);
unsigned long long xcfake_calls_via_xcuda(const char *name);
/* The next call of `name` returns `result` without doing anything. */
void xcfake_fail_next(const char *name, int result);
unsigned long long xcfake_mem_used(void);
unsigned long long xcfake_launches_after_release(void);
/* Returns 2; the probe library defines the same symbol returning 1. */
int xcfake_probe(void);

#endif
