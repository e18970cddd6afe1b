/*
 * A fake CUDA driver for tests without a GPU: every entry point of hooks.def
 * (plus cuDriverGetVersion, which xCUDA does not hook), with call counters,
 * device memory that is only bookkeeping, contexts that are only numbers, and
 * a cuGetProcAddress that picks versions and per-thread variants like the
 * real driver. Built with -Bsymbolic so that, like the real driver, it hands
 * out its own functions even when libxcuda.so is preloaded.
 *
 * XCUDA_FAKE_TOTAL_MEM      device memory in bytes (default 16 GiB)
 * XCUDA_FAKE_DEVICES        number of devices (default 1)
 * XCUDA_FAKE_EVENT_LOG      append context events to this file
 * XCUDA_FAKE_TRACE_CALLERS  1: count which calls come from libxcuda.so
 */
#define XCUDA_API __attribute__((visibility("default")))
#include "../src/cuda_api.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/memtrack.h"
#include "fake_cuda.h"
#include "test_ids.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVICES 8

static _Atomic unsigned long long calls[TID_COUNT], via_xcuda[TID_COUNT];
static _Atomic int fail_id = -1, fail_result;
static int trace_callers, event_fd = -1, n_devices = 1;
static unsigned long long total_mem = 16ull << 30;
static _Atomic unsigned long long mem_used, next_ptr = 0x7f0000000000ull, next_handle = 0x1000;
static struct xc_table sizes;          /* pointer/handle -> bytes */
static _Atomic int primary_refs[MAX_DEVICES];
static _Atomic int contexts_alive, ever_released;
static _Atomic unsigned long long after_release, next_ctx = 0x2000;
static __thread CUcontext current;

