// Portable device-sized grouped GEMM: the correct-everywhere fallback (any sm_80+ GPU, f32 inputs,
// f32 output from 16-bit inputs, K or N not a multiple of 8, ragged k at small M).
//
// A shared-memory tiled SIMT GEMM with f32 accumulation: 64x64 output tiles, reduction steps of
// 16, 256 threads each holding a 4x4 register micro-tile. Operands are converted to f32 when they
// are staged into shared memory (double-buffered, with the next step's global loads issued
// before the current step's FMAs). Group offsets are computed on the GPU by every block
// (LoadGroupOffsets), so nothing about the group sizes is needed on the host.
//
//   ragged m: block (row tile i, column tile j) covers rows [64i, 64i+64) of the concatenated row
//     space. It visits every non-empty group overlapping those rows and, for each, runs the
//     reduction over K with the rows outside the group masked to 0 and that group's weights,
//     accumulating into one register tile (the groups' rows are disjoint). Rows past the clamped
//     total stay 0 and are written as 0.
//   ragged k: block (column tile, K tile, group e) reduces over the group's rows in steps of 16
//     and writes out[e]'s 64x64 tile; an empty group writes zeros.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/device_gemm.h"
#include "cuda/float_convert.cuh"
#include "cuda/group_layout.cuh"
#include "grouped_gemm_args.h"

namespace te_async {
namespace {

namespace ffi = xla::ffi;

constexpr int kThreads = 256;
constexpr int kBM = 64;            // output rows per block
constexpr int kBN = 64;            // output columns per block
constexpr int kBK = 16;            // reduction step
constexpr int kLd = 64 + 4;        // shared-memory row stride (floats); multiple of 4 for float4
constexpr int kMaxGridY = 65535;

static_assert(kBM == 64 && kBN == 64 && kBK == 16 && kThreads == 256,
              "the load and compute thread mappings below assume these sizes");

struct SharedTiles {
  __align__(16) float a[2][kBK][kLd];  // a[buf][k][m]: the lhs-side operand, reduction-major
  __align__(16) float b[2][kBK][kLd];  // b[buf][k][n]: the rhs-side operand, reduction-major
  int offsets[kMaxGroups + 1];
};

// Four consecutive outputs, p aligned to 4 elements.
__device__ __forceinline__ void StoreVec4(float* p, float x, float y, float z, float w) {
  *reinterpret_cast<float4*>(p) = make_float4(x, y, z, w);
}
__device__ __forceinline__ void StoreVec4(__half* p, float x, float y, float z, float w) {
  const __half2 lo = __floats2half2_rn(x, y), hi = __floats2half2_rn(z, w);
  uint2 u;
  memcpy(&u.x, &lo, 4);
  memcpy(&u.y, &hi, 4);
  *reinterpret_cast<uint2*>(p) = u;
}
__device__ __forceinline__ void StoreVec4(__nv_bfloat16* p, float x, float y, float z, float w) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(x, y), hi = __floats2bfloat162_rn(z, w);
  uint2 u;
  memcpy(&u.x, &lo, 4);
  memcpy(&u.y, &hi, 4);
  *reinterpret_cast<uint2*>(p) = u;
}

// acc[i][j] += a[k][ty*4+i] * b[k][tx*4+j] over the step's 16 k.
__device__ __forceinline__ void ComputeStep(const SharedTiles& sm, int buf, float (&acc)[4][4]) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
  for (int kk = 0; kk < kBK; ++kk) {
    const float4 a4 = *reinterpret_cast<const float4*>(&sm.a[buf][kk][ty * 4]);
    const float4 b4 = *reinterpret_cast<const float4*>(&sm.b[buf][kk][tx * 4]);
    const float av[4] = {a4.x, a4.y, a4.z, a4.w};
    const float bv[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
  }
}

// Runs `steps` reduction steps. Loader::Load(step, ra, rb) reads one step's 4+4 elements per
// thread from global memory (masked elements read as 0); Loader::Store(sm, buf, ra, rb) puts them
// in shared memory. Every thread of the block must call this with the same `steps`.
// On return all threads are past a __syncthreads() that follows the last read of the tiles.
template <class Loader>
__device__ __forceinline__ void MainLoop(const Loader& ld, long long steps, SharedTiles& sm,
                                         float (&acc)[4][4]) {
  if (steps <= 0) return;
  float ra[4], rb[4];
  ld.Load(0, ra, rb);
  ld.Store(sm, 0, ra, rb);
  __syncthreads();
  for (long long s = 0; s < steps; ++s) {
    const int buf = static_cast<int>(s & 1);
    const bool more = s + 1 < steps;
    if (more) ld.Load(s + 1, ra, rb);
    ComputeStep(sm, buf, acc);
    if (more) ld.Store(sm, buf ^ 1, ra, rb);
    __syncthreads();
  }
}

// Ragged m. Reduction over K. Rows [lo, hi) of lhs are the valid rows of the block's tile
// (rows r0 .. r0+63); rhs_e points at group e's weights: [K,N], or [N,K] when kTransRhs.
// Thread t loads lhs (row r0 + t/16 + 16j, column k0 + t%16) and rhs (k0 + t/64 + 4j, n0 + t%64),
// or for [N,K] rhs (n0 + t/16 + 16j, k0 + t%16), for j = 0..3: consecutive threads read
// consecutive addresses.
template <typename TIn, bool kTransRhs>
struct RaggedMLoader {
  const TIn* __restrict__ a;  // lhs element j = 0 of step 0
  const TIn* __restrict__ b;  // rhs element j = 0 of step 0
  long long a_j;              // lhs elements between j and j+1: 16 K
  long long b_j;              // rhs elements between j and j+1: 4 N, or 16 K for [N,K]
  unsigned a_rows;            // bit j: lhs row j lies in [lo, hi)
  unsigned b_cols;            // bit j: rhs column j lies below N
  int a_k;                    // k of the lhs element at step 0
  int b_k;                    // k of the rhs element j = 0 at step 0
  int K, N;

