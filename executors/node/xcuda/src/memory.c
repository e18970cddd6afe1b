/*
 * Memory quota (paper §4.1, workload level): every device allocation entry
 * point is charged against XCUDA_MEM_QUOTA_BYTES before the driver sees it,
 * every release gives the budget back, and cuMemGetInfo/cuDeviceTotalMem
 * report the quota so frameworks size their caches to it.
 */
#include <limits.h>
#include <string.h>

#include "memtrack.h"
#include "xcuda.h"

#define UNLIMITED UINT64_MAX
#define UNRESOLVED 0ull

/* Live allocations by kind of key; capacities in log2 entries. */
static struct xc_table t_ptr;     /* device pointers: cuMemAlloc*, managed, async, pools */
static struct xc_table t_handle;  /* cuMemCreate handles */
static struct xc_table t_array;   /* CUarray and CUmipmappedArray */

static _Atomic uint64_t used, peak, refused;
static _Atomic uint64_t quota_bytes;  /* UNRESOLVED until a percentage meets the device size */
static _Atomic int warned_unresolved, warned_refused, warned_full;

void xc_mem_init(void)
{
    const struct xc_config *c = &xc_g.cfg;
    if (xc_table_init(&t_ptr, 18) || xc_table_init(&t_handle, 16) || xc_table_init(&t_array, 14))
        xc_log(XC_LOG_ERROR, "cannot map the allocation tables: every allocation will be refused");
    /* A percentage (the default's, or the job's own smaller one next to the plan's bytes) waits for the device. */
    atomic_store(&quota_bytes, c->quota_kind == XC_QUOTA_NONE                           ? UNLIMITED
                               : c->quota_kind == XC_QUOTA_BYTES && !(c->quota_pct > 0) ? c->quota_bytes
                                                                                        : UNRESOLVED);
}

void xc_mem_stats(uint64_t *u, uint64_t *p, uint64_t *q, uint64_t *r)
{
    *u = atomic_load(&used);
    *p = atomic_load(&peak);
    *q = atomic_load(&quota_bytes);
    *r = atomic_load(&refused);
}

static uint64_t resolve_from_total(uint64_t total)
{
    uint64_t q = atomic_load_explicit(&quota_bytes, memory_order_acquire);
    if (q != UNRESOLVED || total == 0)
        return q;
    double b = (double)total * xc_g.cfg.quota_pct / 100.0;
    uint64_t want = b < 1.0 ? 1 : (uint64_t)b;
    if (xc_g.cfg.quota_bytes > 0 && xc_g.cfg.quota_bytes < want)
        want = xc_g.cfg.quota_bytes;  /* both a size and a percentage: the smaller */
    if (atomic_compare_exchange_strong(&quota_bytes, &q, want)) {
        xc_log(XC_LOG_INFO, "memory quota %g%% of %llu bytes = %llu bytes", xc_g.cfg.quota_pct,
               (unsigned long long)total, (unsigned long long)want);
        return want;
    }
    return q;
}

/* The quota in bytes; UNRESOLVED only while no context answers cuMemGetInfo. */
static uint64_t quota(void)
{
    uint64_t q = atomic_load_explicit(&quota_bytes, memory_order_acquire);
    if (XC_LIKELY(q != UNRESOLVED))
        return q;
    size_t free_b = 0, total_b = 0;
    if (xc_real_cuMemGetInfo_v2(&free_b, &total_b) == CUDA_SUCCESS)
        return resolve_from_total(total_b);
    return UNRESOLVED;
}

static int charge(uint64_t bytes)
{
    uint64_t q = quota();
    if (q == UNRESOLVED)
        XC_LOG_ONCE(warned_unresolved, XC_LOG_WARN,
                    "device memory size unknown (no current context?): allocation passed to the driver unchecked");
    uint64_t cur = atomic_load_explicit(&used, memory_order_relaxed);
    for (;;) {
        if (bytes > UINT64_MAX - cur)
            return 0;
        if (q != UNRESOLVED && q != UNLIMITED && (bytes > q || cur > q - bytes))
            return 0;
        if (atomic_compare_exchange_weak_explicit(&used, &cur, cur + bytes, memory_order_relaxed,
                                                  memory_order_relaxed))
            break;
    }
    uint64_t now = cur + bytes, p = atomic_load_explicit(&peak, memory_order_relaxed);
    while (now > p && !atomic_compare_exchange_weak_explicit(&peak, &p, now, memory_order_relaxed,
                                                             memory_order_relaxed))
        ;
    return 1;
}