__attribute__((constructor))
static void fake_init(void)
{
    const char *v;
    if ((v = getenv("XCUDA_FAKE_TOTAL_MEM")) != NULL)
        total_mem = strtoull(v, NULL, 10);
    if ((v = getenv("XCUDA_FAKE_DEVICES")) != NULL)
        n_devices = atoi(v) > 0 && atoi(v) <= MAX_DEVICES ? atoi(v) : 1;
    if ((v = getenv("XCUDA_FAKE_EVENT_LOG")) != NULL)
        event_fd = open(v, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    trace_callers = (v = getenv("XCUDA_FAKE_TRACE_CALLERS")) != NULL && v[0] == '1';
    xc_table_init(&sizes, 20);
}

__attribute__((format(printf, 1, 2)))
static void event(const char *fmt, ...)
{
    if (event_fd < 0)
        return;
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if (n > (int)sizeof buf - 2)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    if (write(event_fd, buf, (size_t)n) < 0)
        return;
}

static void note_caller(int id, void *ret)
{
    Dl_info info;
    if (dladdr(ret, &info) && info.dli_fname != NULL && strstr(info.dli_fname, "libxcuda") != NULL)
        atomic_fetch_add_explicit(&via_xcuda[id], 1, memory_order_relaxed);
}

static int take_failure(int id, CUresult *r)
{
    if (atomic_load_explicit(&fail_id, memory_order_relaxed) != id)
        return 0;
    int expected = id;
    if (!atomic_compare_exchange_strong(&fail_id, &expected, -1))
        return 0;
    *r = (CUresult)atomic_load(&fail_result);
    return 1;
}

/* Counts the call; must expand inside the entry point for the return address. */
#define ENTER(name)                                                                     \
    do {                                                                                \
        atomic_fetch_add_explicit(&calls[TID_##name], 1, memory_order_relaxed);         \
        if (trace_callers)                                                              \
            note_caller(TID_##name, __builtin_return_address(0));                       \
        CUresult failed_;                                                               \
        if (__builtin_expect(atomic_load_explicit(&fail_id, memory_order_relaxed) >= 0, 0) && \
            take_failure(TID_##name, &failed_))                                         \
            return failed_;                                                             \
    } while (0)

static int find(const char *name)
{
    for (int i = 0; i < TID_COUNT; i++)
        if (!strcmp(xc_test_entries[i].name, name))
            return i;
    return -1;
}

EXPORT unsigned long long xcfake_calls(const char *name)
{
    int i = find(name);
    return i < 0 ? 0 : atomic_load(&calls[i]);
}

EXPORT unsigned long long xcfake_calls_via_xcuda(const char *name)
{
    int i = find(name);
    return i < 0 ? 0 : atomic_load(&via_xcuda[i]);
}

EXPORT void xcfake_fail_next(const char *name, int result)
{
    atomic_store(&fail_result, result);
    atomic_store(&fail_id, find(name));
}

EXPORT unsigned long long xcfake_mem_used(void)
{
    return atomic_load(&mem_used);
}

EXPORT unsigned long long xcfake_launches_after_release(void)
{
    return atomic_load(&after_release);
}

EXPORT int xcfake_probe(void)
{
    return 2;
}

/* -- memory ----------------------------------------------------------------- */

static CUresult take(unsigned long long bytes, uint64_t *key, int handle)
{
    unsigned long long u = atomic_load(&mem_used);
    do {
        if (bytes > total_mem - u || u > total_mem)
            return CUDA_ERROR_OUT_OF_MEMORY;
    } while (!atomic_compare_exchange_weak(&mem_used, &u, u + bytes));
    uint64_t k = handle ? atomic_fetch_add(&next_handle, 16)
                        : atomic_fetch_add(&next_ptr, (bytes + 511) / 512 * 512 + 512);
    xc_table_insert(&sizes, k, bytes);
    *key = k;
    return CUDA_SUCCESS;
}

static CUresult give(uint64_t key)
{
    uint64_t bytes;
    if (!xc_table_remove(&sizes, key, &bytes))
        return CUDA_ERROR_INVALID_VALUE;
    atomic_fetch_sub(&mem_used, bytes);
    return CUDA_SUCCESS;
}

static unsigned long long array_size(size_t w, size_t h, size_t d, unsigned ch)
{
    return (unsigned long long)w * (h ? h : 1) * (d ? d : 1) * (ch ? ch : 1) * 4;
}

#define TAKE_INTO(ptr, type, bytes, handle)               \
    do {                                                  \
        if ((ptr) == NULL)                                \
            return CUDA_ERROR_INVALID_VALUE;              \
        uint64_t k_;                                      \
        CUresult r_ = take((bytes), &k_, (handle));       \
        if (r_ == CUDA_SUCCESS)                           \
            *(ptr) = (type)k_;                            \
        return r_;                                        \
    } while (0)

EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    ENTER(cuMemAlloc);
    if (dptr == NULL || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* 32-bit pointers: hand out small numbers from the handle range. */
    TAKE_INTO(dptr, CUdeviceptr_v1, bytesize, 1);
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    ENTER(cuMemAlloc_v2);
    if (bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    TAKE_INTO(dptr, CUdeviceptr, bytesize, 0);
}

EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                                unsigned int Height, unsigned int ElementSizeBytes)
{
    ENTER(cuMemAllocPitch);
    (void)ElementSizeBytes;
    if (pPitch == NULL || WidthInBytes == 0 || Height == 0)
        return CUDA_ERROR_INVALID_VALUE;
    *pPitch = (WidthInBytes + 511) / 512 * 512;
    TAKE_INTO(dptr, CUdeviceptr_v1, (unsigned long long)*pPitch * Height, 1);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                   unsigned int ElementSizeBytes)
{
    ENTER(cuMemAllocPitch_v2);
    (void)ElementSizeBytes;
    if (pPitch == NULL || WidthInBytes == 0 || Height == 0)
        return CUDA_ERROR_INVALID_VALUE;
    *pPitch = (WidthInBytes + 511) / 512 * 512;
    TAKE_INTO(dptr, CUdeviceptr, (unsigned long long)*pPitch * Height, 0);
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    ENTER(cuMemAllocManaged);
    (void)flags;
    TAKE_INTO(dptr, CUdeviceptr, bytesize, 0);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    ENTER(cuMemAllocAsync);
    (void)hStream;
    TAKE_INTO(dptr, CUdeviceptr, bytesize, 0);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    ENTER(cuMemAllocAsync_ptsz);
    (void)hStream;
    TAKE_INTO(dptr, CUdeviceptr, bytesize, 0);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    ENTER(cuMemAllocFromPoolAsync);
    (void)pool, (void)hStream;
    TAKE_INTO(dptr, CUdeviceptr, bytesize, 0);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                             CUstream hStream)
{
    ENTER(cuMemAllocFromPoolAsync_ptsz);
    (void)pool, (void)hStream;
    TAKE_INTO(dptr, CUdeviceptr, bytesize, 0);
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags)
{
    ENTER(cuMemCreate);
    (void)prop, (void)flags;
    TAKE_INTO(handle, CUmemGenericAllocationHandle, size, 1);
}

EXPORT CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *a)
{
    ENTER(cuArrayCreate);
    if (a == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    TAKE_INTO(pHandle, CUarray, array_size(a->Width, a->Height, 1, a->NumChannels), 1);
}

EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *a)
{
    ENTER(cuArrayCreate_v2);
    if (a == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    TAKE_INTO(pHandle, CUarray, array_size(a->Width, a->Height, 1, a->NumChannels), 1);
}

EXPORT CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *a)
{
    ENTER(cuArray3DCreate);
    if (a == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    TAKE_INTO(pHandle, CUarray, array_size(a->Width, a->Height, a->Depth, a->NumChannels), 1);
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *a)
{
    ENTER(cuArray3DCreate_v2);
    if (a == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    TAKE_INTO(pHandle, CUarray, array_size(a->Width, a->Height, a->Depth, a->NumChannels), 1);
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *a,
                                       unsigned int numMipmapLevels)
{
    ENTER(cuMipmappedArrayCreate);
    if (a == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    (void)numMipmapLevels;
    TAKE_INTO(pHandle, CUmipmappedArray, 2 * array_size(a->Width, a->Height, a->Depth, a->NumChannels), 1);
}

/* Graph allocation nodes: the memory is taken at once and never given back (the fake has no launches to
 * materialise it); a node is only a number. */
static _Atomic unsigned long long next_node = 0x3000;

static CUresult alloc_node(CUgraphNode *phGraphNode, CUgraph hGraph, CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
    if (phGraphNode == NULL || hGraph == NULL || p == NULL || p->bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t k;
    CUresult r = take(p->bytesize, &k, 0);
    if (r != CUDA_SUCCESS)
        return r;
    p->dptr = k;
    *phGraphNode = (CUgraphNode)(uintptr_t)atomic_fetch_add(&next_node, 16);
    return CUDA_SUCCESS;
}

static CUresult add_node(CUgraphNode *phGraphNode, CUgraph hGraph, CUgraphNodeParams *p)
{
    if (p == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (p->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
        return alloc_node(phGraphNode, hGraph, &p->alloc);
    if (phGraphNode == NULL || hGraph == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *phGraphNode = (CUgraphNode)(uintptr_t)atomic_fetch_add(&next_node, 16);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                       size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
    ENTER(cuGraphAddMemAllocNode);
    (void)dependencies, (void)numDependencies;
    return alloc_node(phGraphNode, hGraph, nodeParams);
}

EXPORT CUresult cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                               size_t numDependencies, CUgraphNodeParams *nodeParams)
{
    ENTER(cuGraphAddNode);
    (void)dependencies, (void)numDependencies;
    return add_node(phGraphNode, hGraph, nodeParams);
}

EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                  const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                  CUgraphNodeParams *nodeParams)
{
    ENTER(cuGraphAddNode_v2);
    (void)dependencies, (void)dependencyData, (void)numDependencies;
    return add_node(phGraphNode, hGraph, nodeParams);
}

EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr) { ENTER(cuMemFree); return give(dptr); }
EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { ENTER(cuMemFree_v2); return give(dptr); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) { ENTER(cuMemFreeAsync); (void)s; return give(dptr); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) { ENTER(cuMemFreeAsync_ptsz); (void)s; return give(dptr); }
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) { ENTER(cuMemRelease); return give(h); }
EXPORT CUresult cuArrayDestroy(CUarray a) { ENTER(cuArrayDestroy); return give((uint64_t)(uintptr_t)a); }
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a)
{
    ENTER(cuMipmappedArrayDestroy);
    return give((uint64_t)(uintptr_t)a);
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    ENTER(cuMemGetInfo_v2);
    if (free_b == NULL || total_b == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned long long u = atomic_load(&mem_used);
    *total_b = total_mem;
    *free_b = u > total_mem ? 0 : total_mem - u;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total_b)
{
    ENTER(cuMemGetInfo);
    if (free_b == NULL || total_b == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned long long u = atomic_load(&mem_used), f = u > total_mem ? 0 : total_mem - u;
    *total_b = total_mem > 0xffffffffull ? 0xffffffffu : (unsigned)total_mem;
    *free_b = f > 0xffffffffull ? 0xffffffffu : (unsigned)f;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    ENTER(cuDeviceTotalMem_v2);
    if (bytes == NULL || dev < 0 || dev >= n_devices)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = total_mem;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    ENTER(cuDeviceTotalMem);
    if (bytes == NULL || dev < 0 || dev >= n_devices)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = total_mem > 0xffffffffull ? 0xffffffffu : (unsigned)total_mem;
    return CUDA_SUCCESS;
}

/* -- launches ----------------------------------------------------------------- */

static void launched(void)
{
    if (atomic_load_explicit(&contexts_alive, memory_order_relaxed) == 0 &&
        atomic_load_explicit(&ever_released, memory_order_relaxed)) {
        if (atomic_fetch_add(&after_release, 1) == 0)
            event("launch_after_release");
    }
}

#define XCUDA_HOOK(name, proc, ver, ptds, params, args)
#define XCUDA_REAL(name, proc, ver, ptds, params, args)
#define XCUDA_LAUNCH(name, proc, ver, ptds, cost, params, args) \
    EXPORT CUresult name params                                 \
    {                                                           \
        ENTER(name);                                            \
        launched();                                             \
        return CUDA_SUCCESS;                                    \
    }
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "../src/hooks.def"
#pragma GCC diagnostic pop
#undef XCUDA_HOOK
#undef XCUDA_LAUNCH
#undef XCUDA_REAL

/* -- devices and contexts ----------------------------------------------------- */

EXPORT CUresult cuInit(unsigned int Flags)
{
    ENTER(cuInit);
    (void)Flags;
    event("cuInit");
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *version);
EXPORT CUresult cuDriverGetVersion(int *version)
{
    if (version == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *version = 12080;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count)
{
    ENTER(cuDeviceGetCount);
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *count = n_devices;
    return CUDA_SUCCESS;
}

static CUcontext primary_of(CUdevice dev)
{
    return (CUcontext)(uintptr_t)(0x1000 + 16 * dev);
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxRetain);
    if (pctx == NULL || dev < 0 || dev >= n_devices)
        return CUDA_ERROR_INVALID_VALUE;
    if (atomic_fetch_add(&primary_refs[dev], 1) == 0)
        atomic_fetch_add(&contexts_alive, 1);
    *pctx = primary_of(dev);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    ENTER(cuDevicePrimaryCtxGetState);
    if (flags == NULL || active == NULL || dev < 0 || dev >= n_devices)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = 0;
    *active = atomic_load(&primary_refs[dev]) > 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxReset_v2);
    if (dev < 0 || dev >= n_devices)
        return CUDA_ERROR_INVALID_VALUE;
    if (atomic_exchange(&primary_refs[dev], 0) > 0)
        atomic_fetch_sub(&contexts_alive, 1);
    atomic_store(&ever_released, 1);
    event("primary_ctx_reset dev=%d", dev);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxRelease_v2);
    if (dev < 0 || dev >= n_devices)
        return CUDA_ERROR_INVALID_VALUE;
    int refs = atomic_load(&primary_refs[dev]);
    do {
        if (refs <= 0)
            return CUDA_ERROR_INVALID_CONTEXT;  /* released more often than retained */
    } while (!atomic_compare_exchange_weak(&primary_refs[dev], &refs, refs - 1));
    if (refs == 1) {
        atomic_fetch_sub(&contexts_alive, 1);
        atomic_store(&ever_released, 1);
    }
    event("primary_ctx_release dev=%d refs=%d", dev, refs - 1);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    ENTER(cuCtxSetCurrent);
    current = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void)
{
    ENTER(cuCtxSynchronize);
    if (current == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    unsigned long long launches = 0;
    for (int i = 0; i < TID_COUNT; i++)
        if (xc_test_entries[i].kind == TK_LAUNCH)
            launches += atomic_load(&calls[i]);
    event("ctx_synchronize ctx=%p launches=%llu", (void *)current, launches);
    return CUDA_SUCCESS;
}

static CUresult created(CUcontext *pctx, CUdevice dev)
{
    if (pctx == NULL || dev < 0 || dev >= n_devices)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)(uintptr_t)atomic_fetch_add(&next_ctx, 16);
    atomic_fetch_add(&contexts_alive, 1);
    current = *pctx;
    event("ctx_create ctx=%p", (void *)*pctx);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    ENTER(cuCtxCreate_v2);
    (void)flags;
    return created(pctx, dev);
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
                               CUdevice dev)
{
    ENTER(cuCtxCreate_v3);
    (void)paramsArray, (void)numParams, (void)flags;
    return created(pctx, dev);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev)
{
    ENTER(cuCtxCreate_v4);
    (void)params, (void)flags;
    return created(pctx, dev);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    ENTER(cuCtxDestroy_v2);
    uintptr_t v = (uintptr_t)ctx;
    if (v < 0x2000 || v >= atomic_load(&next_ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    atomic_fetch_sub(&contexts_alive, 1);
    atomic_store(&ever_released, 1);
    if (current == ctx)
        current = NULL;
    event("ctx_destroy ctx=%p", (void *)ctx);
    return CUDA_SUCCESS;
}

/* -- cuGetProcAddress, as the driver does it ------------------------------------ */

struct proc_entry {
    const char *proc;
    int version, ptds;
    void *fn;
};

static const struct proc_entry procs[] = {
#define XCUDA_HOOK(name, proc, ver, ptds, params, args) {proc, ver, ptds, (void *)name},
#define XCUDA_LAUNCH(name, proc, ver, ptds, cost, params, args) {proc, ver, ptds, (void *)name},
#define XCUDA_REAL(name, proc, ver, ptds, params, args) {proc, ver, ptds, (void *)name},
#include "../src/hooks.def"
#undef XCUDA_HOOK
#undef XCUDA_LAUNCH
#undef XCUDA_REAL
    {"cuDriverGetVersion", 2020, 0, (void *)cuDriverGetVersion},
};

static int pick(const char *symbol, int version, int ptds, int *too_new)
{
    int best = -1;
    for (int i = 0; i < (int)(sizeof procs / sizeof procs[0]); i++) {
        if (procs[i].ptds != ptds || strcmp(procs[i].proc, symbol) != 0)
            continue;
        if (procs[i].version > version) {
            *too_new = 1;
            continue;
        }
        if (best < 0 || procs[i].version > procs[best].version)
            best = i;
    }
    return best;
}

static CUresult lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status)
{
    if (symbol == NULL || pfn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    int too_new = 0, i = -1;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        i = pick(symbol, version, 1, &too_new);
    if (i < 0)
        i = pick(symbol, version, 0, &too_new);
    *pfn = i >= 0 ? procs[i].fn : NULL;
    if (status != NULL)
        *status = i >= 0 ? CU_GET_PROC_ADDRESS_SUCCESS
                         : (too_new ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    ENTER(cuGetProcAddress);
    return lookup(symbol, pfn, cudaVersion, flags, NULL);
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *symbolStatus)
{
    ENTER(cuGetProcAddress_v2);
    return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}
