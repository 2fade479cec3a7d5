// Grouped GEMM on the CPU: correct rather than fast. It widens the inputs to float, accumulates
// in double and rounds once, so it doubles as a reference for the CUDA paths in CI.
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "cpu/handlers.h"
#include "grouped_gemm_args.h"

namespace te_async {
namespace {

float Bf16ToFloat(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

std::vector<float> LoadAsFloat(const ffi::AnyBuffer& b) {
  const size_t n = b.element_count();
  std::vector<float> v(n);
  switch (b.element_type()) {
    case ffi::DataType::F32:
      std::memcpy(v.data(), b.untyped_data(), n * sizeof(float));
      break;
    case ffi::DataType::BF16: {
      auto* p = static_cast<const uint16_t*>(b.untyped_data());
      for (size_t i = 0; i < n; ++i) v[i] = Bf16ToFloat(p[i]);
      break;
    }
    default: {  // F16, the only other type CheckGroupedGemm admits
      auto* p = static_cast<const _Float16*>(b.untyped_data());
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(p[i]);
    }
  }
  return v;
}

void StoreFromDouble(const std::vector<double>& v, ffi::AnyBuffer out) {
  switch (out.element_type()) {
    case ffi::DataType::F32: {
      auto* p = static_cast<float*>(out.untyped_data());
      for (size_t i = 0; i < v.size(); ++i) p[i] = static_cast<float>(v[i]);
      break;
    }
    case ffi::DataType::BF16: {
      auto* p = static_cast<uint16_t*>(out.untyped_data());
      for (size_t i = 0; i < v.size(); ++i) p[i] = FloatToBf16(static_cast<float>(v[i]));
      break;
    }
    default: {
      auto* p = static_cast<_Float16*>(out.untyped_data());
      for (size_t i = 0; i < v.size(); ++i) p[i] = static_cast<_Float16>(v[i]);
    }
  }
}

// out[rows_g] = lhs[rows_g] @ rhs[g]; rows past the last group stay zero.
void RaggedM(const GroupedGemmShape& s, const std::vector<int64_t>& off, const std::vector<float>& lhs,
             const std::vector<float>& rhs, std::vector<double>& out) {
  const int64_t K = s.k, N = s.n;
  for (int64_t g = 0; g < s.groups; ++g) {
    const float* w = rhs.data() + g * K * N;
    for (int64_t r = off[g]; r < off[g + 1]; ++r) {
      double* o = out.data() + r * N;
      for (int64_t kk = 0; kk < K; ++kk) {
        const double a = lhs[r * K + kk];
        for (int64_t nn = 0; nn < N; ++nn) {
          o[nn] += a * (s.transpose_rhs ? w[nn * K + kk] : w[kk * N + nn]);
        }
      }
    }
  }
}

// out[g] = lhs[rows_g].T @ rhs[rows_g]; an empty group gives a zero matrix.
void RaggedK(const GroupedGemmShape& s, const std::vector<int64_t>& off, const std::vector<float>& lhs,
             const std::vector<float>& rhs, std::vector<double>& out) {
  const int64_t K = s.k, N = s.n;
  for (int64_t g = 0; g < s.groups; ++g) {
    double* o = out.data() + g * K * N;
    for (int64_t r = off[g]; r < off[g + 1]; ++r) {
      for (int64_t kk = 0; kk < K; ++kk) {
        const double a = lhs[r * K + kk];
        for (int64_t nn = 0; nn < N; ++nn) o[kk * N + nn] += a * rhs[r * N + nn];
      }
    }
  }
}

ffi::Error Run(const GroupedGemmShape& s, const std::vector<int64_t>& off, const ffi::AnyBuffer& lhs,
               const ffi::AnyBuffer& rhs, ffi::AnyBuffer out) {
  std::vector<double> acc(out.element_count(), 0.0);
  (s.ragged_k ? RaggedK : RaggedM)(s, off, LoadAsFloat(lhs), LoadAsFloat(rhs), acc);
  StoreFromDouble(acc, out);
  return ffi::Error::Success();
}

// Every mode checks the sizes on the CPU, where nothing stops an error from being raised: a bad
// size is an error with sync mode's message in device mode too (the GPU's device mode, inside a
// CUDA graph, clamps and counts instead). `Sized` is the shared body of both handlers.
ffi::Error Sized(const ffi::AnyBuffer& lhs, const ffi::AnyBuffer& rhs, const ffi::AnyBuffer& group_sizes,
                 ffi::AnyBuffer out, bool ragged_k, bool transpose_rhs) {
  auto shape = CheckGroupedGemm(lhs, rhs, group_sizes, out, ragged_k, transpose_rhs);
  if (shape.has_error()) return shape.error();
  const auto* sizes = static_cast<const int32_t*>(group_sizes.untyped_data());
  if (ffi::Error e = CheckGroupSizeValues(sizes, shape->groups, shape->rows); e.failure()) return e;
  return Run(*shape, GroupOffsets(sizes, shape->groups), lhs, rhs, out);
}

// Host-sized modes. The repair flag is the CUDA handler's (a stale pinned read is redone there);
// the CPU's sizes are always the ones given.
ffi::Error GroupedGemmCpu(ffi::AnyBuffer lhs, ffi::AnyBuffer rhs, ffi::AnyBuffer group_sizes,
                          ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> /*repair flag*/,
                          bool ragged_k, bool transpose_rhs, bool /*async_host_sizes*/) {
  return Sized(lhs, rhs, group_sizes, *out, ragged_k, transpose_rhs);
}

// Device mode. The plan (kernel, CUTLASS config, workspace) is the GPU's; the CPU has one kernel.
ffi::Error GroupedGemmDeviceCpu(ffi::AnyBuffer lhs, ffi::AnyBuffer rhs, ffi::AnyBuffer group_sizes,
                                ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> /*workspace*/,
                                bool ragged_k, bool transpose_rhs, std::string_view /*kernel*/,
                                std::string_view /*cutlass_config*/) {
  return Sized(lhs, rhs, group_sizes, *out, ragged_k, transpose_rhs);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kGroupedGemmCpu, GroupedGemmCpu, BindHostSizedGemm(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(kGroupedGemmDeviceCpu, GroupedGemmDeviceCpu, BindDeviceGemm(ffi::Ffi::Bind()));

}  // namespace te_async