static void refund(uint64_t bytes)
{
    atomic_fetch_sub_explicit(&used, bytes, memory_order_relaxed);
}

static CUresult refuse(const char *what, uint64_t bytes)
{
    atomic_fetch_add_explicit(&refused, 1, memory_order_relaxed);
    enum xc_log_level level = atomic_exchange(&warned_refused, 1) ? XC_LOG_DEBUG : XC_LOG_WARN;
    xc_log(level, "%s of %llu bytes refused: %llu of %llu bytes of the quota in use", what,
           (unsigned long long)bytes, (unsigned long long)atomic_load(&used),
           (unsigned long long)atomic_load(&quota_bytes));
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* Records a new allocation; 0 when the table is full (the caller undoes it). */
static int track(struct xc_table *t, uint64_t key, uint64_t bytes)
{
    if (XC_LIKELY(xc_table_insert(t, key, bytes)))
        return 1;
    XC_LOG_ONCE(warned_full, XC_LOG_ERROR, "allocation table full (%zu live allocations): refusing more",
                xc_table_live(t));
    return 0;
}

/* Before the driver frees `key`: take its entry out (put back if the free fails). */
static int untrack(struct xc_table *t, uint64_t key, uint64_t *bytes)
{
    return xc_table_remove(t, key, bytes);
}

static CUresult released(CUresult r, struct xc_table *t, uint64_t key, int had, uint64_t bytes)
{
    if (!had)
        return r;
    if (r == CUDA_SUCCESS)
        refund(bytes);
    else
        xc_table_insert(t, key, bytes);  /* still allocated: keep counting it */
    return r;
}

static uint64_t mul3(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t x, y;
    if (__builtin_mul_overflow(a, b, &x) || __builtin_mul_overflow(x, c, &y))
        return UINT64_MAX;
    return y;
}

/* -- linear allocations --------------------------------------------------- */

/* Charge the quota, call the driver, track what it returned; on any failure nothing stays
 * charged and nothing stays allocated. ``clear`` resets the out-parameter after an undo. */
#define ALLOC_TRACKED(name, table, out, key, bytes, call, undo, clear)            \
    do {                                                                          \
        uint64_t b_ = (bytes);                                                    \
        if (!charge(b_))                                                          \
            return refuse(#name, b_);                                             \
        CUresult r_ = call;                                                       \
        if (r_ != CUDA_SUCCESS || (out) == NULL) {                                \
            refund(b_);                                                           \
            return r_;                                                            \
        }                                                                         \
        if (!track((table), (key), b_)) {                                         \
            undo;                                                                 \
            refund(b_);                                                           \
            clear;                                                                \
            return CUDA_ERROR_OUT_OF_MEMORY;                                      \
        }                                                                         \
        return r_;                                                                \
    } while (0)

#define ALLOC_PTR(name, dptr, bytes, call, undo) \
    ALLOC_TRACKED(name, &t_ptr, dptr, (uint64_t)*(dptr), bytes, call, undo, *(dptr) = 0)

CUresult xc_w_cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    ALLOC_PTR(cuMemAlloc, dptr, bytesize, xc_real_cuMemAlloc(dptr, bytesize), xc_real_cuMemFree(*dptr));
}
XC_EXPORT(cuMemAlloc)

CUresult xc_w_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    ALLOC_PTR(cuMemAlloc_v2, dptr, bytesize, xc_real_cuMemAlloc_v2(dptr, bytesize), xc_real_cuMemFree_v2(*dptr));
}
XC_EXPORT(cuMemAlloc_v2)

