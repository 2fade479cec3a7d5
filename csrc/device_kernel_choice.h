// Which device-mode kernel runs a grouped GEMM, chosen from static shapes only. The rule runs once,
// at trace time (te_async/plan.py, through the CUDA module's plan_device_gemm); the handler is
// told the choice and only checks that it fits. Exported by the CPU module too, for tests.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "grouped_gemm_args.h"

namespace te_async {

enum class DeviceKernel {
  kSmallGroups,  // decode: reads each active expert's weights once, bandwidth-bound
  kCutlassSm90,  // prefill / training: CUTLASS ptr-array TMA warp-specialized, sm_90a
  kPortable,     // everything else: tiled SIMT kernel, any GPU, any dtype
};

// Up to this many ragged rows (tokens x top-k) the weights, not the math, set the time. The
// default of TE_ASYNC_SMALL_GROUPS_MAX_ROWS, which Python reads and passes in.
inline constexpr int64_t kSmallGroupsMaxRows = 512;
// The tensor-core dense GEMM of a few rows (cuda/dense_mma.cu, for te_async.dense.linear) takes
// up to this many rows: one mma's 16 rows.
inline constexpr int64_t kDenseMmaMaxRows = 16;
// Where the CUTLASS kernel can run, small_groups keeps only shapes of at most this many rows per
// group on average: its FP32 FMAs grow with the rows an expert gets, the tensor-core kernel's time
// does not. On an H200 the two tied at 1.5-2 rows per group (DeepSeek-V2-Lite T=16, Mixtral T=8);
// small_groups won below (46 vs 66 us at T=1), CUTLASS above (309 vs 468 us per layer at DeepSeek
// T=64, 6 rows per group; 3.1 vs 9.3 ms a step at Mixtral T=64, 16 rows).
inline constexpr int64_t kSmallGroupsMaxRowsPerGroup = 2;

// Shapes that the CUTLASS instantiations cover: 16-bit inputs, output in the input dtype, and the
// 16-byte alignment TMA needs on every group's rows (K and N multiples of 8).
bool CutlassShapeEligible(const GroupedGemmShape& s);

// compute_capability is major * 10 + minor; cutlass_built says whether the CUTLASS kernels were
// compiled into the CUDA extension.
//   ragged m, M <= small_groups_max_rows and, where CUTLASS can run,
//     M <= kSmallGroupsMaxRowsPerGroup * G             -> kSmallGroups
//   sm_90, CUTLASS built, CutlassShapeEligible(s)      -> kCutlassSm90
//   otherwise                                          -> kPortable
DeviceKernel ChooseDeviceKernel(const GroupedGemmShape& s, int compute_capability, bool cutlass_built,
                                int64_t small_groups_max_rows);

const char* DeviceKernelName(DeviceKernel k);
std::optional<DeviceKernel> DeviceKernelFromName(std::string_view name);

// A shape described the way Python knows it at trace time (dtype names as numpy spells them:
// "bfloat16", "float16", "float32"); an unknown name gives DataType::INVALID.
GroupedGemmShape ShapeFromStatic(int64_t groups, int64_t rows, int64_t k, int64_t n, bool ragged_k,
                                 bool transpose_rhs, const std::string& in_dtype, const std::string& out_dtype);

}  // namespace te_async
