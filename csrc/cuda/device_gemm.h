// Device-sized grouped GEMM: the contract between the FFI handler (grouped_gemm_device.cc) and
// the kernels. Every kernel reads group_sizes on the GPU, so a call needs no host copy, no host
// wait and no allocation, and can be captured into a CUDA graph.
//
// Group layout (all kernels, see group_layout.cuh): a negative size counts as 0, and a group that
// would run past row M is cut at M. Ragged m: rows past the last group are written as 0.
// Ragged k: a group with no rows gets out[g] = 0. Every element of `out` is written.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "device_kernel_choice.h"
#include "grouped_gemm_args.h"

namespace te_async {

struct DeviceGemm {
  GroupedGemmShape s;
  const void* lhs = nullptr;
  const void* rhs = nullptr;
  const int32_t* group_sizes = nullptr;  // [G], device memory
  void* out = nullptr;
  void* workspace = nullptr;  // DeviceWorkspaceBytes(...) bytes, 256-byte aligned, device memory
  size_t workspace_bytes = 0;
  int sm_count = 0;
};

// Each launcher enqueues on `stream` only (kernels, cudaMemsetAsync), checks every CUDA return
// code and the launch error, and returns an FFI error naming the failure.
xla::ffi::Error LaunchSmallGroups(const DeviceGemm& g, cudaStream_t stream);  // small_group_gemm.cu
xla::ffi::Error LaunchPortable(const DeviceGemm& g, cudaStream_t stream);     // portable_grouped_gemm.cu

// CUTLASS sm90a ptr-array grouped GEMM (cutlass_grouped_gemm*.cu), built when the CUTLASS headers
// are found (TE_ASYNC_HAVE_CUTLASS). Supports() says whether a shape/dtype has an instantiation.
bool CutlassSm90Supports(const GroupedGemmShape& s);
size_t CutlassSm90WorkspaceBytes(const GroupedGemmShape& s, int sm_count);
xla::ffi::Error LaunchCutlassSm90(const DeviceGemm& g, cudaStream_t stream);

// Whether the CUTLASS kernels were compiled in (CMake defines TE_ASYNC_HAVE_CUTLASS).
constexpr bool CutlassBuilt() {
#ifdef TE_ASYNC_HAVE_CUTLASS
  return true;
#else
  return false;
#endif
}

// Workspace a device-mode call needs; the Python wrapper allocates it as an extra result.
size_t DeviceWorkspaceBytes(const GroupedGemmShape& s, DeviceKernel kernel, int sm_count);

struct DeviceInfo {
  int compute_capability = 0;  // major * 10 + minor
  int sm_count = 0;
};

// What a device-mode call of shape `s` runs on `device`: the one plan both the handler and the
// trace-time workspace sizing (module.cc, device_plan) use.
struct DevicePlan {
  DeviceInfo info;
  DeviceKernel kernel = DeviceKernel::kPortable;
  size_t workspace_bytes = 0;
};
xla::ffi::Error PlanDeviceGemm(const GroupedGemmShape& s, int device, DevicePlan* plan);

}  // namespace te_async