CUresult xc_w_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    ALLOC_PTR(cuMemAllocManaged, dptr, bytesize, xc_real_cuMemAllocManaged(dptr, bytesize, flags),
              xc_real_cuMemFree_v2(*dptr));
}
XC_EXPORT(cuMemAllocManaged)

CUresult xc_w_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    ALLOC_PTR(cuMemAllocAsync, dptr, bytesize, xc_real_cuMemAllocAsync(dptr, bytesize, hStream),
              xc_real_cuMemFreeAsync(*dptr, hStream));
}
XC_EXPORT(cuMemAllocAsync)

CUresult xc_w_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    ALLOC_PTR(cuMemAllocAsync_ptsz, dptr, bytesize, xc_real_cuMemAllocAsync_ptsz(dptr, bytesize, hStream),
              xc_real_cuMemFreeAsync_ptsz(*dptr, hStream));
}
XC_EXPORT(cuMemAllocAsync_ptsz)

CUresult xc_w_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    ALLOC_PTR(cuMemAllocFromPoolAsync, dptr, bytesize,
              xc_real_cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream), xc_real_cuMemFreeAsync(*dptr, hStream));
}
XC_EXPORT(cuMemAllocFromPoolAsync)

CUresult xc_w_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                           CUstream hStream)
{
    ALLOC_PTR(cuMemAllocFromPoolAsync_ptsz, dptr, bytesize,
              xc_real_cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, hStream),
              xc_real_cuMemFreeAsync_ptsz(*dptr, hStream));
}
XC_EXPORT(cuMemAllocFromPoolAsync_ptsz)

/* Pitched: the pitch is known only afterwards. Charge the unpadded size,
 * then the padding, and undo the allocation if the padding does not fit. */
#define ALLOC_PITCH(name, dptr, pPitch, width, height, call, undo)             \
    do {                                                                              \
        uint64_t est_ = mul3((width), (height), 1);                                   \
        if (!charge(est_))                                                            \
            return refuse(#name, est_);                                               \
        CUresult r_ = call;                                                           \
        if (r_ != CUDA_SUCCESS || (dptr) == NULL) {                                   \
            refund(est_);                                                             \
            return r_;                                                                \
        }                                                                             \
        uint64_t real_ = (pPitch) != NULL ? mul3(*(pPitch), (height), 1) : est_;      \
        if (real_ > est_ && !charge(real_ - est_)) {                                  \
            undo;                                                                     \
            refund(est_);                                                             \
            *(dptr) = 0;                                                              \
            return refuse(#name, real_);                                              \
        }                                                                             \
        if (real_ < est_)                                                             \
            refund(est_ - real_);                                                     \
        if (!track(&t_ptr, (uint64_t)*(dptr), real_)) {                               \
            undo;                                                                     \
            refund(real_);                                                            \
            *(dptr) = 0;                                                              \
            return CUDA_ERROR_OUT_OF_MEMORY;                                          \
        }                                                                             \
        return r_;                                                                    \
    } while (0)

CUresult xc_w_cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                              unsigned int Height, unsigned int ElementSizeBytes)
{
    ALLOC_PITCH(cuMemAllocPitch, dptr, pPitch, WidthInBytes, Height,
                xc_real_cuMemAllocPitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes),
                xc_real_cuMemFree(*dptr));
}
XC_EXPORT(cuMemAllocPitch)

CUresult xc_w_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                 unsigned int ElementSizeBytes)
{
    ALLOC_PITCH(cuMemAllocPitch_v2, dptr, pPitch, WidthInBytes, Height,
                xc_real_cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes),
                xc_real_cuMemFree_v2(*dptr));
}
XC_EXPORT(cuMemAllocPitch_v2)

/* -- physical allocations of the virtual memory API ----------------------- */

