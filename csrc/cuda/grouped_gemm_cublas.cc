// Host-sized grouped GEMM: one cuBLAS GEMM per non-empty group, spread over side streams (sync),
// or all of them in one grouped cuBLAS call (async; see OneLaunch).
// Group sizes come from the host: read synchronously ("sync", TE's behaviour) or from the pinned
// slot a copy_group_sizes call filled ahead of time ("async", waiting on its event only); sizes
// from a slot are checked on the GPU, which redoes the GEMM if they were stale (host_sizes_guard.h).
#include <algorithm>
#include <array>
#include <mutex>
#include <optional>
#include <vector>

#include "cuda/cublas_loader.h"
#include "cuda/cuda_check.h"
#include "cuda/device_counters.h"
#include "cuda/device_gemm.h"
#include "debug_flags.h"
#include "cuda/handlers.h"
#include "cuda/host_size_slots.h"
#include "cuda/host_sizes_guard.h"
#include "cuda/poison.h"
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

// One group's GEMM in cuBLAS' column-major terms. Row-major operands: C^T = B^T A^T, so rhs is
// cuBLAS' A.
struct GroupProblem {
  cublasOperation_t op_a, op_b;
  int64_t m, n, k, lda, ldb, ldc;
  const char* a;
  const char* b;
  char* c;
};

GroupProblem ProblemOf(const GroupedGemmShape& s, int64_t group, int64_t row0, int64_t rows,
                       const char* lhs, const char* rhs, char* out) {
  const size_t in = ffi::ByteWidth(s.in_type), o = ffi::ByteWidth(s.out_type);
  if (!s.ragged_k) {  // out[rows] [m,N] = lhs[rows] [m,K] @ rhs[g] [K,N] (or [N,K]^T)
    return {s.transpose_rhs ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, s.n, rows, s.k,
            s.transpose_rhs ? s.k : s.n, s.k, s.n, rhs + group * s.k * s.n * in,
            lhs + row0 * s.k * in, out + row0 * s.n * o};
  }
  // out[g] [K,N] = lhs[rows]^T [K,m] @ rhs[rows] [m,N]
  return {CUBLAS_OP_N, CUBLAS_OP_T, s.n, s.k, rows, s.n, s.k, s.n, rhs + row0 * s.n * in,
          lhs + row0 * s.k * in, out + group * s.k * s.n * o};
}

