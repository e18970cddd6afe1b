/*
 * Reaches the (versioned fake) driver only through dlvsym, as a program that
 * avoids dlsym and cuGetProcAddress would: "dlvsym <name> <version>" prints
 * where the pointer lies, "next <name> <version>" the same from RTLD_NEXT, "alloc <bytes>" allocates with the cuMemAlloc_v2 it
 * got, "launch <n>" times n launches of its cuLaunchKernel.
 */
#include <dlfcn.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/cuda_api.h"

static void *lib;

static void *get(const char *name, const char *version)
{
    return dlvsym(lib, name, version);
}

static const char *where(const void *fn)
{
    static char buf[256];
    Dl_info info;
    if (fn == NULL)
        return "none";
    if (!dladdr(fn, &info) || info.dli_fname == NULL)
        return "unknown";
    snprintf(buf, sizeof buf, "%s", info.dli_fname);
    const char *base = basename(buf);
    return strstr(base, "libxcuda") != NULL ? "xcuda" : (strstr(base, "libcuda") != NULL ? "fake" : base);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "dlvsym_probe: %s\n", dlerror());
        return 2;
    }
    const char *ver = "libcuda.so.1";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "dlvsym") && i + 2 < argc) {
            const char *name = argv[++i], *v = argv[++i];
            printf("dlvsym %s obj=%s\n", name, where(get(name, v)));
        } else if (!strcmp(argv[i], "next") && i + 2 < argc) {
            const char *name = argv[++i], *v = argv[++i];
            printf("next %s obj=%s\n", name, where(dlvsym(RTLD_NEXT, name, v)));
        } else if (!strcmp(argv[i], "alloc") && i + 1 < argc) {
            pfn_cuInit init = (pfn_cuInit)get("cuInit", ver);
            pfn_cuMemAlloc_v2 alloc = (pfn_cuMemAlloc_v2)get("cuMemAlloc_v2", ver);
            if (init == NULL || alloc == NULL)
                return 3;
            init(0);
            CUdeviceptr p = 0;
            CUresult r = alloc(&p, strtoull(argv[++i], NULL, 0));
            printf("alloc rc=%d obj=%s\n", (int)r, where((void *)alloc));
        } else if (!strcmp(argv[i], "launch") && i + 1 < argc) {
            pfn_cuLaunchKernel launch = (pfn_cuLaunchKernel)get("cuLaunchKernel", ver);
            if (launch == NULL)
                return 3;
            unsigned long long n = strtoull(argv[++i], NULL, 0);
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            for (unsigned long long k = 0; k < n; k++)
                launch(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            printf("launched n=%llu seconds=%.6f obj=%s\n", n,
                   (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9, where((void *)launch));
        } else {
            fprintf(stderr, "dlvsym_probe: bad command %s\n", argv[i]);
            return 2;
        }
    }
    return 0;
}
