// Products of a few token vectors with a bf16 weight matrix whose rows each block holds in
// registers: ProductKernel (mla_token.cu's input projections and o_proj) and its parts LoadRows and
// ColumnSums, which mla_token.cu's prep and merge kernels use too. A header of its own so that other
// one-token calls can chain the same kernel behind their own kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cooperative_groups.h>

#include <algorithm>
#include <cstddef>

#include "cuda/float_convert.cuh"
#include "cuda/norm_rope.cuh"
#include "cuda/programmatic_launch.cuh"
#include "cuda/vector_loads.cuh"

namespace te_async {
namespace token_product {

using bf16 = __nv_bfloat16;

// ProductKernel's block: thread (g, v) owns 16-byte column vector v and rows g, g + kProductGroups,
// ..., for kProductSeqs sequences at once.
constexpr int kProductGroups = 128;
constexpr int kProductSeqs = 2;

struct ProductArgs {
  const bf16* in;        // [B, rows]; or null, and
  const float* parts;    // [kParts, B, rows]: in's values as partial sums, added in order and rounded to bf16
  const bf16* norm;      // [rows]: RMSNorm's weight, applied to `in` with eps; null: `in` as it is
  const bf16* w;         // [rows, cols]; rows a multiple of kProductGroups, at most kMaxHidden
  const bf16* residual;  // [B, cols], added to the rounded product; or null
  bf16* out;             // [B, cols]
  int batch, rows, cols;
  float eps;
};

// Products of vectors with a weight matrix, by blocks of kColumns: thread (g, v) of the block owns
// 16-byte column vector v and rows g, g + kGroups, ... (at most kMaxRows of them, `rows` in all),
// which it loads into registers first (LoadRows), so that their latency overlaps whatever the block
// does before it needs them (ColumnSums).
template <int kMaxRows>
__device__ __forceinline__ void LoadRows(uint4 (&wv)[kMaxRows], const bf16* first, size_t row_step, int rows) {
  const char* p = reinterpret_cast<const char*>(first);  // one pointer stepped by the row stride: a 64-bit
  const size_t step = row_step * sizeof(bf16);  // product per row was most of the kernels' prologue
#pragma unroll
  for (int i = 0; i < kMaxRows; ++i, p += step) {
    wv[i] = i < rows ? LoadStreamBeforeWait(p) : make_uint4(0u, 0u, 0u, 0u);
  }
}

// coef_s . W for the block's kColumns columns and its `seqs` <= kSeqs vectors coef_s (at coef + s
// coef_stride), from the rows LoadRows loaded into a block of kBlockThreads: each thread sums its
// rows, the row groups of a warp are added by a butterfly over its lanes, then the warps' sums in
// warp order (a serial walk over 128 row groups cost o_proj's kernel about 2 us). Thread t < kSeqs
// kColumns gets vector t / kColumns's column t % kColumns; sums: shared memory of kSeqs
// kBlockThreads / 32 kColumns floats, free again on return.
template <int kSeqs, int kColumns, int kBlockThreads, int kMaxRows>
__device__ __forceinline__ float ColumnSums(const uint4 (&wv)[kMaxRows], int rows, const float* coef, int coef_stride,
                                            int seqs, float* sums) {
  constexpr int kVectors = kColumns / 8, kGroups = kBlockThreads / kVectors, kBlockWarps = kBlockThreads / 32;
  static_assert(32 % kVectors == 0 && kSeqs * kColumns <= kBlockThreads, "whole row groups in a warp");
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, v = tid % kVectors, g = tid / kVectors;
  float acc[kSeqs][8] = {};
#pragma unroll
  for (int i = 0; i < kMaxRows; ++i) {
    if (i < rows) {
      float f[8];
      Unpack<bf16>(wv[i], f);
#pragma unroll
      for (int s = 0; s < kSeqs; ++s) {
        if (s < seqs) {
          const float c = coef[s * coef_stride + g + i * kGroups];
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[s][j] = fmaf(c, f[j], acc[s][j]);
        }
      }
    }
  }
#pragma unroll
  for (int s = 0; s < kSeqs; ++s) {
    if (s < seqs) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int d = kVectors; d < 32; d *= 2) acc[s][j] += __shfl_xor_sync(0xffffffffu, acc[s][j], d);
        if (lane < kVectors) sums[(s * kBlockWarps + warp) * kColumns + v * 8 + j] = acc[s][j];
      }
    }
  }
  __syncthreads();
  float total = 0.f;
  if (tid < seqs * kColumns) {
    const int seq = tid / kColumns, column = tid % kColumns;
    for (int w = 0; w < kBlockWarps; ++w) total += sums[(seq * kBlockWarps + w) * kColumns + column];
  }
  __syncthreads();
  return total;
}

