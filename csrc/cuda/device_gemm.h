// Device-sized grouped GEMM: the contract between the FFI handlers and the kernels. Every kernel
// reads group_sizes on the GPU, so a call needs no host copy, no host wait and no allocation, and
// can be captured into a CUDA graph.
//
// Group layout (all kernels, see group_layout.cuh): a negative size counts as 0, and a group that
// would run past row M is cut at M; such a call is counted in DeviceCounters::clamped_calls.
// Ragged m: rows past the last group are written as 0. Ragged k: a group with no rows gets
// out[g] = 0. Every element of `out` is written.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "device_kernel_choice.h"
#include "grouped_gemm_args.h"

namespace te_async {

struct DeviceGemm {
  GroupedGemmShape s;
  const void* lhs = nullptr;
  const void* rhs = nullptr;
  const int32_t* group_sizes = nullptr;  // [G], device memory; small_groups only: nullptr = one group of all rows
  //                                        (a dense GEMM, dense_gemm.cc; G must be 1)
  void* out = nullptr;
  void* workspace = nullptr;  // the plan's workspace_bytes, 256-byte aligned, device memory
  size_t workspace_bytes = 0;
  int sm_count = 0;
  int compute_capability = 0;  // major * 10 + minor
  unsigned long long* clamped_calls = nullptr;  // DeviceCounters::clamped_calls of this device
  // Portable kernel only: when set, the kernel runs only if *run_if != 0 (the host-sized path's
  // repair of a stale pinned read, host_sizes_guard.h), else every block exits at once.
  const int* run_if = nullptr;
};

// Host-side tile and block counts.
constexpr int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Each launcher enqueues on `stream` only (kernels, cudaMemsetAsync), checks every CUDA return
// code and the launch error, and returns an FFI error naming the failure. The handler has checked
// the shape (CheckGroupedGemm) and the plan before.
// What small_groups fuses ([G,K,N] rhs only). The decode MoE block (expert_gemm.cc; K never split):
// the routing kernel's choice_of_row (moe_routing.cu) says where each sorted row comes from and
// goes to, so that no permutation is materialised, and fc2 applies fc1's activation as it loads.
// A dense MLP's second GEMM (dense_gemm.cc): the swiglu prologue alone.
inline constexpr int64_t kSmallGroupsFusedMaxRows = 512;  // M of a fused call: its row table is in shared memory
struct SmallGroupsFusion {
  const int32_t* choice_of_row = nullptr;  // [M], a permutation of [0, M); nullptr: no fusion
  const float* choice_weights = nullptr;   // [M]: the routing weights [T, k], flat
  int gather_div = 0;    // > 0: lhs has M / gather_div rows; row r reads lhs row choice_of_row[r] / gather_div
  bool scatter = false;  // row r is written to out row choice_of_row[r], times choice_weights[choice_of_row[r]]
  bool swiglu = false;   // lhs is [rows, 2K]: the GEMM reads silu(lhs[:, :K]) * lhs[:, K:], rounded to lhs's dtype
  //                        (with choice_of_row: float32 output only)
  bool on() const { return choice_of_row != nullptr || swiglu; }
};
xla::ffi::Error LaunchSmallGroups(const DeviceGemm& g, cudaStream_t stream,
                                  const SmallGroupsFusion& fusion = {});  // small_group_gemm.cu
// How small_groups splits K for a shape on a GPU (small_group_gemm.cu says why): at most max_slices
// slices of slice_k k-rows, added by the thread-block cluster of an item's slices (compute
// capability 9.0 and up; no workspace). The launch may take fewer, where the clusters of so many
// slices would not all be resident at once.
struct SmallGroupsSplitK {
  int slices = 1;
  int slice_k = 0;
};
SmallGroupsSplitK PlanSmallGroupsSplitK(const GroupedGemmShape& s, int compute_capability, int sm_count,
                                        int max_slices = 8);
// The tensor-core dense GEMM of 1 to kDenseMmaMaxRows rows (dense_mma.cu, for dense_gemm.cc):
// DenseMmaFits says whether a shape fits it (bf16 or f16 inputs, output that dtype or f32, one
// group, rhs [K, N] with K a multiple of 16 and N of 8). Where lhs or rhs is not 16-byte aligned
// the launch runs small_groups instead.
bool DenseMmaFits(const GroupedGemmShape& s);
xla::ffi::Error LaunchDenseMma(const DeviceGemm& g, bool swiglu, cudaStream_t stream);
xla::ffi::Error LaunchPortable(const DeviceGemm& g, cudaStream_t stream);     // portable_grouped_gemm.cu
// CUTLASS sm90a ptr-array grouped GEMM (cutlass_grouped_gemm*.cu) with the named config, built
// when the CUTLASS headers are found (TE_ASYNC_HAVE_CUTLASS).
xla::ffi::Error LaunchCutlassSm90(const DeviceGemm& g, std::string_view config, cudaStream_t stream);

// Whether the CUTLASS kernels were compiled in (CMake defines TE_ASYNC_HAVE_CUTLASS).
constexpr bool CutlassBuilt() {
#ifdef TE_ASYNC_HAVE_CUTLASS
  return true;
#else
  return false;
#endif
}

struct DeviceInfo {
  int compute_capability = 0;  // major * 10 + minor
  int sm_count = 0;
};
xla::ffi::ErrorOr<DeviceInfo> QueryDevice(int device);
// QueryDevice of the calling thread's current device, for handlers that do not bind XLA's device ordinal.
xla::ffi::ErrorOr<DeviceInfo> QueryCurrentDevice();

// The DeviceGemm of a handler's buffers on a device (no workspace; the caller adds one). group_sizes
// is device memory, or nullptr for a dense GEMM (small_groups only).
DeviceGemm DeviceGemmOf(const GroupedGemmShape& s, xla::ffi::AnyBuffer lhs, xla::ffi::AnyBuffer rhs,
                        const int32_t* group_sizes, void* out, const DeviceInfo& info,
                        unsigned long long* clamped_calls);

// What Python reads from the environment and passes to the planner (te_async/plan.py validates it).
struct PlanSettings {
  int64_t small_groups_max_rows = kSmallGroupsMaxRows;
  std::string_view cutlass_config;  // "" or a config name (TE_ASYNC_CUTLASS_CONFIG)
};

// What a device-mode call of shape `s` runs on a device like `info`: made once, at trace time
// (module.cc's plan_device_gemm); the kernel and config travel to the handler as FFI attributes
// and the workspace as an extra result, so the handler allocates nothing and decides nothing.
struct DevicePlan {
  DeviceKernel kernel = DeviceKernel::kPortable;
  std::string cutlass_config;  // the CUTLASS config name, "" for the other kernels
  size_t workspace_bytes = 0;
};
xla::ffi::ErrorOr<DevicePlan> PlanDeviceGemm(const GroupedGemmShape& s, const DeviceInfo& info,
                                             const PlanSettings& settings);

// The handler's check that a plan fits the call and the device it runs on: the kernel can run the
// shape there, and the workspace is large enough.
xla::ffi::Error CheckPlanFits(const GroupedGemmShape& s, const DeviceInfo& info, DeviceKernel kernel,
                              std::string_view cutlass_config, size_t workspace_bytes);

}  // namespace te_async
