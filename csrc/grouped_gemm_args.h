// Argument checks shared by every grouped-GEMM and group-sizes handler, CPU and CUDA alike,
// so that both platforms reject the same inputs with the same messages.
#pragma once

#include <cstdint>
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

ffi::Error CheckGroupCount(int64_t groups);

ffi::ErrorOr<GroupedGemmShape> CheckGroupedGemm(const ffi::AnyBuffer& lhs, const ffi::AnyBuffer& rhs,
                                                const ffi::AnyBuffer& group_sizes,
                                                const ffi::AnyBuffer& out, bool ragged_k,
                                                bool transpose_rhs);

// Appends the grouped GEMM's operands (lhs, rhs, group sizes) and result to a binding, so that
// every platform's handler takes the same signature. Handlers then add their extra results and
// BindGemmForm's attributes.
template <typename Binding>
auto BindGroupedGemm(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>();
}

// The attributes that say which grouped GEMM form to run.
template <typename Binding>
auto BindGemmForm(Binding binding) {
  return std::move(binding).template Attr<bool>("ragged_k").template Attr<bool>("transpose_rhs");
}

// Checks host-side group sizes against the ragged dimension: no negative size, sum <= rows.
ffi::Error CheckGroupSizeValues(const int32_t* sizes, int64_t groups, int64_t rows);

// Row offset of each group, plus the total as the last entry.
std::vector<int64_t> GroupOffsets(const int32_t* sizes, int64_t groups);

// Device mode's reading of unchecked sizes (the CUDA kernels do the same, group_layout.cuh):
// a negative size counts as 0 and no group runs past `rows`.
std::vector<int64_t> ClampedGroupOffsets(const int32_t* sizes, int64_t groups, int64_t rows);

}  // namespace te_async