// Value i of vector b of ProductKernel's input.
template <int kParts>
__device__ __forceinline__ float InValue(const ProductArgs& a, int b, int i) {
  if (a.in != nullptr) return __bfloat162float(a.in[static_cast<size_t>(b) * a.rows + i]);
  float sum = 0.f;
#pragma unroll
  for (int p = 0; p < kParts; ++p) sum += a.parts[(static_cast<size_t>(p) * a.batch + b) * a.rows + i];
  return Rounded<bf16>(sum);
}

// Stages a block's input vectors for both product kernels: x[s] = in[b0 + s] (or the sum of kParts
// partials), through RMSNorm when a norm weight is given (thread t holds values t, t + kBlockThreads,
// ...). `load_weights` issues the block's first weight loads between the input's loads and the wait
// for the previous kernel: with a norm weight, `in` and the norm are the call's inputs and are read
// before the weights, so that they arrive first; without one, `in` is the previous kernel's output
// and is read after the wait. Ends with a barrier: x is ready for the whole block.
template <int kBlockThreads, int kMaxHidden, int kParts, typename LoadWeights>
__device__ __forceinline__ void StageInput(const ProductArgs& a, int b0, int seqs, float (&x)[kProductSeqs][kMaxHidden],
                                           float* scratch, LoadWeights&& load_weights) {
  static_assert(kMaxHidden % kBlockThreads == 0, "whole rows per thread");
  constexpr int kSpread = kMaxHidden / kBlockThreads;
  const int tid = threadIdx.x;
  float values[kProductSeqs][kSpread];
  bf16 weight[kSpread];
  const auto load_in = [&] {
#pragma unroll
    for (int s = 0; s < kProductSeqs; ++s) {
#pragma unroll
      for (int j = 0; j < kSpread; ++j) {
        const int i = tid + j * kBlockThreads;
        values[s][j] = s < seqs && i < a.rows ? InValue<kParts>(a, b0 + s, i) : 0.f;
      }
    }
  };
  const bool normed = a.norm != nullptr;
  if (normed) {
    load_in();
#pragma unroll
    for (int j = 0; j < kSpread; ++j) {
      const int i = tid + j * kBlockThreads;
      weight[j] = i < a.rows ? a.norm[i] : __float2bfloat16(0.f);
    }
  }
  load_weights();
  WaitForPrevious();  // `in` or `parts` without a norm (returns at once where the launch has no dependency)
  if (!normed) load_in();
#pragma unroll
  for (int s = 0; s < kProductSeqs; ++s) {  // unrolled: values stays in registers (a loop to seqs put it on the stack)
    if (s >= seqs) break;
    float squares = 0.f;
#pragma unroll
    for (int j = 0; j < kSpread; ++j) squares = fmaf(values[s][j], values[s][j], squares);
    const float r = normed ? InverseRms<kBlockThreads / 32>(squares, a.rows, a.eps, scratch) : 0.f;
#pragma unroll
    for (int j = 0; j < kSpread; ++j) {
      const int i = tid + j * kBlockThreads;
      if (i < a.rows) x[s][i] = normed ? Normalized(values[s][j], r, weight[j]) : values[s][j];
    }
  }
  __syncthreads();
}

// Output element `at` from its f32 sum: rounded, plus the residual where there is one (rounded again),
// as the unfused path's product and add.
__device__ __forceinline__ void WriteOutput(const ProductArgs& a, size_t at, float sum) {
  const float y = Rounded<bf16>(sum);
  a.out[at] = __float2bfloat16(a.residual == nullptr ? y : __bfloat162float(a.residual[at]) + y);
}

// Block (kColumns columns, sequences 2y and 2y + 1 where they exist), for inputs of at most
// kMaxHidden rows (kParts partial sums where `in` is null): out[b, cols] = v_b . w[:, cols]
// (+ residual[b, cols]), where v_b is in[b], through RMSNorm when a norm weight is given. Thread
// (g, v) loads its rows of the block's columns (g, g + kProductGroups, ...) into registers before it
// waits for the previous kernel, and uses them for both sequences: at B=2 a block per sequence read
// the weights twice and took two waves. For weights of at most about 128 KB an SM (one wave of
// blocks holding them in registers); SlicedProductKernel streams larger ones.
template <int kColumns, int kBlockThreads, int kMaxHidden, int kParts>
__global__ void __launch_bounds__(kBlockThreads) ProductKernel(ProductArgs a) {
  static_assert(kBlockThreads == kProductGroups * kColumns / 8, "kProductGroups row groups");
  StartDependents();
  constexpr int kBlockWarps = kBlockThreads / 32;
  constexpr int kProductRows = kMaxHidden / kProductGroups;  // most rows per thread
  __shared__ float x[kProductSeqs][kMaxHidden];
  __shared__ float sums[kProductSeqs * kBlockWarps * kColumns];
  __shared__ float scratch[kBlockWarps];
  const int tid = threadIdx.x, v = tid % (kColumns / 8), g = tid / (kColumns / 8);
  const int b0 = blockIdx.y * kProductSeqs, seqs = min(kProductSeqs, a.batch - b0);
  const int col = blockIdx.x * kColumns, rows = a.rows / kProductGroups;
  uint4 wv[kProductRows];
  StageInput<kBlockThreads, kMaxHidden, kParts>(a, b0, seqs, x, scratch, [&] {
    LoadRows(wv, a.w + static_cast<size_t>(g) * a.cols + col + v * 8, static_cast<size_t>(kProductGroups) * a.cols,
             rows);
  });
  const float sum = ColumnSums<kProductSeqs, kColumns, kBlockThreads>(wv, rows, &x[0][0], kMaxHidden, seqs, sums);
  if (tid < seqs * kColumns) WriteOutput(a, static_cast<size_t>(b0 + tid / kColumns) * a.cols + col + tid % kColumns, sum);
}

