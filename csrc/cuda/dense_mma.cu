// A dense x @ w of 1 to 16 rows on the tensor cores (dense_gemm.cc, te_async/dense.py): a decode
// step's projections and shared experts at a batch of a few sequences; bf16 or f16, w [K, N].
//
// Why not small_groups' CUDA-core loop: it spends one FMA per weight element and row, so from a
// few rows on its instruction issue, not the HBM, sets the time (docs/investigations.md, "The small-M
// kernel past two rows": 17 us per GEMM at 8 rows). Here one mma.sync.m16n8k16 per 8 columns and
// 16 k-rows takes up to 16 rows at once, and the CUDA cores only move the weights.
//
// Layout. The weights go from HBM straight to registers, with no shared-memory staging. A warp
// covers 64 columns x 16 k-rows per step: lane (g = lane / 4, t = lane % 4) loads the 16-byte
// vectors of columns n0 + 8g .. n0 + 8g + 7 at the step's k-rows 2t, 2t+1, 2t+8 and 2t+9, which
// are the k-indices lane holds in the mma's B fragment. So for each j = 0..7 two byte permutes of
// the loaded vectors make the B fragment of an mma whose column c is column n0 + 8c + j, and its C
// fragment gives lane (g, t) out rows g and g + 8 at columns n0 + 16t + j and n0 + 16t + 8 + j:
// over j, 16 contiguous columns. The A fragment (x; rows past M are zero) is read from global
// memory through L1, with the SwiGLU prologue applied where asked (silu(gate) * up in f32,
// rounded to the input dtype, as the CUDA-core kernel does).
//
// K. The 8 warps of a block take interleaved k-steps of the block's K range, and their sums are
// added in shared memory in warp order. Where the 64-column tiles are too few to fill the GPU, K
// is split over a thread-block cluster whose blocks add their sums through distributed shared
// memory in rank order (compute capability 9.0 and up); PlanDenseMma says how many slices. Deterministic: no atomics, no workspace, one kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/cluster_launch.h"
#include "cuda/cuda_check.h"
#include "cuda/device_gemm.h"
#include "cuda/float_convert.cuh"
#include "cuda/vector_loads.cuh"

