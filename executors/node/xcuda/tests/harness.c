/*
 * Test harness: reaches the CUDA driver the way programs do, under
 * LD_PRELOAD=libxcuda.so or not. Linked against the (fake) libcuda like a
 * direct caller, and also dlopens it and uses cuGetProcAddress like the CUDA
 * runtime. Runs the commands on its command line in order and prints one
 * line per result for the pytest tests to check.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <sys/wait.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "harness.h"

enum path { P_DIRECT, P_DLSYM, P_GPA, P_COUNT };
static const char *const path_names[P_COUNT] = {"direct", "dlsym", "gpa"};

static void *libcuda;
static pfn_cuGetProcAddress_v2 gpa;  /* as the runtime has it: cuGetProcAddress asked for itself */

static void die(const char *what)
{
    fprintf(stderr, "harness: %s\n", what);
    exit(2);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void runtime_setup(void)
{
    if (gpa != NULL)
        return;
    libcuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (libcuda == NULL)
        die(dlerror());
    pfn_cuGetProcAddress_v2 first = (pfn_cuGetProcAddress_v2)dlsym(libcuda, "cuGetProcAddress_v2");
    if (first == NULL)
        die("no cuGetProcAddress_v2");
    void *self = NULL;
    CUdriverProcAddressQueryResult st;
    if (first("cuGetProcAddress", &self, 12000, 0, &st) != CUDA_SUCCESS || self == NULL)
        die("cuGetProcAddress(\"cuGetProcAddress\") failed");
    gpa = (pfn_cuGetProcAddress_v2)self;
}

static void *resolve(int id, enum path p)
{
    const struct xc_test_entry *e = &xc_test_entries[id];
    runtime_setup();
    if (p == P_DIRECT)
        return harness_direct[id];
    if (p == P_DLSYM)
        return dlsym(libcuda, e->name);
    void *fn = NULL;
    CUdriverProcAddressQueryResult st;
    if (gpa(e->proc, &fn, e->version, e->ptds ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, &st) != CUDA_SUCCESS)
        return NULL;
    return fn;
}

static const char *object_of(const void *fn, const char **sym)
{
    static char buf[256];
    Dl_info info;
    *sym = "?";
    if (fn == NULL)
        return "none";
    if (!dladdr(fn, &info) || info.dli_fname == NULL)
        return "unknown";
    if (info.dli_sname != NULL)
        *sym = info.dli_sname;
    snprintf(buf, sizeof buf, "%s", info.dli_fname);
    const char *base = basename(buf);
    if (strstr(base, "libxcuda") != NULL)
        return "xcuda";
    if (!strcmp(base, "libcuda.so.1") || !strcmp(base, "libcuda.so"))
        return "fake";
    return base;
}

static int find_entry(const char *name)
{
    for (int i = 0; i < TID_COUNT; i++)
        if (!strcmp(xc_test_entries[i].name, name))
            return i;
    die("unknown entry point");
    return -1;
}

static enum path parse_path(const char *s)
{
    for (int p = 0; p < P_COUNT; p++)
        if (!strcmp(s, path_names[p]))
            return (enum path)p;
    die("path must be direct, dlsym or gpa");
    return P_DIRECT;
}

static int is_path(const char *s)
{
    for (int p = 0; p < P_COUNT; p++)
        if (!strcmp(s, path_names[p]))
            return 1;
    return 0;
}

static unsigned long long parse_u64(const char *s)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end)
        die("bad number");
    return v;
}

/* -- memory ------------------------------------------------------------------ */

struct alloc_kind {
    const char *name;
    int alloc_id, free_id;
};

