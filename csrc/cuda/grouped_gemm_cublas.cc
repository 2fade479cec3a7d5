// Host-sized grouped GEMM: one cuBLAS GEMM per non-empty group, spread over side streams.
// Group sizes come from the host: read synchronously ("sync", TE's behaviour) or from the pinned
// slot a copy_group_sizes call filled ahead of time ("async", waiting on its event only); sizes
// from a slot are checked on the GPU, which redoes the GEMM if they were stale (host_sizes_guard.h).
#include <algorithm>
#include <array>
#include <mutex>
#include <vector>

#include "cuda/cublas_loader.h"
#include "cuda/cuda_check.h"
#include "cuda/device_counters.h"
#include "cuda/device_gemm.h"
#include "debug_flags.h"
#include "cuda/handlers.h"
#include "cuda/host_size_slots.h"
#include "cuda/host_sizes_guard.h"
#include "cuda/stream_pool.h"
#include "grouped_gemm_args.h"

namespace te_async {
namespace {

namespace ffi = xla::ffi;

cudaDataType CudaType(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::BF16:
      return CUDA_R_16BF;
    case ffi::DataType::F16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// Row-major operands through column-major cuBLAS: C^T = B^T A^T, so rhs goes first.
ffi::Error LaunchGroup(const CublasApi& api, cublasHandle_t handle, const GroupedGemmShape& s,
                       int64_t group, int64_t row0, int64_t rows, const char* lhs, const char* rhs,
                       char* out) {
  const size_t in = ffi::ByteWidth(s.in_type), o = ffi::ByteWidth(s.out_type);
  const int64_t n = s.n, k = s.k, m = rows;
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType ti = CudaType(s.in_type), to = CudaType(s.out_type);
  if (!s.ragged_k) {  // out[rows] [m,N] = lhs[rows] [m,K] @ rhs[g] [K,N] (or [N,K]^T)
    TE_ASYNC_CUBLAS(api, GemmEx(handle, s.transpose_rhs ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, n,
                                m, k, &alpha, rhs + group * s.k * s.n * in, ti,
                                s.transpose_rhs ? k : n, lhs + row0 * s.k * in, ti, k, &beta,
                                out + row0 * s.n * o, to, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else {  // out[g] [K,N] = lhs[rows]^T [K,m] @ rhs[rows] [m,N]
    TE_ASYNC_CUBLAS(api, GemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_T, n, k, m, &alpha,
                                rhs + row0 * s.n * in, ti, n, lhs + row0 * s.k * in, ti, k, &beta,
                                out + group * s.k * s.n * o, to, n, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
  }
  return ffi::Error::Success();
}

// Zeroes what no GEMM writes: rows past the last group (ragged m), empty groups (ragged k).
ffi::Error ZeroUnwritten(const GroupedGemmShape& s, const std::vector<int64_t>& off, char* out,
                         cudaStream_t stream) {
  const size_t o = ffi::ByteWidth(s.out_type);
  if (!s.ragged_k) {
    const int64_t first = s.k == 0 ? 0 : off[s.groups];
    if (first < s.rows) {
      TE_ASYNC_CUDA(cudaMemsetAsync(out + first * s.n * o, 0, (s.rows - first) * s.n * o, stream));
    }
    return ffi::Error::Success();
  }
  for (int64_t g = 0; g < s.groups; ++g) {
    if (off[g + 1] == off[g]) {
      TE_ASYNC_CUDA(cudaMemsetAsync(out + g * s.k * s.n * o, 0, s.k * s.n * o, stream));
    }
  }
  return ffi::Error::Success();
}

ffi::Error LaunchGroups(int32_t device, const GroupedGemmShape& s, const std::vector<int64_t>& off,
                        const ffi::AnyBuffer& lhs, const ffi::AnyBuffer& rhs, char* out, cudaStream_t stream) {
  std::vector<int64_t> busy;  // groups with rows
  for (int64_t g = 0; g < s.groups; ++g) {
    if (off[g + 1] > off[g]) busy.push_back(g);
  }
  if (busy.empty()) return ffi::Error::Success();

  auto pool = StreamPool::ForDevice(device);
  if (pool.has_error()) return pool.error();
  StreamPool& p = **pool;
  std::lock_guard<std::mutex> lock(p.mutex());
  const auto* a = static_cast<const char*>(lhs.untyped_data());
  const auto* b = static_cast<const char*>(rhs.untyped_data());
  if (busy.size() == 1) {
    auto handle = p.MainHandle(stream);
    if (handle.has_error()) return handle.error();
    const int64_t g = busy[0];
    return LaunchGroup(p.cublas(), *handle, s, g, off[g], off[g + 1] - off[g], a, b, out);
  }
  const int used = static_cast<int>(std::min<size_t>(busy.size(), StreamPool::kStreams));
  TE_ASYNC_RETURN_IF_ERROR(p.Fork(stream, used));
  for (size_t i = 0; i < busy.size(); ++i) {
    const int64_t g = busy[i];
    TE_ASYNC_RETURN_IF_ERROR(LaunchGroup(p.cublas(), p.SideHandle(static_cast<int>(i % used)), s, g,
                                         off[g], off[g + 1] - off[g], a, b, out));
  }
  return p.Join(stream, used);
}

ffi::Error GroupedGemmCuda(cudaStream_t stream, int32_t device, ffi::AnyBuffer lhs, ffi::AnyBuffer rhs,
                           ffi::AnyBuffer group_sizes, ffi::Result<ffi::AnyBuffer> out,
                           ffi::Result<ffi::AnyBuffer> repair_flag, bool ragged_k, bool transpose_rhs,
                           bool async_host_sizes) {
  auto shape = CheckGroupedGemm(lhs, rhs, group_sizes, *out, ragged_k, transpose_rhs);
  if (shape.has_error()) return shape.error();
  const GroupedGemmShape& s = *shape;
  if (repair_flag->size_bytes() < sizeof(int)) {
    return ffi::Error::InvalidArgument("te_async: the host-sized grouped GEMM's second result must be int32[1]");
  }

  auto slots = HostSizeSlots::ForDevice(device);
  if (slots.has_error()) return slots.error();
  const auto* device_sizes = static_cast<const int32_t*>(group_sizes.untyped_data());
  std::array<int32_t, kMaxGroups> sizes;
  auto pinned = (*slots)->Read(device_sizes, s.groups, stream, async_host_sizes, sizes.data());
  if (pinned.has_error()) return pinned.error();
  TE_ASYNC_RETURN_IF_ERROR(CheckGroupSizeValues(sizes.data(), s.groups, s.rows));
  const std::vector<int64_t> off = GroupOffsets(sizes.data(), s.groups);

  auto* out_data = static_cast<char*>(out->untyped_data());
  if (PoisonOutputs()) TE_ASYNC_CUDA(cudaMemsetAsync(out_data, 0xff, out->size_bytes(), stream));  // NaN
  TE_ASYNC_RETURN_IF_ERROR(ZeroUnwritten(s, off, out_data, stream));
  if (s.k == 0 || s.n == 0) return ffi::Error::Success();  // the output is all zeros (or empty)
  if (!*pinned) return LaunchGroups(device, s, off, lhs, rhs, out_data, stream);

  // Sizes from a pinned slot: the GPU checks them against the operand and repairs a stale read.
  auto counters = CountersOnDevice(device);
  if (counters.has_error()) return counters.error();
  int* mismatch = static_cast<int*>(repair_flag->untyped_data());
  TE_ASYNC_RETURN_IF_ERROR(LaunchHostSizesGuard(sizes.data(), s.groups, device_sizes, mismatch, *counters, stream));
  TE_ASYNC_RETURN_IF_ERROR(LaunchGroups(device, s, off, lhs, rhs, out_data, stream));
  auto info = QueryDevice(device);
  if (info.has_error()) return info.error();
  DeviceGemm repair = DeviceGemmOf(s, lhs, rhs, device_sizes, out_data, *info, &(*counters)->clamped_calls);
  repair.run_if = mismatch;
  return LaunchPortable(repair, stream);
}

}  // namespace

// Not command-buffer compatible: the group sizes decide, on the host, which GEMMs to launch.
XLA_FFI_DEFINE_HANDLER_SYMBOL(kGroupedGemmCuda, GroupedGemmCuda,
                              BindHostSizedGemm(ffi::Ffi::Bind()
                                                    .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                                    .Ctx<ffi::DeviceOrdinal>()));

}  // namespace te_async