CUresult xc_w_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                          unsigned long long flags)
{
    if (!charge(size))
        return refuse("cuMemCreate", size);
    CUresult r = xc_real_cuMemCreate(handle, size, prop, flags);
    if (r != CUDA_SUCCESS || handle == NULL) {
        refund(size);
        return r;
    }
    if (!track(&t_handle, (uint64_t)*handle, size)) {
        xc_real_cuMemRelease(*handle);
        refund(size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return r;
}
XC_EXPORT(cuMemCreate)

/* -- arrays: size from the descriptor ------------------------------------- */

static uint64_t format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    default:
        return 4;  /* 32-bit formats; newer packed/compressed ones are at most this per channel */
    }
}

static uint64_t array_bytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format f, unsigned channels)
{
    uint64_t texels = mul3(w, h ? h : 1, d ? d : 1);
    return mul3(texels, channels ? channels : 1, format_bytes(f));
}

static uint64_t mipmap_bytes(const CUDA_ARRAY3D_DESCRIPTOR *a, unsigned levels)
{
    uint64_t total = 0;
    uint64_t w = a->Width, h = a->Height, d = a->Depth;
    for (unsigned l = 0; l < (levels ? levels : 1) && l < 64; l++) {
        uint64_t b = array_bytes(w, h, d, a->Format, a->NumChannels);
        if (b > UINT64_MAX - total)
            return UINT64_MAX;
        total += b;
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        /* layered and cube-map arrays keep their layer count across levels */
        d = (a->Flags & 0x05u) ? d : (d > 1 ? d / 2 : d);
    }
    return total;
}

#define ALLOC_ARRAY(name, handle, bytes, call, undo) \
    ALLOC_TRACKED(name, &t_array, handle, (uint64_t)(uintptr_t)*(handle), bytes, call, undo, (void)0)

CUresult xc_w_cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *a)
{
    uint64_t b = a ? array_bytes(a->Width, a->Height, 1, a->Format, a->NumChannels) : 0;
    ALLOC_ARRAY(cuArrayCreate, pHandle, b, xc_real_cuArrayCreate(pHandle, a), xc_real_cuArrayDestroy(*pHandle));
}
XC_EXPORT(cuArrayCreate)

CUresult xc_w_cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *a)
{
    uint64_t b = a ? array_bytes(a->Width, a->Height, 1, a->Format, a->NumChannels) : 0;
    ALLOC_ARRAY(cuArrayCreate_v2, pHandle, b, xc_real_cuArrayCreate_v2(pHandle, a),
                xc_real_cuArrayDestroy(*pHandle));
}
XC_EXPORT(cuArrayCreate_v2)

CUresult xc_w_cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *a)
{
    uint64_t b = a ? array_bytes(a->Width, a->Height, a->Depth, a->Format, a->NumChannels) : 0;
    ALLOC_ARRAY(cuArray3DCreate, pHandle, b, xc_real_cuArray3DCreate(pHandle, a), xc_real_cuArrayDestroy(*pHandle));
}
XC_EXPORT(cuArray3DCreate)

CUresult xc_w_cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *a)
{
    uint64_t b = a ? array_bytes(a->Width, a->Height, a->Depth, a->Format, a->NumChannels) : 0;
    ALLOC_ARRAY(cuArray3DCreate_v2, pHandle, b, xc_real_cuArray3DCreate_v2(pHandle, a),
                xc_real_cuArrayDestroy(*pHandle));
}
XC_EXPORT(cuArray3DCreate_v2)

CUresult xc_w_cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *a,
                                     unsigned int numMipmapLevels)
{
    uint64_t b = a ? mipmap_bytes(a, numMipmapLevels) : 0;
    ALLOC_ARRAY(cuMipmappedArrayCreate, pHandle, b, xc_real_cuMipmappedArrayCreate(pHandle, a, numMipmapLevels),
                xc_real_cuMipmappedArrayDestroy(*pHandle));
}
XC_EXPORT(cuMipmappedArrayCreate)

/* -- graph memory-allocation nodes ------------------------------------------ */