static const struct alloc_kind kinds[] = {
    {"v1", TID_cuMemAlloc, TID_cuMemFree},
    {"v2", TID_cuMemAlloc_v2, TID_cuMemFree_v2},
    {"pitch_v1", TID_cuMemAllocPitch, TID_cuMemFree},
    {"pitch", TID_cuMemAllocPitch_v2, TID_cuMemFree_v2},
    {"managed", TID_cuMemAllocManaged, TID_cuMemFree_v2},
    {"async", TID_cuMemAllocAsync, TID_cuMemFreeAsync},
    {"async_ptsz", TID_cuMemAllocAsync_ptsz, TID_cuMemFreeAsync_ptsz},
    {"pool", TID_cuMemAllocFromPoolAsync, TID_cuMemFreeAsync},
    {"pool_ptsz", TID_cuMemAllocFromPoolAsync_ptsz, TID_cuMemFreeAsync_ptsz},
    {"create", TID_cuMemCreate, TID_cuMemRelease},
    {"array_v1", TID_cuArrayCreate, TID_cuArrayDestroy},
    {"array", TID_cuArrayCreate_v2, TID_cuArrayDestroy},
    {"array3d_v1", TID_cuArray3DCreate, TID_cuArrayDestroy},
    {"array3d", TID_cuArray3DCreate_v2, TID_cuArrayDestroy},
    {"mipmap", TID_cuMipmappedArrayCreate, TID_cuMipmappedArrayDestroy},
};
#define N_KINDS (int)(sizeof kinds / sizeof kinds[0])
#define MAX_SLOTS 4096

static struct {
    int kind;
    uint64_t value;
    enum path path;
} slots[MAX_SLOTS];
static int n_slots;

/* Allocates `bytes` with the kind's entry point; pitched and array kinds get
 * a shape of that many bytes (pitched: 8 rows; arrays: 1-channel float). */
static CUresult do_alloc(int k, uint64_t bytes, enum path p, uint64_t *value)
{
    void *fn = resolve(kinds[k].alloc_id, p);
    if (fn == NULL)
        die("entry point not found");
    switch (kinds[k].alloc_id) {
    case TID_cuMemAlloc: {
        CUdeviceptr_v1 v = 0;
        CUresult r = ((pfn_cuMemAlloc)fn)(&v, (unsigned)bytes);
        *value = v;
        return r;
    }
    case TID_cuMemAlloc_v2: {
        CUdeviceptr v = 0;
        CUresult r = ((pfn_cuMemAlloc_v2)fn)(&v, bytes);
        *value = v;
        return r;
    }
    case TID_cuMemAllocPitch: {
        CUdeviceptr_v1 v = 0;
        unsigned int pitch = 0;
        CUresult r = ((pfn_cuMemAllocPitch)fn)(&v, &pitch, (unsigned)(bytes / 8), 8, 4);
        *value = v;
        return r;
    }
    case TID_cuMemAllocPitch_v2: {
        CUdeviceptr v = 0;
        size_t pitch = 0;
        CUresult r = ((pfn_cuMemAllocPitch_v2)fn)(&v, &pitch, bytes / 8, 8, 4);
        *value = v;
        return r;
    }
    case TID_cuMemAllocManaged: {
        CUdeviceptr v = 0;
        CUresult r = ((pfn_cuMemAllocManaged)fn)(&v, bytes, 1);
        *value = v;
        return r;
    }
    case TID_cuMemAllocAsync:
    case TID_cuMemAllocAsync_ptsz: {
        CUdeviceptr v = 0;
        CUresult r = ((pfn_cuMemAllocAsync)fn)(&v, bytes, NULL);
        *value = v;
        return r;
    }
    case TID_cuMemAllocFromPoolAsync:
    case TID_cuMemAllocFromPoolAsync_ptsz: {
        CUdeviceptr v = 0;
        CUresult r = ((pfn_cuMemAllocFromPoolAsync)fn)(&v, bytes, NULL, NULL);
        *value = v;
        return r;
    }
    case TID_cuMemCreate: {
        CUmemGenericAllocationHandle h = 0;
        CUresult r = ((pfn_cuMemCreate)fn)(&h, bytes, NULL, 0);
        *value = h;
        return r;
    }
    case TID_cuArrayCreate: {
        CUDA_ARRAY_DESCRIPTOR_v1 d = {(unsigned)(bytes / 4), 1, CU_AD_FORMAT_FLOAT, 1};
        CUarray a = NULL;
        CUresult r = ((pfn_cuArrayCreate)fn)(&a, &d);
        *value = (uint64_t)(uintptr_t)a;
        return r;
    }
    case TID_cuArrayCreate_v2: {
        CUDA_ARRAY_DESCRIPTOR d = {bytes / 4, 1, CU_AD_FORMAT_FLOAT, 1};
        CUarray a = NULL;
        CUresult r = ((pfn_cuArrayCreate_v2)fn)(&a, &d);
        *value = (uint64_t)(uintptr_t)a;
        return r;
    }
    case TID_cuArray3DCreate: {
        CUDA_ARRAY3D_DESCRIPTOR_v1 d = {(unsigned)(bytes / 4), 1, 1, CU_AD_FORMAT_FLOAT, 1, 0};
        CUarray a = NULL;
        CUresult r = ((pfn_cuArray3DCreate)fn)(&a, &d);
        *value = (uint64_t)(uintptr_t)a;
        return r;
    }
    case TID_cuArray3DCreate_v2: {
        CUDA_ARRAY3D_DESCRIPTOR d = {bytes / 4, 1, 1, CU_AD_FORMAT_FLOAT, 1, 0};
        CUarray a = NULL;
        CUresult r = ((pfn_cuArray3DCreate_v2)fn)(&a, &d);
        *value = (uint64_t)(uintptr_t)a;
        return r;
    }
    case TID_cuMipmappedArrayCreate: {
        CUDA_ARRAY3D_DESCRIPTOR d = {bytes / 4, 0, 0, CU_AD_FORMAT_FLOAT, 1, 0};
        CUmipmappedArray a = NULL;
        CUresult r = ((pfn_cuMipmappedArrayCreate)fn)(&a, &d, 1);
        *value = (uint64_t)(uintptr_t)a;
        return r;
    }
    }
    die("unhandled kind");
    return CUDA_ERROR_UNKNOWN;
}