  __device__ __forceinline__ void Init(const TIn* lhs, const TIn* rhs_e, long long r0,
                                       long long lo, long long hi, long long n0, int K_, int N_) {
    const int t = threadIdx.x;
    K = K_;
    N = N_;
    a_k = t % 16;
    a = lhs + (r0 + t / 16) * K + a_k;
    a_j = 16LL * K;
    a_rows = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const long long row = r0 + t / 16 + 16 * j;
      if (row >= lo && row < hi) a_rows |= 1u << j;
    }
    b_cols = 0;
    if (!kTransRhs) {
      b_k = t / 64;
      const long long n = n0 + t % 64;
      b = rhs_e + static_cast<long long>(b_k) * N + n;
      b_j = 4LL * N;
      if (n < N) b_cols = 0xfu;
    } else {
      b_k = t % 16;
      b = rhs_e + (n0 + t / 16) * K + b_k;
      b_j = 16LL * K;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (n0 + t / 16 + 16 * j < N) b_cols |= 1u << j;
      }
    }
  }

  __device__ __forceinline__ void Load(long long step, float (&ra)[4], float (&rb)[4]) const {
    const long long k0 = step * kBK;
    {
      const bool k_ok = k0 + a_k < K;
      const TIn* p = a + k0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        ra[j] = k_ok && (a_rows >> j & 1u) ? ToFloat(p[j * a_j]) : 0.0f;
      }
    }
    if (!kTransRhs) {
      const TIn* p = b + k0 * N;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const bool ok = k0 + b_k + 4 * j < K && (b_cols & 1u);
        rb[j] = ok ? ToFloat(p[j * b_j]) : 0.0f;
      }
    } else {
      const bool k_ok = k0 + b_k < K;
      const TIn* p = b + k0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        rb[j] = k_ok && (b_cols >> j & 1u) ? ToFloat(p[j * b_j]) : 0.0f;
      }
    }
  }

  __device__ __forceinline__ void Store(SharedTiles& sm, int buf, const float (&ra)[4],
                                        const float (&rb)[4]) const {
    const int t = threadIdx.x;
#pragma unroll
    for (int j = 0; j < 4; ++j) sm.a[buf][t % 16][t / 16 + 16 * j] = ra[j];
    if (!kTransRhs) {
#pragma unroll
      for (int j = 0; j < 4; ++j) sm.b[buf][t / 64 + 4 * j][t % 64] = rb[j];
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) sm.b[buf][t % 16][t / 16 + 16 * j] = rb[j];
    }
  }
};

