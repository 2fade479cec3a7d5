#include "grouped_gemm_args.h"

#include <string>

namespace te_async {
namespace {

bool IsGemmType(ffi::DataType t) {
  return t == ffi::DataType::BF16 || t == ffi::DataType::F16 || t == ffi::DataType::F32;
}

}  // namespace

std::string Dims(const ffi::AnyBuffer& b) { return Dims(b.dimensions()); }

std::string Dims(ffi::Span<const int64_t> d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
  return s + "]";
}

ffi::Error CheckGroupCount(int64_t groups) {
  if (groups < 1) {
    return ffi::Error::InvalidArgument("te_async: group_sizes has 0 groups; a grouped GEMM needs at least 1");
  }
  if (groups > kMaxGroups) {
    return ffi::Error::InvalidArgument("te_async: too many groups: " + std::to_string(groups) + " (at most " +
                                       std::to_string(kMaxGroups) + ")");
  }
  return ffi::Error::Success();
}

ffi::ErrorOr<GroupedGemmShape> CheckGroupedGemm(const ffi::AnyBuffer& lhs, const ffi::AnyBuffer& rhs,
                                                const ffi::AnyBuffer& group_sizes,
                                                const ffi::AnyBuffer& out, bool ragged_k,
                                                bool transpose_rhs) {
  auto bad = [&](const std::string& what) {
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "te_async grouped_gemm: " + what + " (lhs " + Dims(lhs) + ", rhs " + Dims(rhs) +
        ", group_sizes " + Dims(group_sizes) + ", out " + Dims(out) + ")"));
  };
  if (group_sizes.element_type() != ffi::DataType::S32 || group_sizes.dimensions().size() != 1) {
    return bad("group_sizes must be int32 [G]");
  }
  GroupedGemmShape s;
  s.groups = group_sizes.dimensions()[0];
  if (ffi::Error e = CheckGroupCount(s.groups); e.failure()) return ffi::Unexpected(e);
  s.ragged_k = ragged_k;
  s.transpose_rhs = transpose_rhs;
  s.in_type = lhs.element_type();
  s.out_type = out.element_type();
  if (!IsGemmType(s.in_type) || rhs.element_type() != s.in_type) {
    return bad("lhs and rhs must share one dtype of bf16, f16, f32");
  }
  if (s.out_type != s.in_type && s.out_type != ffi::DataType::F32) {
    return bad("out dtype must be the input dtype or f32");
  }
  if (lhs.dimensions().size() != 2) return bad("lhs must be 2-D");
  s.rows = lhs.dimensions()[0];
  s.k = lhs.dimensions()[1];
  auto rd = rhs.dimensions();
  auto od = out.dimensions();
  if (!ragged_k) {
    if (rd.size() != 3 || rd[0] != s.groups) return bad("rhs must be [G,K,N] or [G,N,K]");
    const int64_t rhs_k = transpose_rhs ? rd[2] : rd[1];
    s.n = transpose_rhs ? rd[1] : rd[2];
    if (rhs_k != s.k) return bad("contracting dimensions differ");
    if (od.size() != 2 || od[0] != s.rows || od[1] != s.n) return bad("out must be [M,N]");
  } else {
    if (transpose_rhs) return bad("transpose_rhs applies to ragged m only");
    if (rd.size() != 2 || rd[0] != s.rows) return bad("rhs must be [M,N] for ragged k");
    s.n = rd[1];
    if (od.size() != 3 || od[0] != s.groups || od[1] != s.k || od[2] != s.n) {
      return bad("out must be [G,K,N] for ragged k");
    }
  }
  return s;
}

ffi::Error CheckGroupSizeValues(const int32_t* sizes, int64_t groups, int64_t rows) {
  int64_t total = 0;
  for (int64_t g = 0; g < groups; ++g) {
    if (sizes[g] < 0) {
      return ffi::Error::InvalidArgument("te_async: negative group size " + std::to_string(sizes[g]) +
                                         " for group " + std::to_string(g));
    }
    total += sizes[g];
  }
  if (total > rows) {
    return ffi::Error::InvalidArgument("te_async: sum(group_sizes) = " + std::to_string(total) +
                                       " exceeds the " + std::to_string(rows) + " rows of the input");
  }
  return ffi::Error::Success();
}

std::vector<int64_t> GroupOffsets(const int32_t* sizes, int64_t groups) {
  std::vector<int64_t> offsets(groups + 1, 0);
  for (int64_t g = 0; g < groups; ++g) offsets[g + 1] = offsets[g] + sizes[g];
  return offsets;
}

}  // namespace te_async