static CUresult do_free(int k, uint64_t value, enum path p)
{
    void *fn = resolve(kinds[k].free_id, p);
    switch (kinds[k].free_id) {
    case TID_cuMemFree:
        return ((pfn_cuMemFree)fn)((CUdeviceptr_v1)value);
    case TID_cuMemFree_v2:
        return ((pfn_cuMemFree_v2)fn)(value);
    case TID_cuMemFreeAsync:
    case TID_cuMemFreeAsync_ptsz:
        return ((pfn_cuMemFreeAsync)fn)(value, NULL);
    case TID_cuMemRelease:
        return ((pfn_cuMemRelease)fn)(value);
    case TID_cuArrayDestroy:
        return ((pfn_cuArrayDestroy)fn)((CUarray)(uintptr_t)value);
    case TID_cuMipmappedArrayDestroy:
        return ((pfn_cuMipmappedArrayDestroy)fn)((CUmipmappedArray)(uintptr_t)value);
    }
    die("unhandled free");
    return CUDA_ERROR_UNKNOWN;
}

static int find_kind(const char *name)
{
    for (int k = 0; k < N_KINDS; k++)
        if (!strcmp(kinds[k].name, name))
            return k;
    die("unknown allocation kind");
    return -1;
}

/* -- stress: concurrent allocations against the quota --------------------------- */

static uint64_t stress_bytes;
static int stress_iters;
static _Atomic long long stress_live, stress_max_live, stress_refused, stress_errors;

static void *stress_thread(void *arg)
{
    (void)arg;
    for (int i = 0; i < stress_iters; i++) {
        CUdeviceptr p = 0;
        CUresult r = cuMemAlloc_v2(&p, stress_bytes);
        if (r == CUDA_ERROR_OUT_OF_MEMORY) {
            atomic_fetch_add(&stress_refused, 1);
            continue;
        }
        if (r != CUDA_SUCCESS) {
            atomic_fetch_add(&stress_errors, 1);
            continue;
        }
        long long live = atomic_fetch_add(&stress_live, (long long)stress_bytes) + (long long)stress_bytes;
        long long m = atomic_load(&stress_max_live);
        while (live > m && !atomic_compare_exchange_weak(&stress_max_live, &m, live))
            ;
        atomic_fetch_sub(&stress_live, (long long)stress_bytes);
        if (cuMemFree_v2(p) != CUDA_SUCCESS)
            atomic_fetch_add(&stress_errors, 1);
    }
    return NULL;
}