// Ragged k. Reduction over the group's rows [lo, hi). The tile's output rows are k0 .. k0+63
// (columns of lhs), its columns n0 .. n0+63 (columns of rhs).
template <typename TIn>
struct RaggedKLoader {
  const TIn* __restrict__ lhs;  // [M,K]
  const TIn* __restrict__ rhs;  // [M,N]
  long long lo, hi;
  long long k0, n0;
  int K, N;

  __device__ __forceinline__ void Load(long long step, float (&ra)[4], float (&rb)[4]) const {
    const int t = threadIdx.x;
    const long long r_base = lo + step * kBK + t / 64;
    const long long kk = k0 + t % 64;  // contiguous
    const long long n = n0 + t % 64;   // contiguous
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const long long r = r_base + 4 * j;
      const bool row_ok = r < hi;
      ra[j] = row_ok && kk < K ? ToFloat(lhs[r * K + kk]) : 0.0f;
      rb[j] = row_ok && n < N ? ToFloat(rhs[r * N + n]) : 0.0f;
    }
  }

  __device__ __forceinline__ void Store(SharedTiles& sm, int buf, const float (&ra)[4],
                                        const float (&rb)[4]) const {
    const int t = threadIdx.x;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      sm.a[buf][t / 64 + 4 * j][t % 64] = ra[j];
      sm.b[buf][t / 64 + 4 * j][t % 64] = rb[j];
    }
  }
};

// Writes the block's 64x64 tile: rows row0 + m for m < rows (rows <= 64), columns n0 .. of an
// output with N columns, starting at `out` (row 0 of the matrix).
template <typename TOut>
__device__ __forceinline__ void StoreTile(TOut* __restrict__ out, long long row0, int rows,
                                          long long n0, int N, const float (&acc)[4][4]) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const long long n = n0 + tx * 4;
  const bool vec = (N % 4) == 0 && (reinterpret_cast<uintptr_t>(out) % 16) == 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int m = ty * 4 + i;
    if (m >= rows) continue;
    TOut* p = out + (row0 + m) * static_cast<long long>(N) + n;
    if (vec) {
      // N % 4 == 0 and n % 4 == 0: the four columns are all in range or all out.
      if (n < N) StoreVec4(p, acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (n + j < N) p[j] = FromFloat<TOut>(acc[i][j]);
      }
    }
  }
}

// DeviceGemm's counter and repair condition, passed to the kernels together.
struct Counted {
  unsigned long long* clamped_calls;
  const int* run_if;  // when set: run only if *run_if != 0
};