/* A graph's allocation exists from a launch of an instantiation of the graph until its free node, an explicit
 * cuMemFree* or another graph's free node; an instantiation outlives the graph it came from, and an allocation the
 * graph does not free outlives both. xCUDA follows neither instantiations nor launches, so the node is charged when
 * it is created and stays charged for the life of the process: that can only over-charge. Refunding when the graph
 * is destroyed would let a program instantiate, destroy the graph and go on launching the instantiation, whose
 * allocation no longer counts. The parameters are copied before they are read and the driver gets the copy: the
 * program's own threads could change the size between xCUDA's check and the driver's read. */
CUresult xc_w_cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                     size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
    if (nodeParams == NULL)
        return xc_real_cuGraphAddMemAllocNode(phGraphNode, hGraph, dependencies, numDependencies, NULL);
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    memcpy(&p, nodeParams, sizeof p);
    if (!charge(p.bytesize))
        return refuse("cuGraphAddMemAllocNode", p.bytesize);
    CUresult r = xc_real_cuGraphAddMemAllocNode(phGraphNode, hGraph, dependencies, numDependencies, &p);
    if (r != CUDA_SUCCESS)
        refund(p.bytesize);
    else
        nodeParams->dptr = p.dptr;
    return r;
}
XC_EXPORT(cuGraphAddMemAllocNode)

/* The generic form: charged like the above when the node is an allocation. Every node type goes to the driver as
 * a copy (a type read once, so a thread of the program cannot turn it into an allocation after the check), and
 * what the driver wrote into the copy is handed back. */
#define ADD_NODE(name, nodeParams, call)                                                  \
    do {                                                                                  \
        if ((nodeParams) == NULL) {                                                       \
            CUgraphNodeParams *const p_ = NULL;                                           \
            return call;                                                                  \
        }                                                                                 \
        CUgraphNodeParams c_;                                                             \
        memcpy(&c_, (nodeParams), sizeof c_);                                             \
        CUgraphNodeParams *const p_ = &c_;                                                \
        uint64_t b_ = c_.type == CU_GRAPH_NODE_TYPE_MEM_ALLOC ? c_.alloc.bytesize : 0;    \
        if (b_ > 0 && !charge(b_))                                                        \
            return refuse(#name, b_);                                                     \
        CUresult r_ = call;                                                               \
        if (r_ != CUDA_SUCCESS)                                                           \
            refund(b_);                                                                   \
        memcpy((nodeParams), &c_, sizeof c_);                                             \
        return r_;                                                                        \
    } while (0)

CUresult xc_w_cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                             size_t numDependencies, CUgraphNodeParams *nodeParams)
{
    ADD_NODE(cuGraphAddNode, nodeParams,
             xc_real_cuGraphAddNode(phGraphNode, hGraph, dependencies, numDependencies, p_));
}
XC_EXPORT(cuGraphAddNode)

CUresult xc_w_cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                CUgraphNodeParams *nodeParams)
{
    ADD_NODE(cuGraphAddNode_v2, nodeParams,
             xc_real_cuGraphAddNode_v2(phGraphNode, hGraph, dependencies, dependencyData, numDependencies, p_));
}
XC_EXPORT(cuGraphAddNode_v2)

/* -- releases -------------------------------------------------------------- */

CUresult xc_w_cuMemFree(CUdeviceptr_v1 dptr)
{
    uint64_t b = 0;
    int had = untrack(&t_ptr, dptr, &b);
    return released(xc_real_cuMemFree(dptr), &t_ptr, dptr, had, b);
}
XC_EXPORT(cuMemFree)

CUresult xc_w_cuMemFree_v2(CUdeviceptr dptr)
{
    uint64_t b = 0;
    int had = untrack(&t_ptr, dptr, &b);
    return released(xc_real_cuMemFree_v2(dptr), &t_ptr, dptr, had, b);
}
XC_EXPORT(cuMemFree_v2)

/* The memory returns to the pool when the stream reaches the free; the budget
 * comes back a little earlier, when the free is queued. */
CUresult xc_w_cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    uint64_t b = 0;
    int had = untrack(&t_ptr, dptr, &b);
    return released(xc_real_cuMemFreeAsync(dptr, hStream), &t_ptr, dptr, had, b);
}
XC_EXPORT(cuMemFreeAsync)