/* -- signals ---------------------------------------------------------------- */

static volatile sig_atomic_t got_signal;

static void event_line(const char *text)
{
    const char *path = getenv("XCUDA_FAKE_EVENT_LOG");
    if (path == NULL)
        return;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    if (write(fd, text, strlen(text)) < 0) {
    }
    close(fd);
}

static void handler_exit42(int sig)
{
    event_line(sig == SIGTERM ? "program_handler SIGTERM\n" : "program_handler SIGINT\n");
    _exit(42);
}

static void handler_record(int sig)
{
    got_signal = sig;
    event_line("program_handler_returned\n");
}

static int parse_signal(const char *s)
{
    if (!strcmp(s, "SIGTERM"))
        return SIGTERM;
    if (!strcmp(s, "SIGINT"))
        return SIGINT;
    die("signal must be SIGTERM or SIGINT");
    return 0;
}

static void install(int sig, const char *action, const char *api)
{
    void (*h)(int);
    int flags = 0;
    if (!strcmp(action, "exit42"))
        h = handler_exit42;
    else if (!strcmp(action, "resethand"))
        h = handler_record, flags = SA_RESETHAND;
    else if (!strcmp(action, "record"))
        h = handler_record;
    else if (!strcmp(action, "ign"))
        h = SIG_IGN;
    else if (!strcmp(action, "dfl"))
        h = SIG_DFL;
    else
        die("action must be exit42, record, resethand, ign or dfl");
    if (!strcmp(api, "signal")) {
        if (signal(sig, h) == SIG_ERR)
            die("signal failed");
    } else {
        struct sigaction a;
        memset(&a, 0, sizeof a);
        a.sa_handler = h;
        a.sa_flags = flags;
        sigemptyset(&a.sa_mask);
        if (sigaction(sig, &a, NULL) != 0)
            die("sigaction failed");
    }
}

static const char *handler_name(void (*h)(int))
{
    if (h == handler_exit42)
        return "exit42";
    if (h == handler_record)
        return "record";
    if (h == SIG_IGN)
        return "ign";
    if (h == SIG_DFL)
        return "dfl";
    return "other";
}

/* -- commands ------------------------------------------------------------------ */

static pfn_cuLaunchKernel runtime_launch(void)
{
    runtime_setup();
    void *fn = NULL;
    CUdriverProcAddressQueryResult st;
    if (gpa("cuLaunchKernel", &fn, 12000, 0, &st) != CUDA_SUCCESS || fn == NULL)
        die("no cuLaunchKernel");
    return (pfn_cuLaunchKernel)fn;
}

#define LAUNCH(fn) (fn)(NULL, 1, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL)

static void cmd_init(void)
{
    CUcontext ctx = NULL;
    if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        die("init failed");
    printf("init ok\n");
}

static void cmd_call_all(void)
{
    int ok = 0, bad = 0;
    for (int id = 0; id < TID_COUNT; id++) {
        const struct xc_test_entry *e = &xc_test_entries[id];
        if (e->kind == TK_REAL)
            continue;
        for (int p = 0; p < P_COUNT; p++) {
            void *fn = resolve(id, (enum path)p);
            if (fn == NULL) {
                printf("call %s %s missing\n", e->name, path_names[p]);
                bad++;
                continue;
            }
            unsigned long long c0 = xcfake_calls(e->name), v0 = xcfake_calls_via_xcuda(e->name);
            harness_callers[id](fn);
            unsigned long long dc = xcfake_calls(e->name) - c0, dv = xcfake_calls_via_xcuda(e->name) - v0;
            int good = dc == 1 && dv == 1;
            printf("call %s %s calls=%llu via_xcuda=%llu %s\n", e->name, path_names[p], dc, dv, good ? "ok" : "BAD");
            good ? ok++ : bad++;
        }
    }
    printf("call-all ok=%d bad=%d\n", ok, bad);
}

