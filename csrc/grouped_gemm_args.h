// Argument checks shared by every grouped-GEMM and group-sizes handler, CPU and CUDA alike,
// so that both platforms reject the same inputs with the same messages.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace te_async {

namespace ffi = xla::ffi;

// Largest group count a pinned host slot holds. The Python wrappers check it too, before lowering.
inline constexpr int64_t kMaxGroups = 1024;

// The static shape of one grouped GEMM, read off its buffers.
//   ragged "m": lhs [M,K] @ rhs[g] ([G,K,N], or [G,N,K] transposed) -> out [M,N]
//   ragged "k": lhs[rows_g].T @ rhs[rows_g] with lhs [M,K], rhs [M,N]  -> out [G,K,N]
struct GroupedGemmShape {
  int64_t groups = 0;
  int64_t rows = 0;  // M: the ragged dimension, split by group_sizes
  int64_t k = 0;
  int64_t n = 0;
  bool ragged_k = false;
  bool transpose_rhs = false;
  ffi::DataType in_type = ffi::DataType::INVALID;
  ffi::DataType out_type = ffi::DataType::INVALID;
};

// A buffer's dimensions as "[d0,d1,...]", for error messages.
std::string Dims(const ffi::AnyBuffer& b);
std::string Dims(ffi::Span<const int64_t> dims);

// 1..kMaxGroups groups, with a message for each way to miss (every handler's entry check).
ffi::Error CheckGroupCount(int64_t groups);

ffi::ErrorOr<GroupedGemmShape> CheckGroupedGemm(const ffi::AnyBuffer& lhs, const ffi::AnyBuffer& rhs,
                                                const ffi::AnyBuffer& group_sizes,
                                                const ffi::AnyBuffer& out, bool ragged_k,
                                                bool transpose_rhs);

// The two grouped-GEMM signatures, shared by every platform's handlers:
//   host-sized: (lhs, rhs, group_sizes) -> (out, repair flag int32[1]); attrs ragged_k,
//     transpose_rhs, async_host_sizes. The flag is device scratch for the CUDA handler's check of
//     a pinned read (host_sizes_guard.h).
//   device:     (lhs, rhs, group_sizes) -> (out, workspace uint8[]); attrs ragged_k, transpose_rhs,
//     kernel and cutlass_config: the plan made at trace time (te_async/plan.py).
// A handler binding adds its context (stream, device) before calling these.
template <typename Binding>
auto BindGroupedGemmOperands(Binding&& binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attr<bool>("ragged_k")
      .template Attr<bool>("transpose_rhs");
}

template <typename Binding>
auto BindHostSizedGemm(Binding&& binding) {
  return BindGroupedGemmOperands(std::move(binding)).template Attr<bool>("async_host_sizes");
}

template <typename Binding>
auto BindDeviceGemm(Binding&& binding) {
  return BindGroupedGemmOperands(std::move(binding))
      .template Attr<std::string_view>("kernel")
      .template Attr<std::string_view>("cutlass_config");
}

// Checks host-side group sizes against the ragged dimension: no negative size, sum <= rows.
ffi::Error CheckGroupSizeValues(const int32_t* sizes, int64_t groups, int64_t rows);

// Row offset of each group, plus the total as the last entry.
std::vector<int64_t> GroupOffsets(const int32_t* sizes, int64_t groups);

}  // namespace te_async