// SlicedProductKernel: ProductKernel's product for weights that do not fit the registers of one wave
// (Qwen3-30B-A3B's input projections, 21 MB: ProductKernel took 1.2 waves of 160 blocks reading 64-byte
// pieces of each row). Block (slice x, tile y of kSliceColumns columns, sequences 2z and 2z + 1) streams
// rows [x slice_rows, (x + 1) slice_rows) of its columns, 256 contiguous bytes a row (kSliceVectors
// threads of 16 bytes), kSliceLoads rows a thread in flight and the next kSliceLoads loading while they
// are used, as small_group_gemm.cu's split-K kernel reads; its first loads are issued before the wait
// for the previous kernel. The slices of a tile are one thread-block cluster along x: each block leaves
// its sums in shared memory and adds a share of the outputs over the cluster's blocks in slice order
// (distributed shared memory), so the result is the same in every run. Two blocks an SM.
constexpr int kSliceThreads = 256;
constexpr int kSliceVectors = 16;
constexpr int kSliceColumns = kSliceVectors * 8;
constexpr int kSliceGroups = kSliceThreads / kSliceVectors;  // a thread's rows are this far apart
constexpr int kSliceLoads = 8;
constexpr int kMaxSlices = kPortableClusterSize;

template <int kMaxHidden, int kParts>
__global__ void __launch_bounds__(kSliceThreads, 2) SlicedProductKernel(ProductArgs a, int slice_rows) {
  static_assert(kSliceThreads == kProductSeqs * kSliceColumns, "a thread per output of a block's tile");
  StartDependents();
  constexpr int kWarps = kSliceThreads / 32;
  __shared__ float x[kProductSeqs][kMaxHidden];
  __shared__ float sums[kProductSeqs][kWarps][kSliceColumns];
  __shared__ float slice_sums[kProductSeqs * kSliceColumns];
  __shared__ float scratch[kWarps];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, v = tid % kSliceVectors, g = tid / kSliceVectors;
  const int b0 = blockIdx.z * kProductSeqs, seqs = min(kProductSeqs, a.batch - b0);
  const int col = blockIdx.y * kSliceColumns, first = blockIdx.x * slice_rows + g;
  const int last = min(a.rows, static_cast<int>(blockIdx.x + 1) * slice_rows);
  const int count = first < last ? (last - first + kSliceGroups - 1) / kSliceGroups : 0;  // this thread's rows
  const char* w = reinterpret_cast<const char*>(a.w + static_cast<size_t>(first) * a.cols + col + v * 8);
  const size_t step = static_cast<size_t>(kSliceGroups) * a.cols * sizeof(bf16);
  const auto load = [&](uint4(&wv)[kSliceLoads], int i) {
#pragma unroll
    for (int u = 0; u < kSliceLoads; ++u) {
      wv[u] = i + u < count ? LoadStreamBeforeWait(w + static_cast<size_t>(i + u) * step) : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  uint4 current[kSliceLoads], next[kSliceLoads];
  StageInput<kSliceThreads, kMaxHidden, kParts>(a, b0, seqs, x, scratch, [&] { load(current, 0); });
  float acc[kProductSeqs][8] = {};
  for (int i = 0; i < count; i += kSliceLoads) {
    load(next, i + kSliceLoads);
#pragma unroll
    for (int u = 0; u < kSliceLoads; ++u) {
      if (i + u < count) {
        float f[8];
        Unpack<bf16>(current[u], f);
        const int row = first + (i + u) * kSliceGroups;
#pragma unroll
        for (int s = 0; s < kProductSeqs; ++s) {
          if (s < seqs) {
            const float c = x[s][row];
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[s][j] = fmaf(c, f[j], acc[s][j]);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kSliceLoads; ++u) current[u] = next[u];
  }
  // The warp's two row groups (lanes l and l + 16), then the warps in order.
#pragma unroll
  for (int s = 0; s < kProductSeqs; ++s) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      acc[s][j] += __shfl_xor_sync(0xffffffffu, acc[s][j], kSliceVectors);
      if (lane < kSliceVectors) sums[s][warp][v * 8 + j] = acc[s][j];
    }
  }
  __syncthreads();
  const int s = tid / kSliceColumns, c = tid % kSliceColumns;
  float total = 0.f;
#pragma unroll
  for (int k = 0; k < kWarps; ++k) total += sums[s][k][c];
  slice_sums[tid] = total;
  const int outputs = seqs * kSliceColumns;
  const auto at = [&](int o) { return static_cast<size_t>(b0 + o / kSliceColumns) * a.cols + col + o % kSliceColumns; };
  if (gridDim.x == 1) {
    if (tid < outputs) WriteOutput(a, at(tid), total);
    return;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every slice's sums are in its shared memory
  const int slices = static_cast<int>(gridDim.x), per = (outputs + slices - 1) / slices;
  const int o = static_cast<int>(blockIdx.x) * per + tid;
  if (tid < per && o < outputs) {
    float sum = 0.f;
    for (int q = 0; q < slices; ++q) sum += cluster.map_shared_rank(slice_sums, q)[o];
    WriteOutput(a, at(o), sum);
  }
  cluster.sync();  // no block leaves while another still reads its sums
#else
  __trap();  // LaunchSliced never splits below compute capability 9.0
#endif
}

// SlicedProductKernel's launch (a programmatic dependent where after_previous): clusters of `slices`
// blocks along x, one per tile of kSliceColumns columns and pair of sequences, each block of a cluster
// on slice_rows rows (whole row groups). As many slices as give about two blocks an SM (at most
// kMaxSlices), then fewer until every cluster is resident at once: a grid past that runs a second
// wave (Qwen3-30B-A3B's input projections alone, 40 clusters of which 39 of 6 blocks fit: 19.9 us
// against 16.0 at 4 slices on an H100, docs/results/2026-12-07-h100-gqa-oproj-streamed). One slice
// below compute capability 9.0 (no clusters).
template <int kMaxHidden, int kParts>
xla::ffi::Error LaunchSliced(const ProductArgs& a, int sm_count, int compute_capability, cudaStream_t stream,
                             bool after_previous, const char* what) {
  const int tiles = a.cols / kSliceColumns, pairs = (a.batch + kProductSeqs - 1) / kProductSeqs;
  const auto kernel = SlicedProductKernel<kMaxHidden, kParts>;
  int slices = compute_capability < 90
                   ? 1
                   : std::max(1, std::min({kMaxSlices, 2 * sm_count / std::max(tiles * pairs, 1), a.rows / kSliceGroups}));
  for (; slices > 1; --slices) {
    const xla::ffi::ErrorOr<int> resident = ResidentClusters(kernel, kSliceThreads, slices);
    if (resident.has_error()) return resident.error();
    if (*resident >= tiles * pairs) break;
  }
  const int slice_rows = (a.rows + slices * kSliceGroups - 1) / (slices * kSliceGroups) * kSliceGroups;
  return CudaStatus(LaunchDependentClusters(kernel, dim3(slices, tiles, pairs), dim3(kSliceThreads), 0, stream,
                                            after_previous, slices, a, slice_rows),
                    what);
}

// The chained token calls' two products (mla_token.cu, gqa_token.cu): the input projections take 32
// columns in 512 threads, 64 bytes of each weight row (DeepSeek-V2-Lite's 15 MB at B=1: 9.0 us; 16
// columns, 32 bytes a row, 9.7); o_proj 16 in 256, so that its blocks are small enough to sit beside
// the attention's where the call lets them start early (mla_token.cu).
constexpr int kInputColumns = 32, kInputThreads = kProductGroups * kInputColumns / 8;
constexpr int kOutputColumns = 16, kOutputThreads = kProductGroups * kOutputColumns / 8;

// ProductKernel over all of a's columns and sequences, kColumns columns a block (a programmatic
// dependent of the stream's previous kernel where after_previous); a failed launch is an FFI error
// naming `what`.
template <int kColumns, int kMaxHidden, int kParts>
xla::ffi::Error LaunchProduct(const ProductArgs& a, cudaStream_t stream, bool after_previous, const char* what) {
  constexpr int kThreads = kProductGroups * kColumns / 8;
  const dim3 grid(a.cols / kColumns, (a.batch + kProductSeqs - 1) / kProductSeqs);
  return LaunchChained(ProductKernel<kColumns, kThreads, kMaxHidden, kParts>, grid, kThreads, a, stream,
                       after_previous, what);
}

}  // namespace token_product
}  // namespace te_async