static void cmd_resolve_all(void)
{
    for (int id = 0; id < TID_COUNT; id++) {
        const struct xc_test_entry *e = &xc_test_entries[id];
        printf("resolve %s kind=%s", e->name, e->kind == TK_REAL ? "real" : (e->kind == TK_LAUNCH ? "launch" : "hook"));
        for (int p = 0; p < P_COUNT; p++) {
            const char *sym;
            const char *obj = object_of(resolve(id, (enum path)p), &sym);
            printf(" %s=%s:%s", path_names[p], obj, sym);
        }
        printf("\n");
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        const char *c = argv[i];
#define ARG() (i + 1 < argc ? argv[++i] : (die("missing argument"), ""))
        if (!strcmp(c, "init")) {
            cmd_init();
        } else if (!strcmp(c, "alloc")) {
            int k = find_kind(ARG());
            uint64_t bytes = parse_u64(ARG());
            enum path p = i + 1 < argc && is_path(argv[i + 1]) ? parse_path(argv[++i]) : P_DIRECT;
            uint64_t value = 0;
            CUresult r = do_alloc(k, bytes, p, &value);
            int slot = -1;
            if (r == CUDA_SUCCESS && n_slots < MAX_SLOTS) {
                slot = n_slots++;
                slots[slot].kind = k;
                slots[slot].value = value;
                slots[slot].path = p;
            }
            printf("alloc %s rc=%d slot=%d\n", kinds[k].name, (int)r, slot);
        } else if (!strcmp(c, "graph-alloc")) {
            /* graph-alloc node|add|add_v2 <bytes> [path]: a graph memory-allocation node of that many bytes
             * (cuGraphAddMemAllocNode, or cuGraphAddNode / _v2 with an allocation's parameters). */
            const char *how = ARG();
            uint64_t bytes = parse_u64(ARG());
            enum path p = i + 1 < argc && is_path(argv[i + 1]) ? parse_path(argv[++i]) : P_DIRECT;
            CUgraph g = (CUgraph)(uintptr_t)0x10;
            CUgraphNode n = NULL;
            CUresult r;
            CUdeviceptr dptr;
            if (!strcmp(how, "node")) {
                CUDA_MEM_ALLOC_NODE_PARAMS a = {.bytesize = bytes};
                r = ((pfn_cuGraphAddMemAllocNode)resolve(TID_cuGraphAddMemAllocNode, p))(&n, g, NULL, 0, &a);
                dptr = a.dptr;
            } else {
                CUgraphNodeParams a = {.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC, .alloc = {.bytesize = bytes}};
                if (!strcmp(how, "add"))
                    r = ((pfn_cuGraphAddNode)resolve(TID_cuGraphAddNode, p))(&n, g, NULL, 0, &a);
                else if (!strcmp(how, "add_v2"))
                    r = ((pfn_cuGraphAddNode_v2)resolve(TID_cuGraphAddNode_v2, p))(&n, g, NULL, NULL, 0, &a);
                else
                    die("graph-alloc takes node, add or add_v2");
                dptr = a.alloc.dptr;
            }
            printf("graph-alloc %s rc=%d dptr=%s\n", how, (int)r, dptr != 0 ? "set" : "none");
        } else if (!strcmp(c, "graph-kernel")) {
            /* A node of another type through cuGraphAddNode: not charged. */
            CUgraphNode n = NULL;
            CUgraphNodeParams a = {.type = CU_GRAPH_NODE_TYPE_KERNEL, .alloc = {.bytesize = 1ull << 40}};
            CUresult r = cuGraphAddNode(&n, (CUgraph)(uintptr_t)0x10, NULL, 0, &a);
            printf("graph-kernel rc=%d\n", (int)r);
        } else if (!strcmp(c, "free")) {
            int slot = (int)parse_u64(ARG());
            if (slot < 0 || slot >= n_slots)
                die("bad slot");
            CUresult r = do_free(slots[slot].kind, slots[slot].value, slots[slot].path);
            printf("free %d rc=%d\n", slot, (int)r);
        } else if (!strcmp(c, "meminfo")) {
            size_t f = 0, t = 0;
            CUresult r = cuMemGetInfo_v2(&f, &t);
            unsigned int f1 = 0, t1 = 0;
            CUresult r1 = cuMemGetInfo(&f1, &t1);
            printf("meminfo rc=%d free=%zu total=%zu rc_v1=%d free_v1=%u total_v1=%u\n", (int)r, f, t, (int)r1, f1, t1);
        } else if (!strcmp(c, "totalmem")) {
            size_t b = 0;
            unsigned int b1 = 0;
            CUresult r = cuDeviceTotalMem_v2(&b, 0), r1 = cuDeviceTotalMem(&b1, 0);
            printf("totalmem rc=%d bytes=%zu rc_v1=%d bytes_v1=%u\n", (int)r, b, (int)r1, b1);
        } else if (!strcmp(c, "fake-used")) {
            printf("fake-used bytes=%llu\n", xcfake_mem_used());
        } else if (!strcmp(c, "fail-next")) {
            const char *name = ARG();
            xcfake_fail_next(name, (int)parse_u64(ARG()));
        } else if (!strcmp(c, "idle")) {
            double secs = atof(ARG());
            struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
            while (nanosleep(&ts, &ts) != 0)
                ;
            printf("idle pid=%ld\n", (long)getpid());
        } else if (!strcmp(c, "launch")) {
            unsigned long long n = parse_u64(ARG());
            pfn_cuLaunchKernel fn = runtime_launch();
            double t0 = now_s();
            int errors = 0;
            for (unsigned long long k = 0; k < n; k++)
                errors += LAUNCH(fn) != CUDA_SUCCESS;
            printf("launched n=%llu seconds=%.6f errors=%d\n", n, now_s() - t0, errors);
        } else if (!strcmp(c, "launch-for")) {
            double secs = atof(ARG());
            pfn_cuLaunchKernel fn = runtime_launch();
            double t0 = now_s(), t;
            unsigned long long n = 0;
            while ((t = now_s()) - t0 < secs) {
                LAUNCH(fn);
                n++;
            }
            printf("launched n=%llu seconds=%.6f\n", n, t - t0);
        } else if (!strcmp(c, "launch-trace")) {
            double secs = atof(ARG()), bucket = atof(ARG()) / 1000.0;
            int nb = (int)(secs / bucket + 0.5);
            unsigned long long *counts = calloc((size_t)nb, sizeof *counts);
            pfn_cuLaunchKernel fn = runtime_launch();
            double t0 = now_s(), t;
            while ((t = now_s() - t0) < secs) {
                LAUNCH(fn);
                int b = (int)(t / bucket);
                if (b < nb)
                    counts[b]++;
            }
            printf("trace");
            for (int b = 0; b < nb; b++)
                printf(" %llu", counts[b]);
            printf("\n");
            free(counts);
        } else if (!strcmp(c, "burst")) {
            pfn_cuLaunchKernel fn = runtime_launch();
            for (unsigned long long n = 1;; n++) {
                CUresult r = LAUNCH(fn);
                if (r != CUDA_SUCCESS) {
                    printf("launch rc=%d after=%llu signal=%d\n", (int)r, n, (int)got_signal);
                    exit(7);
                }
                if (got_signal) {
                    /* A handler that returned: the program's clean-up (a checkpoint) launches on. */
                    int errors = 0;
                    for (int k = 0; k < 100; k++)
                        errors += LAUNCH(fn) != CUDA_SUCCESS;
                    printf("after-signal launches=100 errors=%d signal=%d\n", errors, (int)got_signal);
                    exit(errors ? 7 : 0);
                }
                if (n == 1000)
                    printf("ready\n");
            }
        } else if (!strcmp(c, "sig")) {
            int sig = parse_signal(ARG());
            const char *action = ARG();
            install(sig, action, ARG());
        } else if (!strcmp(c, "sigquery")) {
            int sig = parse_signal(ARG());
            struct sigaction old;
            sigaction(sig, NULL, &old);
            printf("sigquery handler=%s resethand=%d\n", handler_name(old.sa_handler), !!(old.sa_flags & SA_RESETHAND));
        } else if (!strcmp(c, "raise")) {
            int sig = parse_signal(ARG());
            got_signal = 0;  /* what the next wait-exit waits for is this signal's handler */
            raise(sig);
            printf("raised got=%d\n", (int)got_signal);
        } else if (!strcmp(c, "fork-launch")) {
            /* A forked child (a data-loader worker, say) that launches on its own. */
            unsigned long long n = parse_u64(ARG());
            pfn_cuLaunchKernel fn = runtime_launch();
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                int errors = 0;
                for (unsigned long long k = 0; k < n; k++)
                    errors += LAUNCH(fn) != CUDA_SUCCESS;
                _exit(errors ? 1 : 0);
            }
            int status = 0;
            waitpid(pid, &status, 0);
            printf("fork-launch exit=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
        } else if (!strcmp(c, "wait-exit")) {
            /* Waits (polling) for a signal handler to end the process, up to a deadline. */
            double deadline = now_s() + atof(ARG());
            while (now_s() < deadline && !got_signal) {
                struct timespec ts = {0, 5000000};
                nanosleep(&ts, NULL);
            }
            printf("wait-exit got=%d\n", (int)got_signal);
            if (!got_signal)
                return 3;
        } else if (!strcmp(c, "resolve-all")) {
            cmd_resolve_all();
        } else if (!strcmp(c, "call-all")) {
            cmd_call_all();
        } else if (!strcmp(c, "gpa")) {
            const char *symbol = ARG();
            int version = (int)parse_u64(ARG());
            cuuint64_t flags = parse_u64(ARG());
            runtime_setup();
            void *fn = NULL;
            CUdriverProcAddressQueryResult st = 99;
            CUresult r = gpa(symbol, &fn, version, flags, &st);
            const char *sym;
            const char *obj = object_of(fn, &sym);
            printf("gpa %s rc=%d status=%d obj=%s sym=%s\n", symbol, (int)r, (int)st, obj, sym);
        } else if (!strcmp(c, "dlsym")) {
            const char *which = ARG();
            const char *name = ARG();
            runtime_setup();
            void *h = !strcmp(which, "default") ? RTLD_DEFAULT : (!strcmp(which, "next") ? RTLD_NEXT : libcuda);
            void *fn = dlsym(h, name);
            const char *sym;
            const char *obj = object_of(fn, &sym);
            printf("dlsym %s %s obj=%s sym=%s\n", which, name, obj, sym);
        } else if (!strcmp(c, "probe-next")) {
            int (*probe)(void) = (int (*)(void))dlsym(RTLD_NEXT, "xcfake_probe");
            printf("probe-next value=%d\n", probe != NULL ? probe() : -1);
        } else if (!strcmp(c, "calls")) {
            const char *name = ARG();
            find_entry(name);
            printf("calls %s total=%llu via_xcuda=%llu\n", name, xcfake_calls(name), xcfake_calls_via_xcuda(name));
        } else if (!strcmp(c, "stress-mem")) {
            int threads = (int)parse_u64(ARG());
            stress_iters = (int)parse_u64(ARG());
            stress_bytes = parse_u64(ARG());
            pthread_t tids[64];
            if (threads < 1 || threads > 64)
                die("1..64 threads");
            for (int t = 0; t < threads; t++)
                pthread_create(&tids[t], NULL, stress_thread, NULL);
            for (int t = 0; t < threads; t++)
                pthread_join(tids[t], NULL);
            printf("stress max_live=%lld refused=%lld errors=%lld\n", atomic_load(&stress_max_live),
                   atomic_load(&stress_refused), atomic_load(&stress_errors));
        } else if (!strcmp(c, "print")) {
            printf("%s\n", ARG());
        } else {
            fprintf(stderr, "harness: unknown command %s\n", c);
            return 2;
        }
    }
    return 0;
}