template <typename TIn, typename TOut, bool kTransRhs>
__global__ void __launch_bounds__(kThreads, 2)
    PortableRaggedMKernel(const TIn* __restrict__ lhs, const TIn* __restrict__ rhs,
                          const int32_t* __restrict__ group_sizes, TOut* __restrict__ out,
                          int groups, int M, int K, int N, Counted counted) {
  if (counted.run_if != nullptr && *counted.run_if == 0) return;
  __shared__ SharedTiles sm;
  LoadGroupOffsets<kThreads>(group_sizes, groups, M, sm.offsets, counted.clamped_calls);
  const long long total = sm.offsets[groups];
  const long long r0 = static_cast<long long>(blockIdx.x) * kBM;
  const long long rend = r0 + kBM < M ? r0 + kBM : M;      // rows of this tile
  const long long grouped_end = rend < total ? rend : total;  // rows of this tile in a group
  const int n_tiles = (N - 1) / kBN + 1;  // N >= 1 (no launch otherwise); no overflow

  // The first group with rows at or past r0 (offsets are non-decreasing; exists when r0 < total).
  int first = groups;
  if (r0 < total) {
    int lo_g = 0, hi_g = groups - 1;
    while (lo_g < hi_g) {
      const int mid = (lo_g + hi_g) / 2;
      if (sm.offsets[mid + 1] > r0) {
        hi_g = mid;
      } else {
        lo_g = mid + 1;
      }
    }
    first = lo_g;
  }

  for (int nt = blockIdx.y; nt < n_tiles; nt += gridDim.y) {
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    }
    const long long n0 = static_cast<long long>(nt) * kBN;
    for (int e = first; e < groups && sm.offsets[e] < grouped_end; ++e) {
      const long long g_lo = sm.offsets[e] > r0 ? sm.offsets[e] : r0;
      const long long g_hi = sm.offsets[e + 1] < grouped_end ? sm.offsets[e + 1] : grouped_end;
      if (g_lo >= g_hi) continue;  // empty group
      RaggedMLoader<TIn, kTransRhs> ld;
      ld.Init(lhs, rhs + static_cast<long long>(e) * K * N, r0, g_lo, g_hi, n0, K, N);
      MainLoop(ld, (static_cast<long long>(K) + kBK - 1) / kBK, sm, acc);
    }
    // Rows in no group (>= total) kept acc == 0 (masked in every pass) and are written as 0.
    StoreTile(out, r0, static_cast<int>(rend - r0), n0, N, acc);
  }
}

template <typename TIn, typename TOut>
__global__ void __launch_bounds__(kThreads, 2)
    PortableRaggedKKernel(const TIn* __restrict__ lhs, const TIn* __restrict__ rhs,
                          const int32_t* __restrict__ group_sizes, TOut* __restrict__ out,
                          int groups, int M, int K, int N, Counted counted) {
  if (counted.run_if != nullptr && *counted.run_if == 0) return;
  __shared__ SharedTiles sm;
  LoadGroupOffsets<kThreads>(group_sizes, groups, M, sm.offsets, counted.clamped_calls);
  const int e = blockIdx.z;
  const long long lo = sm.offsets[e], hi = sm.offsets[e + 1];
  const long long n0 = static_cast<long long>(blockIdx.x) * kBN;
  const int k_tiles = (K - 1) / kBM + 1;  // K >= 1 (no launch otherwise); no overflow
  TOut* out_e = out + static_cast<long long>(e) * K * N;

  for (int kt = blockIdx.y; kt < k_tiles; kt += gridDim.y) {
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    }
    const long long k0 = static_cast<long long>(kt) * kBM;
    RaggedKLoader<TIn> ld;
    ld.lhs = lhs;
    ld.rhs = rhs;
    ld.lo = lo;
    ld.hi = hi;
    ld.k0 = k0;
    ld.n0 = n0;
    ld.K = K;
    ld.N = N;
    MainLoop(ld, hi > lo ? (hi - lo + kBK - 1) / kBK : 0, sm, acc);  // empty group: acc == 0
    const long long rows = K - k0 < kBM ? K - k0 : kBM;
    StoreTile(out_e, k0, static_cast<int>(rows), n0, N, acc);
  }
}

ffi::Error LaunchError(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) return ffi::Error::Success();
  return CudaStatus(status, kernel);
}

