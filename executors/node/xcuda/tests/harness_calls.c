/*
 * One call per interposed entry point, with harmless arguments, through a
 * given function pointer. A missing call_<name> is a compile error, so the
 * harness cannot fall behind hooks.def.
 */
#include "harness.h"

#define CALL(name, ...) ((pfn_##name)fn)(__VA_ARGS__)

static CUDA_ARRAY_DESCRIPTOR_v1 desc_v1 = {64, 64, CU_AD_FORMAT_FLOAT, 1};
static CUDA_ARRAY_DESCRIPTOR desc_v2 = {64, 64, CU_AD_FORMAT_FLOAT, 1};
static CUDA_ARRAY3D_DESCRIPTOR_v1 desc3_v1 = {16, 16, 16, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0};
static CUDA_ARRAY3D_DESCRIPTOR desc3_v2 = {16, 16, 16, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0};

static void call_cuInit(void *fn) { CALL(cuInit, 0); }
static void call_cuGetProcAddress(void *fn)
{
    void *p = NULL;
    CALL(cuGetProcAddress, "cuDriverGetVersion", &p, 12000, 0);
}
static void call_cuGetProcAddress_v2(void *fn)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    CALL(cuGetProcAddress_v2, "cuDriverGetVersion", &p, 12000, 0, &st);
}
static void call_cuMemAlloc(void *fn) { CUdeviceptr_v1 p = 0; CALL(cuMemAlloc, &p, 4096); }
static void call_cuMemAlloc_v2(void *fn) { CUdeviceptr p = 0; CALL(cuMemAlloc_v2, &p, 4096); }
static void call_cuMemAllocPitch(void *fn)
{
    CUdeviceptr_v1 p = 0;
    unsigned int pitch = 0;
    CALL(cuMemAllocPitch, &p, &pitch, 100, 10, 4);
}
static void call_cuMemAllocPitch_v2(void *fn)
{
    CUdeviceptr p = 0;
    size_t pitch = 0;
    CALL(cuMemAllocPitch_v2, &p, &pitch, 100, 10, 4);
}
static void call_cuMemAllocManaged(void *fn) { CUdeviceptr p = 0; CALL(cuMemAllocManaged, &p, 4096, 1); }
static void call_cuMemAllocAsync(void *fn) { CUdeviceptr p = 0; CALL(cuMemAllocAsync, &p, 4096, NULL); }
static void call_cuMemAllocAsync_ptsz(void *fn) { CUdeviceptr p = 0; CALL(cuMemAllocAsync_ptsz, &p, 4096, NULL); }
static void call_cuMemAllocFromPoolAsync(void *fn)
{
    CUdeviceptr p = 0;
    CALL(cuMemAllocFromPoolAsync, &p, 4096, NULL, NULL);
}
static void call_cuMemAllocFromPoolAsync_ptsz(void *fn)
{
    CUdeviceptr p = 0;
    CALL(cuMemAllocFromPoolAsync_ptsz, &p, 4096, NULL, NULL);
}
static void call_cuMemCreate(void *fn)
{
    CUmemGenericAllocationHandle h = 0;
    CALL(cuMemCreate, &h, 1 << 21, NULL, 0);
}
static void call_cuArrayCreate(void *fn) { CUarray a = NULL; CALL(cuArrayCreate, &a, &desc_v1); }
static void call_cuArrayCreate_v2(void *fn) { CUarray a = NULL; CALL(cuArrayCreate_v2, &a, &desc_v2); }
static void call_cuArray3DCreate(void *fn) { CUarray a = NULL; CALL(cuArray3DCreate, &a, &desc3_v1); }
static void call_cuArray3DCreate_v2(void *fn) { CUarray a = NULL; CALL(cuArray3DCreate_v2, &a, &desc3_v2); }
static void call_cuMipmappedArrayCreate(void *fn)
{
    CUmipmappedArray a = NULL;
    CALL(cuMipmappedArrayCreate, &a, &desc3_v2, 3);
}
static void call_cuGraphAddMemAllocNode(void *fn)
{
    CUgraphNode n = NULL;
    CUDA_MEM_ALLOC_NODE_PARAMS p = {.bytesize = 4096};
    CALL(cuGraphAddMemAllocNode, &n, (CUgraph)(uintptr_t)0x10, NULL, 0, &p);
}
static void call_cuGraphAddNode(void *fn)
{
    CUgraphNode n = NULL;
    CUgraphNodeParams p = {.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC, .alloc = {.bytesize = 4096}};
    CALL(cuGraphAddNode, &n, (CUgraph)(uintptr_t)0x10, NULL, 0, &p);
}
static void call_cuGraphAddNode_v2(void *fn)
{
    CUgraphNode n = NULL;
    CUgraphNodeParams p = {.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC, .alloc = {.bytesize = 4096}};
    CALL(cuGraphAddNode_v2, &n, (CUgraph)(uintptr_t)0x10, NULL, NULL, 0, &p);
}
/* Frees of pointers nobody allocated: the driver says no, the call still counts. */
static void call_cuMemFree(void *fn) { CALL(cuMemFree, 0x10); }
static void call_cuMemFree_v2(void *fn) { CALL(cuMemFree_v2, 0x10); }
static void call_cuMemFreeAsync(void *fn) { CALL(cuMemFreeAsync, 0x10, NULL); }
static void call_cuMemFreeAsync_ptsz(void *fn) { CALL(cuMemFreeAsync_ptsz, 0x10, NULL); }
static void call_cuMemRelease(void *fn) { CALL(cuMemRelease, 0x10); }
static void call_cuArrayDestroy(void *fn) { CALL(cuArrayDestroy, (CUarray)(uintptr_t)0x10); }
static void call_cuMipmappedArrayDestroy(void *fn) { CALL(cuMipmappedArrayDestroy, (CUmipmappedArray)(uintptr_t)0x10); }
static void call_cuMemGetInfo(void *fn) { unsigned int f, t; CALL(cuMemGetInfo, &f, &t); }
static void call_cuMemGetInfo_v2(void *fn) { size_t f, t; CALL(cuMemGetInfo_v2, &f, &t); }
static void call_cuDeviceTotalMem(void *fn) { unsigned int b; CALL(cuDeviceTotalMem, &b, 0); }
static void call_cuDeviceTotalMem_v2(void *fn) { size_t b; CALL(cuDeviceTotalMem_v2, &b, 0); }
static void call_cuLaunchKernel(void *fn) { CALL(cuLaunchKernel, NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL); }
static void call_cuLaunchKernel_ptsz(void *fn)
{
    CALL(cuLaunchKernel_ptsz, NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
}
static void call_cuLaunchKernelEx(void *fn) { CALL(cuLaunchKernelEx, NULL, NULL, NULL, NULL); }
static void call_cuLaunchKernelEx_ptsz(void *fn) { CALL(cuLaunchKernelEx_ptsz, NULL, NULL, NULL, NULL); }
static void call_cuLaunchCooperativeKernel(void *fn)
{
    CALL(cuLaunchCooperativeKernel, NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL);
}
static void call_cuLaunchCooperativeKernel_ptsz(void *fn)
{
    CALL(cuLaunchCooperativeKernel_ptsz, NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL);
}
static void call_cuLaunchCooperativeKernelMultiDevice(void *fn)
{
    CALL(cuLaunchCooperativeKernelMultiDevice, NULL, 1, 0);
}
static void call_cuGraphLaunch(void *fn) { CALL(cuGraphLaunch, NULL, NULL); }
static void call_cuGraphLaunch_ptsz(void *fn) { CALL(cuGraphLaunch_ptsz, NULL, NULL); }
static void call_cuLaunch(void *fn) { CALL(cuLaunch, NULL); }
static void call_cuLaunchGrid(void *fn) { CALL(cuLaunchGrid, NULL, 1, 1); }
static void call_cuLaunchGridAsync(void *fn) { CALL(cuLaunchGridAsync, NULL, 1, 1, NULL); }
static void call_cuCtxCreate_v2(void *fn) { CUcontext c; CALL(cuCtxCreate_v2, &c, 0, 0); }
static void call_cuCtxCreate_v3(void *fn) { CUcontext c; CALL(cuCtxCreate_v3, &c, NULL, 0, 0, 0); }
static void call_cuCtxCreate_v4(void *fn) { CUcontext c; CALL(cuCtxCreate_v4, &c, NULL, 0, 0); }
static void call_cuCtxDestroy_v2(void *fn) { CALL(cuCtxDestroy_v2, (CUcontext)(uintptr_t)0x10); }

const harness_caller harness_callers[TID_COUNT] = {
#define XCUDA_HOOK(name, proc, ver, ptds, params, args) [TID_##name] = call_##name,
#define XCUDA_LAUNCH(name, proc, ver, ptds, cost, params, args) [TID_##name] = call_##name,
#define XCUDA_REAL(name, proc, ver, ptds, params, args) [TID_##name] = NULL,
#include "../src/hooks.def"
#undef XCUDA_HOOK
#undef XCUDA_LAUNCH
#undef XCUDA_REAL
};

/* Addresses as a directly linked program sees them (bound at load time). */
void *const harness_direct[TID_COUNT] = {
#define XCUDA_HOOK(name, proc, ver, ptds, params, args) [TID_##name] = (void *)name,
#define XCUDA_LAUNCH(name, proc, ver, ptds, cost, params, args) [TID_##name] = (void *)name,
#define XCUDA_REAL(name, proc, ver, ptds, params, args) [TID_##name] = (void *)name,
#include "../src/hooks.def"
#undef XCUDA_HOOK
#undef XCUDA_LAUNCH
#undef XCUDA_REAL
};