namespace te_async {
namespace {

namespace ffi = xla::ffi;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kBlocksPerSm = 2;
constexpr int kTileN = 64;   // columns per block
constexpr int kStepK = 16;   // k-rows per mma
constexpr int kUnroll = 2;   // k-steps a warp loads before their mmas (4 KB of weights in flight per warp)
constexpr int kMaxSlices = kPortableClusterSize;
constexpr int kRows = static_cast<int>(kDenseMmaMaxRows);
constexpr int kLd = kTileN + 4;  // padded row of the per-warp sums

struct MmaArgs {
  const void* x;
  const void* w;
  void* out;
  int rows, k, n;
  int x_ld;     // x's row length: K, or 2K with the SwiGLU prologue
  int slices;   // blocks of a cluster, each a K range of slice_k rows (a multiple of kStepK)
  int slice_k;
};

template <typename T>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// x[row][k], x[row][k + 1] as the two 16-bit halves of an A fragment register (0 past the rows);
// with the SwiGLU prologue, their activations (gates at k, ups at K + k).
template <typename T, bool kSwiglu>
__device__ __forceinline__ uint32_t LoadA(const MmaArgs& a, int row, int k) {
  if (row >= a.rows) return 0u;
  const T* p = static_cast<const T*>(a.x) + static_cast<long long>(row) * a.x_ld + k;
  const unsigned int v = __ldg(reinterpret_cast<const unsigned int*>(p));
  if constexpr (!kSwiglu) {
    return v;
  } else {
    const unsigned int u = __ldg(reinterpret_cast<const unsigned int*>(p + a.k));
    return PackPair<T>(SwigluF32(RawToFloat<T>(v & 0xffffu), RawToFloat<T>(u & 0xffffu)),
                       SwigluF32(RawToFloat<T>(v >> 16), RawToFloat<T>(u >> 16)));
  }
}

template <typename T>
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

template <typename T, typename TO, bool kSwiglu, bool kSplit>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) DenseMmaKernel(MmaArgs a) {
  __shared__ __align__(16) float sums[kWarps][kRows][kLd];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int slice = kSplit ? static_cast<int>(blockIdx.x) % a.slices : 0;
  const int n0 = (kSplit ? static_cast<int>(blockIdx.x) / a.slices : static_cast<int>(blockIdx.x)) * kTileN;
  const int k_begin = slice * a.slice_k, k_end = min(a.k, k_begin + a.slice_k);
  const int steps = (k_end - k_begin) / kStepK;
  const long long n = a.n;
  const bool col_in = n0 + 8 * g < a.n;  // N % 8 == 0: a lane's 8 columns are all in or all out
  const T* wp = static_cast<const T*>(a.w) + static_cast<long long>(k_begin + 2 * t) * n + n0 + 8 * g;

  float acc[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

#pragma unroll 1
  for (int s0 = warp; s0 < steps; s0 += kWarps * kUnroll) {
    uint4 wv[kUnroll][4];
    uint32_t av[kUnroll][4];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {  // every load of the batch first, then the mmas
      const int s = s0 + u * kWarps;
      const bool on = s < steps;
      const T* p = wp + static_cast<long long>(s) * kStepK * n;
      const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
      wv[u][0] = on && col_in ? LoadStream(p) : zero;
      wv[u][1] = on && col_in ? LoadStream(p + n) : zero;
      wv[u][2] = on && col_in ? LoadStream(p + 8 * n) : zero;
      wv[u][3] = on && col_in ? LoadStream(p + 9 * n) : zero;
      const int k = k_begin + s * kStepK + 2 * t;
      av[u][0] = on ? LoadA<T, kSwiglu>(a, g, k) : 0u;
      av[u][1] = on ? LoadA<T, kSwiglu>(a, g + 8, k) : 0u;
      av[u][2] = on ? LoadA<T, kSwiglu>(a, g, k + 8) : 0u;
      av[u][3] = on ? LoadA<T, kSwiglu>(a, g + 8, k + 8) : 0u;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const unsigned int sel = (j & 1) ? 0x7632u : 0x5410u;  // the high or the low halves of two words
        const uint32_t b0 = __byte_perm(Word(wv[u][0], j >> 1), Word(wv[u][1], j >> 1), sel);
        const uint32_t b1 = __byte_perm(Word(wv[u][2], j >> 1), Word(wv[u][3], j >> 1), sel);
        Mma<T>(acc[j], av[u], b0, b1);
      }
    }
  }

  // This warp's sums, [row][column of the tile]: lane (g, t) holds columns 16t .. 16t + 15.
  float* mine = &sums[warp][0][0];
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // rows g and g + 8 (c0, c1 and c2, c3)
    if (half == 1 && a.rows <= 8) break;
    float* row = mine + (g + 8 * half) * kLd + 16 * t;
    reinterpret_cast<float4*>(row)[0] = make_float4(acc[0][2 * half], acc[1][2 * half], acc[2][2 * half], acc[3][2 * half]);
    reinterpret_cast<float4*>(row)[1] = make_float4(acc[4][2 * half], acc[5][2 * half], acc[6][2 * half], acc[7][2 * half]);
    reinterpret_cast<float4*>(row)[2] =
        make_float4(acc[0][2 * half + 1], acc[1][2 * half + 1], acc[2][2 * half + 1], acc[3][2 * half + 1]);
    reinterpret_cast<float4*>(row)[3] =
        make_float4(acc[4][2 * half + 1], acc[5][2 * half + 1], acc[6][2 * half + 1], acc[7][2 * half + 1]);
  }
  __syncthreads();

  TO* out = static_cast<TO*>(a.out);
  const int count = a.rows * kTileN;
  for (int o = threadIdx.x; o < count; o += kThreads) {
    const int r = o / kTileN, c = o % kTileN;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += sums[w][r][c];
    if constexpr (kSplit) {
      sums[0][r][c] = s;  // only this thread reads or writes element (r, c) of warp 0's sums
    } else if (n0 + c < a.n) {
      out[static_cast<long long>(r) * n + n0 + c] = FromFloat<TO>(s);
    }
  }
  if constexpr (kSplit) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every slice's sums are in its shared memory
    const int per = (count + a.slices - 1) / a.slices, begin = static_cast<int>(cluster.block_rank()) * per;
    for (int o = begin + threadIdx.x; o < min(count, begin + per); o += kThreads) {
      const int r = o / kTileN, c = o % kTileN;
      float s = 0.f;
      for (int q = 0; q < a.slices; ++q) s += cluster.map_shared_rank(&sums[0][0][0], q)[r * kLd + c];
      if (n0 + c < a.n) out[static_cast<long long>(r) * n + n0 + c] = FromFloat<TO>(s);
    }
    cluster.sync();  // no block leaves while another still reads its sums
#else
    __trap();  // PlanDenseMma never splits below compute capability 9.0
#endif
  }
}

template <typename T, typename TO, bool kSwiglu>
void (*KernelOf(bool split))(MmaArgs) {
  return split ? DenseMmaKernel<T, TO, kSwiglu, true> : DenseMmaKernel<T, TO, kSwiglu, false>;
}