CUresult xc_w_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    uint64_t b = 0;
    int had = untrack(&t_ptr, dptr, &b);
    return released(xc_real_cuMemFreeAsync_ptsz(dptr, hStream), &t_ptr, dptr, had, b);
}
XC_EXPORT(cuMemFreeAsync_ptsz)

CUresult xc_w_cuMemRelease(CUmemGenericAllocationHandle handle)
{
    uint64_t b = 0;
    int had = untrack(&t_handle, handle, &b);
    return released(xc_real_cuMemRelease(handle), &t_handle, handle, had, b);
}
XC_EXPORT(cuMemRelease)

CUresult xc_w_cuArrayDestroy(CUarray hArray)
{
    uint64_t b = 0, key = (uint64_t)(uintptr_t)hArray;
    int had = untrack(&t_array, key, &b);
    return released(xc_real_cuArrayDestroy(hArray), &t_array, key, had, b);
}
XC_EXPORT(cuArrayDestroy)

CUresult xc_w_cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    uint64_t b = 0, key = (uint64_t)(uintptr_t)hMipmappedArray;
    int had = untrack(&t_array, key, &b);
    return released(xc_real_cuMipmappedArrayDestroy(hMipmappedArray), &t_array, key, had, b);
}
XC_EXPORT(cuMipmappedArrayDestroy)

/* -- what the program is told ---------------------------------------------- */

/* free/total as the offline job should see them: the quota is its device. */
static void as_quota(uint64_t *free_b, uint64_t *total_b)
{
    uint64_t q = resolve_from_total(*total_b);
    if (q == UNLIMITED || q == UNRESOLVED)
        return;
    uint64_t u = atomic_load_explicit(&used, memory_order_relaxed);
    uint64_t left = u >= q ? 0 : q - u;
    if (q < *total_b)
        *total_b = q;
    if (left < *free_b)
        *free_b = left;
}

CUresult xc_w_cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    CUresult r = xc_real_cuMemGetInfo_v2(free_b, total_b);
    if (r != CUDA_SUCCESS || free_b == NULL || total_b == NULL)
        return r;
    uint64_t f = *free_b, t = *total_b;
    as_quota(&f, &t);
    *free_b = (size_t)f;
    *total_b = (size_t)t;
    return r;
}
XC_EXPORT(cuMemGetInfo_v2)

/* The 32-bit entry points saturate on any modern GPU; the quota still caps them. */
static void as_quota_u32(unsigned int *free_b, unsigned int *total_b)
{
    uint64_t q = quota();
    if (q == UNLIMITED || q == UNRESOLVED)
        return;
    uint64_t u = atomic_load_explicit(&used, memory_order_relaxed);
    uint64_t left = u >= q ? 0 : q - u;
    if (total_b != NULL && q < *total_b)
        *total_b = (unsigned int)q;
    if (free_b != NULL && left < *free_b)
        *free_b = (unsigned int)left;
}

CUresult xc_w_cuMemGetInfo(unsigned int *free_b, unsigned int *total_b)
{
    CUresult r = xc_real_cuMemGetInfo(free_b, total_b);
    if (r == CUDA_SUCCESS)
        as_quota_u32(free_b, total_b);
    return r;
}
XC_EXPORT(cuMemGetInfo)

CUresult xc_w_cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CUresult r = xc_real_cuDeviceTotalMem_v2(bytes, dev);
    if (r != CUDA_SUCCESS || bytes == NULL)
        return r;
    uint64_t q = resolve_from_total(*bytes);
    if (q != UNLIMITED && q != UNRESOLVED && q < *bytes)
        *bytes = (size_t)q;
    return r;
}
XC_EXPORT(cuDeviceTotalMem_v2)

CUresult xc_w_cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    CUresult r = xc_real_cuDeviceTotalMem(bytes, dev);
    if (r == CUDA_SUCCESS)
        as_quota_u32(NULL, bytes);
    return r;
}
XC_EXPORT(cuDeviceTotalMem)