template <typename TIn, typename TOut>
ffi::Error Launch(const DeviceGemm& g, cudaStream_t stream) {
  const GroupedGemmShape& s = g.s;
  const int groups = static_cast<int>(s.groups);
  const int M = static_cast<int>(s.rows), K = static_cast<int>(s.k), N = static_cast<int>(s.n);
  const TIn* lhs = static_cast<const TIn*>(g.lhs);
  const TIn* rhs = static_cast<const TIn*>(g.rhs);
  TOut* out = static_cast<TOut*>(g.out);
  const Counted counted{g.clamped_calls, g.run_if};
  const long long n_tiles = (static_cast<long long>(N) + kBN - 1) / kBN;
  if (!s.ragged_k) {
    const dim3 grid(static_cast<unsigned>((static_cast<long long>(M) + kBM - 1) / kBM),
                    static_cast<unsigned>(n_tiles < kMaxGridY ? n_tiles : kMaxGridY));
    if (s.transpose_rhs) {
      PortableRaggedMKernel<TIn, TOut, true>
          <<<grid, kThreads, 0, stream>>>(lhs, rhs, g.group_sizes, out, groups, M, K, N, counted);
      return LaunchError("PortableRaggedMKernel<transpose_rhs=true> launch");
    }
    PortableRaggedMKernel<TIn, TOut, false>
        <<<grid, kThreads, 0, stream>>>(lhs, rhs, g.group_sizes, out, groups, M, K, N, counted);
    return LaunchError("PortableRaggedMKernel<transpose_rhs=false> launch");
  }
  const long long k_tiles = (static_cast<long long>(K) + kBM - 1) / kBM;
  const dim3 grid(static_cast<unsigned>(n_tiles),
                  static_cast<unsigned>(k_tiles < kMaxGridY ? k_tiles : kMaxGridY),
                  static_cast<unsigned>(groups));
  PortableRaggedKKernel<TIn, TOut>
      <<<grid, kThreads, 0, stream>>>(lhs, rhs, g.group_sizes, out, groups, M, K, N, counted);
  return LaunchError("PortableRaggedKKernel launch");
}

template <typename TIn>
ffi::Error LaunchOut(const DeviceGemm& g, cudaStream_t stream) {
  if (g.s.out_type == g.s.in_type) return Launch<TIn, TIn>(g, stream);
  if (g.s.out_type == ffi::DataType::F32) return Launch<TIn, float>(g, stream);
  return ffi::Error::InvalidArgument("te_async portable grouped GEMM: out dtype must be the input "
                                     "dtype or f32");
}

}  // namespace

ffi::Error LaunchPortable(const DeviceGemm& g, cudaStream_t stream) {
  const GroupedGemmShape& s = g.s;
  if (s.rows < 0 || s.k < 0 || s.n < 0) {
    return ffi::Error::InvalidArgument("te_async portable grouped GEMM: negative dimension");
  }
  // Row offsets are int on the device (LoadGroupOffsets); the column dimensions share that limit.
  if (s.rows > INT_MAX || s.k > INT_MAX || s.n > INT_MAX) {
    return ffi::Error::InvalidArgument(
        "te_async portable grouped GEMM: a dimension exceeds 2^31-1 (M " + std::to_string(s.rows) +
        ", K " + std::to_string(s.k) + ", N " + std::to_string(s.n) + ")");
  }
  // Nothing to write: out [M,N] or [G,K,N] is empty.
  if (s.ragged_k ? (s.k == 0 || s.n == 0) : (s.rows == 0 || s.n == 0)) {
    return ffi::Error::Success();
  }
  switch (s.in_type) {
    case ffi::DataType::BF16:
      return LaunchOut<__nv_bfloat16>(g, stream);
    case ffi::DataType::F16:
      return LaunchOut<__half>(g, stream);
    case ffi::DataType::F32:
      return LaunchOut<float>(g, stream);
    default:
      return ffi::Error::InvalidArgument("te_async portable grouped GEMM: inputs must be bf16, "
                                         "f16 or f32");
  }
}

}  // namespace te_async
