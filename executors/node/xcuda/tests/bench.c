/*
 * Per-call latency of cuLaunchKernel and cuMemAlloc as a CUDA runtime makes
 * them (pointers from cuGetProcAddress), on the fake driver. Run once plain
 * and once under LD_PRELOAD=libxcuda.so; the difference is xCUDA's overhead.
 * Each call is timed on its own with the TSC (fenced), calibrated against
 * CLOCK_MONOTONIC; the timer's own cost is reported and is in both runs.
 *
 *   xcuda_bench [CALLS]      prints one JSON object
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/cuda_api.h"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
static inline uint64_t ticks(void)
{
    _mm_lfence();
    uint64_t t = __rdtsc();
    _mm_lfence();
    return t;
}
#else
static inline uint64_t ticks(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
#endif

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double ns_per_tick(void)
{
    uint64_t n0 = mono_ns(), t0 = ticks();
    while (mono_ns() - n0 < 100000000ull)
        ;
    uint64_t n1 = mono_ns(), t1 = ticks();
    return (double)(n1 - n0) / (double)(t1 - t0);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *name, uint32_t *t, size_t n, double scale, double batch_ns, int last)
{
    qsort(t, n, sizeof *t, cmp_u32);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += t[i];
    printf("  \"%s\": {\"median_ns\": %.2f, \"p99_ns\": %.2f, \"p999_ns\": %.2f, \"mean_ns\": %.2f, "
           "\"batch_mean_ns\": %.2f}%s\n",
           name, t[n / 2] * scale, t[(size_t)(n * 0.99)] * scale, t[(size_t)(n * 0.999)] * scale,
           sum / (double)n * scale, batch_ns, last ? "" : ",");
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000000;
    if (n < 1000)
        n = 1000;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    pfn_cuGetProcAddress_v2 gpa = h ? (pfn_cuGetProcAddress_v2)dlsym(h, "cuGetProcAddress_v2") : NULL;
    if (gpa == NULL) {
        fprintf(stderr, "xcuda_bench: no driver\n");
        return 2;
    }
    void *launch_p = NULL, *alloc_p = NULL, *free_p = NULL, *init_p = NULL;
    CUdriverProcAddressQueryResult st;
    gpa("cuInit", &init_p, 12000, 0, &st);
    gpa("cuLaunchKernel", &launch_p, 12000, 0, &st);
    gpa("cuMemAlloc", &alloc_p, 12000, 0, &st);
    gpa("cuMemFree", &free_p, 12000, 0, &st);
    if (!init_p || !launch_p || !alloc_p || !free_p) {
        fprintf(stderr, "xcuda_bench: entry points missing\n");
        return 2;
    }
    pfn_cuLaunchKernel launch = (pfn_cuLaunchKernel)launch_p;
    pfn_cuMemAlloc_v2 alloc = (pfn_cuMemAlloc_v2)alloc_p;
    pfn_cuMemFree_v2 mfree = (pfn_cuMemFree_v2)free_p;
    CUcontext ctx;
    ((pfn_cuInit)init_p)(0);
    cuDevicePrimaryCtxRetain(&ctx, 0);
    cuCtxSetCurrent(ctx);

    Dl_info info;
    int preloaded = dladdr(launch_p, &info) && info.dli_fname && strstr(info.dli_fname, "libxcuda") != NULL;
    double scale = ns_per_tick();
    uint32_t *t = malloc(n * sizeof *t);
    if (t == NULL)
        return 2;

    /* Warm up: the pacing controller's first period opens the gate. */
    uint64_t w0 = mono_ns();
    while (mono_ns() - w0 < 300000000ull)
        for (int i = 0; i < 1000; i++)
            launch(NULL, 1, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);

    for (size_t i = 0; i < n; i++) {
        uint64_t a = ticks(), b = ticks();
        t[i] = (uint32_t)(b - a);
    }
    printf("{\n  \"preloaded\": %s,\n  \"calls\": %zu,\n  \"ns_per_tick\": %.6f,\n", preloaded ? "true" : "false", n,
           scale);
    report("timer", t, n, scale, 0.0, 0);

    uint64_t b0 = ticks();
    for (size_t i = 0; i < n; i++)
        launch(NULL, 1, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
    double launch_batch = (double)(ticks() - b0) * scale / (double)n;
    for (size_t i = 0; i < n; i++) {
        uint64_t a = ticks();
        launch(NULL, 1, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
        t[i] = (uint32_t)(ticks() - a);
    }
    report("launch", t, n, scale, launch_batch, 0);

    CUdeviceptr p;
    for (size_t i = 0; i < n; i++) {
        uint64_t a = ticks();
        alloc(&p, 256);
        t[i] = (uint32_t)(ticks() - a);
        mfree(p);
    }
    report("alloc", t, n, scale, 0.0, 1);
    printf("}\n");
    free(t);
    return 0;
}