ffi::Error LaunchGroup(const CublasApi& api, cublasHandle_t handle, const GroupedGemmShape& s,
                       const GroupProblem& p) {
  const float alpha = 1.0f, beta = 0.0f;
  TE_ASYNC_CUBLAS(api, GemmEx(handle, p.op_a, p.op_b, p.m, p.n, p.k, &alpha, p.a, CudaType(s.in_type),
                              p.lda, p.b, CudaType(s.in_type), p.ldb, &beta, p.c, CudaType(s.out_type),
                              p.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return ffi::Error::Success();
}

// Async mode launches every group's GEMM in one cublasGemmGroupedBatchedEx call (cuBLAS 12.5+)
// where cuBLAS has it for these types (it writes only the input type) and the groups are small:
// one GEMM per group costs the host 10 to 20 us, and from a few decode tokens that launch loop, not
// the GPU, sets the step's time; but the grouped call runs an sm80-class kernel, which at training
// sizes computes at about half the rate of the per-group GEMMs (tools/host_gemm_crossover.py,
// 64 groups at DeepSeek-V2-Lite's shapes: one call was faster up to 256 rows per group for ragged
// m and up to 64 for ragged k, slower at 384 and 128). Sync mode keeps TE's launches.
bool OneLaunch(const CublasApi& api, const GroupedGemmShape& s, bool async_host_sizes,
               const std::vector<GroupProblem>& problems, int64_t rows_in_groups) {
  const int64_t max_mean_rows = s.ragged_k ? 64 : 256;
  return async_host_sizes && !PerGroupGemms() && api.GemmGroupedBatchedEx != nullptr &&
         s.in_type == s.out_type && problems.size() > 1 &&
         rows_in_groups <= max_mean_rows * static_cast<int64_t>(problems.size());
}

// The problems as groups of one (their shapes differ) in one call. cuBLAS takes the shapes from
// host arrays and the operand pointers from device arrays, which go through XLA's scratch memory.
ffi::Error LaunchOneCall(const CublasApi& api, cublasHandle_t handle, const GroupedGemmShape& s,
                         const std::vector<GroupProblem>& problems, ffi::ScratchAllocator& scratch,
                         cudaStream_t stream) {
  const size_t count = problems.size();
  std::vector<cublasOperation_t> op_a, op_b;
  std::vector<int64_t> m, n, k, lda, ldb, ldc, ones(count, 1);
  std::vector<const void*> pointers(3 * count);  // A's, then B's, then C's
  for (size_t i = 0; i < count; ++i) {
    const GroupProblem& p = problems[i];
    op_a.push_back(p.op_a), op_b.push_back(p.op_b);
    m.push_back(p.m), n.push_back(p.n), k.push_back(p.k);
    lda.push_back(p.lda), ldb.push_back(p.ldb), ldc.push_back(p.ldc);
    pointers[i] = p.a, pointers[count + i] = p.b, pointers[2 * count + i] = p.c;
  }
  std::optional<void*> device_pointers = scratch.Allocate(pointers.size() * sizeof(void*), 16);
  if (!device_pointers) {
    return ffi::Error::Internal("te_async: no scratch memory for the grouped GEMM's operand pointers");
  }
  // From pageable memory: the copy is staged before it returns, so `pointers` may go.
  TE_ASYNC_CUDA(cudaMemcpyAsync(*device_pointers, pointers.data(), pointers.size() * sizeof(void*),
                                cudaMemcpyHostToDevice, stream));
  const auto** dev = static_cast<const void**>(*device_pointers);
  const std::vector<float> alpha(count, 1.0f), beta(count, 0.0f);
  const cudaDataType ti = CudaType(s.in_type), to = CudaType(s.out_type);
  TE_ASYNC_CUBLAS(api, GemmGroupedBatchedEx(handle, op_a.data(), op_b.data(), m.data(), n.data(), k.data(),
                                            alpha.data(), dev, ti, lda.data(), dev + count, ti, ldb.data(),
                                            beta.data(), const_cast<void* const*>(dev + 2 * count), to,
                                            ldc.data(), static_cast<int64_t>(count), ones.data(),
                                            CUBLAS_COMPUTE_32F));
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
                        const ffi::AnyBuffer& lhs, const ffi::AnyBuffer& rhs, char* out,
                        bool async_host_sizes, ffi::ScratchAllocator& scratch, cudaStream_t stream) {
  const auto* a = static_cast<const char*>(lhs.untyped_data());
  const auto* b = static_cast<const char*>(rhs.untyped_data());
  std::vector<GroupProblem> problems;  // groups with rows
  for (int64_t g = 0; g < s.groups; ++g) {
    if (off[g + 1] > off[g]) problems.push_back(ProblemOf(s, g, off[g], off[g + 1] - off[g], a, b, out));
  }
  if (problems.empty()) return ffi::Error::Success();

  auto pool = StreamPool::ForDevice(device);
  if (pool.has_error()) return pool.error();
  StreamPool& p = **pool;
  std::lock_guard<std::mutex> lock(p.mutex());
  const bool one_launch = OneLaunch(p.cublas(), s, async_host_sizes, problems, off[s.groups]);
  if (problems.size() == 1 || one_launch) {
    auto handle = p.MainHandle(stream);
    if (handle.has_error()) return handle.error();
    if (one_launch) {
      ++p.stats().grouped_calls;
      return LaunchOneCall(p.cublas(), *handle, s, problems, scratch, stream);
    }
    ++p.stats().per_group_gemms;
    return LaunchGroup(p.cublas(), *handle, s, problems[0]);
  }
  const int used = static_cast<int>(std::min<size_t>(problems.size(), StreamPool::kStreams));
  TE_ASYNC_RETURN_IF_ERROR(p.Fork(stream, used));
  for (size_t i = 0; i < problems.size(); ++i) {
    TE_ASYNC_RETURN_IF_ERROR(LaunchGroup(p.cublas(), p.SideHandle(static_cast<int>(i % used)), s, problems[i]));
  }
  p.stats().per_group_gemms += problems.size();
  return p.Join(stream, used);
}

ffi::Error GroupedGemmCuda(cudaStream_t stream, int32_t device, ffi::ScratchAllocator scratch,
                           ffi::AnyBuffer lhs, ffi::AnyBuffer rhs,
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
  TE_ASYNC_RETURN_IF_ERROR(PoisonOutputBuffers(stream, *out));
  TE_ASYNC_RETURN_IF_ERROR(ZeroUnwritten(s, off, out_data, stream));
  if (s.k == 0 || s.n == 0) return ffi::Error::Success();  // the output is all zeros (or empty)
  if (!*pinned) return LaunchGroups(device, s, off, lhs, rhs, out_data, async_host_sizes, scratch, stream);

  // Sizes from a pinned slot: the GPU checks them against the operand and repairs a stale read.
  auto counters = CountersOnDevice(device);
  if (counters.has_error()) return counters.error();
  int* mismatch = static_cast<int*>(repair_flag->untyped_data());
  TE_ASYNC_RETURN_IF_ERROR(LaunchHostSizesGuard(sizes.data(), s.groups, device_sizes, mismatch, *counters, stream));
  TE_ASYNC_RETURN_IF_ERROR(LaunchGroups(device, s, off, lhs, rhs, out_data, async_host_sizes, scratch, stream));
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
                                                    .Ctx<ffi::DeviceOrdinal>()
                                                    .Ctx<ffi::ScratchAllocator>()));

}  // namespace te_async