// The K split of a call. A block keeps 32 KB of weights in flight, so the HBM is only kept busy
// with (nearly) every slot of kBlocksPerSm blocks per SM taken. Where the 64-column tiles fit in
// one wave, the most slices (up to kMaxSlices, at least one k-step per warp, no more blocks than
// slots) whose clusters are all resident at once; a second wave of short blocks costs more than
// it saves (DeepSeek-V2-Lite's [2048, 5632] on an H200, 2026-12-03: 14-17 us in two waves of six
// slices against 9 for one wave of small_groups). Past one wave, the slices with the least time in
// waves, ceil(tiles / resident clusters) / slices (DeepSeek-V3's [1536, 24576], 384 tiles: two
// slices fill 2.9 of 3 waves where one fills 1.45 of 2); fewer on a tie.
template <typename T, typename TO, bool kSwiglu>
ffi::ErrorOr<MmaArgs> PlanDenseMma(const DeviceGemm& g, MmaArgs a) {
  const long long tiles = CeilDiv(a.n, kTileN), slots = static_cast<long long>(kBlocksPerSm) * g.sm_count;
  const long long most = g.compute_capability >= 90 ? std::min<long long>(kMaxSlices, a.k / (kStepK * kWarps)) : 1;
  double best = static_cast<double>(CeilDiv(tiles, slots));  // one slice: whole-K blocks in waves of `slots`
  a.slices = 1;
  a.slice_k = a.k;
  for (int want = 2; want <= most; ++want) {
    const int slice_k = static_cast<int>(CeilDiv(CeilDiv(a.k, want), kStepK) * kStepK);
    const int slices = static_cast<int>(CeilDiv(a.k, slice_k));
    if (slices != want) continue;                      // the same split as a smaller count
    if (tiles <= slots && tiles * slices > slots) break;  // one wave: no more blocks than slots
    auto clusters = ResidentClusters(KernelOf<T, TO, kSwiglu>(true), kThreads, slices);
    if (clusters.has_error()) return ffi::Unexpected(clusters.error());
    if (*clusters < 1) continue;
    const long long waves = CeilDiv(tiles, *clusters);
    if (tiles <= slots ? waves == 1 : static_cast<double>(waves) / slices < best - 1e-9) {
      best = static_cast<double>(waves) / slices;
      a.slices = slices;
      a.slice_k = slice_k;
    }
  }
  return a;
}

template <typename T, typename TO, bool kSwiglu>
ffi::Error Launch(const DeviceGemm& g, cudaStream_t stream) {
  MmaArgs a;
  a.x = g.lhs;
  a.w = g.rhs;
  a.out = g.out;
  a.rows = static_cast<int>(g.s.rows);
  a.k = static_cast<int>(g.s.k);
  a.n = static_cast<int>(g.s.n);
  a.x_ld = kSwiglu ? 2 * a.k : a.k;
  auto plan = PlanDenseMma<T, TO, kSwiglu>(g, a);
  if (plan.has_error()) return plan.error();
  a = *plan;
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config = ClusterLaunchConfig(CeilDiv(a.n, kTileN) * a.slices, kThreads, a.slices, stream, attr);
  return CudaStatus(cudaLaunchKernelEx(&config, KernelOf<T, TO, kSwiglu>(a.slices > 1), a),
                    "launch of dense_mma kernel DenseMmaKernel");
}

template <typename T, typename TO>
ffi::Error LaunchTyped(const DeviceGemm& g, bool swiglu, cudaStream_t stream) {
  return swiglu ? Launch<T, TO, true>(g, stream) : Launch<T, TO, false>(g, stream);
}

}  // namespace

bool DenseMmaFits(const GroupedGemmShape& s) {
  using ffi::DataType;
  const bool types = (s.in_type == DataType::BF16 || s.in_type == DataType::F16) &&
                     (s.out_type == s.in_type || s.out_type == DataType::F32);
  return types && s.groups == 1 && !s.transpose_rhs && !s.ragged_k && s.rows >= 1 && s.rows <= kDenseMmaMaxRows &&
         s.k > 0 && s.k % kStepK == 0 && s.k <= INT32_MAX / 2 && s.n > 0 && s.n % 8 == 0 && s.n <= INT32_MAX / 2;
}

ffi::Error LaunchDenseMma(const DeviceGemm& g, bool swiglu, cudaStream_t stream) {
  if (!DenseMmaFits(g.s)) {
    return ffi::Error::InvalidArgument("te_async: dense_mma: the call does not fit the tensor-core kernel");
  }
  if (!Aligned16(g.lhs) || !Aligned16(g.rhs)) {  // XLA's buffers are; a caller's raw pointers may not be
    SmallGroupsFusion fusion;
    fusion.swiglu = swiglu;
    return LaunchSmallGroups(g, stream, fusion);
  }
  using ffi::DataType;
  const DataType in = g.s.in_type, out = g.s.out_type;
  if (in == DataType::BF16 && out == DataType::BF16) return LaunchTyped<__nv_bfloat16, __nv_bfloat16>(g, swiglu, stream);
  if (in == DataType::BF16) return LaunchTyped<__nv_bfloat16, float>(g, swiglu, stream);
  if (out == DataType::F16) return LaunchTyped<__half, __half>(g, swiglu, stream);
  return LaunchTyped<__half, float>(g, swiglu, stream);
}

}  // namespace te_async
