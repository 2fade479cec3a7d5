// Harness of route_phases.py (see there). The router's shape from -DPROBE_E, -DPROBE_K, -DPROBE_SLOTS (the top-k
// form's slots, E <= 32 slots), -DPROBE_RENORM; H 2048, bf16. Defaults: DeepSeek-V2-Lite's (E 64, top-6, no
// renormalisation); Qwen3-30B-A3B: -DPROBE_E=128 -DPROBE_K=8 -DPROBE_SLOTS=4 -DPROBE_RENORM=true.
#ifndef PROBE_E
#define PROBE_E 64
#define PROBE_K 6
#define PROBE_SLOTS 2
#define PROBE_RENORM false
#endif
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cooperative_groups.h>
#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <vector>
#include "cuda/float_convert.cuh"
#include "cuda/programmatic_launch.cuh"
#include "cuda/route_top_k.cuh"
#include "cuda/vector_loads.cuh"
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s line %d\n", cudaGetErrorString(e_), __LINE__); return 1; } } while (0)
__device__ unsigned long long* g_ns;   // [block][16]
__device__ long long* g_clk;           // [block][16]
__device__ __forceinline__ unsigned long long GlobalNs() { unsigned long long t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }
#define STAMP(k) do { if (threadIdx.x == 0) { g_ns[blockIdx.x * 16 + (k)] = GlobalNs(); g_clk[blockIdx.x * 16 + (k)] = clock64(); } } while (0)
namespace te_async {
namespace {
constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 2;  // measured as fast as one 512-thread block and faster than four (docs/internals.md, TF)
constexpr int kRouteSlices = 8;  // RouteTokenKernel's cluster (the portable size): 32 KB of router each at E = 64, H = 2048
constexpr int kVec = 8;           // 16-bit elements per 16-byte vector (4 for a float32 router)
constexpr int kUnroll = 8;        // loads in flight per thread
constexpr int kNormSums = 32;     // sums of 8 threads' partials of x^2, in one order for both kernels
constexpr int kMaxHidden = 4096;  // x in shared memory as f32, with the sums' scratch
constexpr int kMaxUnits = 256;
constexpr int kMaxSlices = 8;     // blocks of an item's cluster: the portable cluster size

struct TokenNorm {
  const void* scale = nullptr;  // [H], x's dtype or f32; nullptr: x is used as it is
  bool scale_f32 = false;
  bool round_first = false;
  float eps = 0.f;
};

struct TokenFfnArgs {
  const void* x;             // [H]
  TokenNorm norm;
  const void* w1;            // routed [E, H, 2F]
  const void* w2;            // routed [E, F, H]
  const int32_t* experts;    // [k]
  const float* weights;      // [k]
  const void* shared_w1;     // [H, 2Fs]
  const void* shared_w2;     // [Fs, H]
  const float* shared_scale; // [1], or nullptr: 1
  float* out;                // [items, H]
  int hidden, num_experts, top_k, ffn, shared_ffn, units;
  int slices;                // blocks of an item's cluster, each on a share of H (1: no cluster)
  int blocks_per_choice;     // items of one routed choice: ceil(ffn / units)
  int shared_items;          // the shared experts' items, first in the grid: ceil(shared_ffn / units)
  int items;                 // the grid: shared_items + top_k * blocks_per_choice
};

struct RouteTokenArgs {
  const void* x;             // [H]
  TokenNorm norm;
  bool router_reads_normed;  // the router reads norm(x), else x
  const void* router;        // [H, E], x's dtype or float32
  TopKOptions top;
  int hidden;
  float* weights;            // [k]
  int32_t* experts;          // [k]
};

struct ReduceArgs {
  const float* partial;      // [items, H], TokenFfnKernel's
  const void* x;             // [H], the residual where `residual`
  void* out;                 // [H], x's dtype
  int items, hidden;
  bool residual;
};

constexpr int kReduceColumns = 8;  // columns of a ReducePartialsKernel block: 32 bytes of each item

// Router vectors a thread loads before the norm: all of its share of a [2048, 64] slice (256 rows).
template <typename W>
constexpr int kRoutePreload = 64 / Elem<W>::kVec;

constexpr size_t FfnSharedBytes(int hidden, int units) {
  return sizeof(float) * (hidden + 5 * units + kNormSums + kThreads * kVec);
}

constexpr size_t RouteSharedBytes(int hidden, int experts) {
  return sizeof(float) * (hidden + kRouteSlices * experts + kNormSums + kThreads * kVec);
}

// x [H] -> xs [H] as f32, RMS-normalised when n.scale is set: y = x * rsqrt(mean(x^2) + eps), then
// (round_first: transformers' RMSNorm) round(round(y) * round(scale)) or (te_async.mlp.normalize)
// round(y * scale). x and the scale are loaded into registers, so that the scale's read does not
// wait for the norm's reduction. The sum of squares is taken in one fixed order (thread t's
// partial over i = t, t + 256, ...; each 8 consecutive threads' partials in order, by shuffles;
// the 32 sums by a butterfly, which every warp runs itself, so one barrier serves it), so both
// kernels of the MoE call get the same x. sums: kNormSums floats.
template <typename T>
__device__ void LoadToken(const T* x, int hidden, const TokenNorm& n, float* xs, float* sums) {
  static_assert(kThreads == 8 * kNormSums, "a norm sum is 8 threads' partials");
  constexpr int kPer = kMaxHidden / kThreads;
  const int tid = threadIdx.x, lane = tid % 32;
  float v[kPer], scale[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = tid + j * kThreads;
    if (i < hidden) {
      v[j] = ToFloat<T>(x[i]);
      if (n.scale != nullptr) {
        scale[j] = n.scale_f32 ? static_cast<const float*>(n.scale)[i] : ToFloat<T>(static_cast<const T*>(n.scale)[i]);
      }
    }
  }
  float r = 1.f;
  if (n.scale != nullptr) {
    float partial = 0.f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (tid + j * kThreads < hidden) partial = fmaf(v[j], v[j], partial);
    }
    float eight = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) eight += __shfl_sync(0xffffffffu, partial, (lane & ~7) + j);
    if (lane % 8 == 0) sums[tid / 8] = eight;
    __syncthreads();
    r = rsqrtf(WarpSum(sums[lane]) / static_cast<float>(hidden) + n.eps);
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = tid + j * kThreads;
    if (i >= hidden) continue;
    if (n.scale == nullptr) {
      xs[i] = v[j];
      continue;
    }
    float y = v[j] * r, sc = scale[j];
    if (n.round_first) y = Rounded<T>(y), sc = Rounded<T>(sc);
    xs[i] = Rounded<T>(y * sc);
  }
  __syncthreads();
}

// For each 16-byte column vector c < nvec of w (V = 16 / sizeof(W) elements, at element offset
// column(c) in a row): the sum over r < rows of coef[r] * w[r * ld + column(c) + j], j < V, in f32,
// handed to store(c * V + j, sum). Threads own one vector and every G-th row; the G partial sums
// are added in group order. scratch: kBlock * V floats.
template <typename W, int kBlock, typename Column, typename Store>
__device__ __forceinline__ void WeightedRowSum(const W* __restrict__ w, long long ld, int rows,
                                               const float* coef, int nvec, Column column, float* scratch,
                                               Store store) {
  constexpr int V = Elem<W>::kVec;
  const int tid = threadIdx.x;
  for (int base = 0; base < nvec; base += kBlock) {
    const int width = min(kBlock, nvec - base);
    const int groups = kBlock / width;
    const int v = tid % width, g = tid / width;
    if (g < groups) {
      float acc[V] = {};
      const W* p = w + column(base + v);
      for (int r0 = g; r0 < rows; r0 += groups * kUnroll) {
        uint4 q[kUnroll];
#pragma unroll
        for (int i = 0; i < kUnroll; ++i) {
          const int r = r0 + i * groups;
          q[i] = r < rows ? LoadStream(p + r * ld) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int i = 0; i < kUnroll; ++i) {
          const int r = r0 + i * groups;
          if (r < rows) {
            float f[V];
            Unpack<W>(q[i], f);
            const float c = coef[r];
#pragma unroll
            for (int j = 0; j < V; ++j) acc[j] = fmaf(c, f[j], acc[j]);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < V; ++j) scratch[(g * width + v) * V + j] = acc[j];
    }
    __syncthreads();
    for (int c = tid; c < width * V; c += kBlock) {
      float s = 0.f;
      for (int gg = 0; gg < groups; ++gg) s += scratch[gg * width * V + c];
      store(base * V + c, s);
    }
    __syncthreads();
  }
}

// One block's slice of the router GEMM, rows r0 .. r0 + rows of router [H, E] times xs[r0 ..]:
// thread (g, v) owns 16-byte vector v of rows g, g + G, ... (G = kThreads / (E / V) row groups), in
// increasing order. Its first kRoutePreload vectors are loaded before the norm, into registers,
// so that their latency overlaps x's load and the norm's reduction instead of following them.
// Leaves the G partial sums in scratch [G, E] and returns G.
template <typename T, typename W>
__device__ __forceinline__ int RouterSlice(const RouteTokenArgs& a, int r0, int rows, float* xs, float* sums,
                                           float* scratch) {
  constexpr int kPreload = kRoutePreload<W>;
  constexpr int V = Elem<W>::kVec;
  const int tid = threadIdx.x, experts = a.top.experts;
  const int nvec = experts / V, groups = kThreads / nvec, v = tid % nvec, g = tid / nvec;
  const bool owner = g < groups;
  const W* col = static_cast<const W*>(a.router) + static_cast<long long>(r0) * experts + v * V;
  auto load = [&](int r) {
    return owner && r < rows ? LoadStream(col + static_cast<long long>(r) * experts) : make_uint4(0u, 0u, 0u, 0u);
  };
  uint4 pre[kPreload];
#pragma unroll
  for (int i = 0; i < kPreload; ++i) pre[i] = load(g + i * groups);
  STAMP(1);
  LoadToken<T>(static_cast<const T*>(a.x), a.hidden, a.router_reads_normed ? a.norm : TokenNorm{}, xs, sums);
  STAMP(2);
  float acc[V] = {};
  auto add = [&](const uint4& q, int r) {
    if (!owner || r >= rows) return;
    float f[V];
    Unpack<W>(q, f);
    const float c = xs[r0 + r];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = fmaf(c, f[j], acc[j]);
  };
#pragma unroll
  for (int i = 0; i < kPreload; ++i) add(pre[i], g + i * groups);
  for (int rb = g + kPreload * groups; owner && rb < rows; rb += kUnroll * groups) {
    uint4 q[kUnroll];
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) q[i] = load(rb + i * groups);
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) add(q[i], rb + i * groups);
  }
  STAMP(3);
  if (owner) {
#pragma unroll
    for (int j = 0; j < V; ++j) scratch[g * experts + v * V + j] = acc[j];
  }
  __syncthreads();
  STAMP(4);
  return groups;
}

// The norm, the router GEMM and the top-k of one token. Each block of the cluster computes its
// slice's partial logits and writes them into rank 0's shared memory; rank 0 adds them in rank
// order and runs the block top-k, while the other blocks have already exited.
template <typename T, typename W, typename Form>
__global__ void __launch_bounds__(kThreads) RouteTokenKernel(RouteTokenArgs a) {
  STAMP(0);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  StartDependents();  // TokenFfnKernel may start: it waits where it needs the routing
  __cluster_barrier_arrive_relaxed();  // with the wait below, before the first write to rank 0: every block has started
  const int rank = static_cast<int>(__clusterRelativeBlockRank()), slices = static_cast<int>(__clusterSizeInBlocks());
#else
  const int rank = 0, slices = 1;
#endif
  extern __shared__ float smem[];
  const int experts = a.top.experts, tid = threadIdx.x;
  float* xs = smem;                                  // [H]
  float* partials = xs + a.hidden;                   // [slices, E]: in rank 0, every slice's partial logits
  float* sums = partials + kRouteSlices * experts;   // [kNormSums]
  float* scratch = sums + kNormSums;                 // [kThreads * kVec]: the row groups' partials, then the top-k's
  const int per = (a.hidden + slices - 1) / slices, r0 = min(a.hidden, rank * per), rows = min(per, a.hidden - r0);
  const int groups = RouterSlice<T, W>(a, r0, rows, xs, sums, scratch);
  float mine = 0.f;  // expert tid's sum of the row groups (E <= kThreads), before the cluster's wait (table RT)
  if (tid < experts) {
    for (int gg = 0; gg < groups; ++gg) mine += scratch[gg * experts + tid];
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __cluster_barrier_wait();
  STAMP(5);
  float* slice = static_cast<float*>(__cluster_map_shared_rank(partials, 0)) + rank * experts;
#else
  float* slice = partials;
#endif
  if (tid < experts) slice[tid] = mine;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  STAMP(6);
  __cluster_barrier_arrive();  // releases this slice's writes; rank 0 acquires them in its wait
  if (rank != 0) return;
  __cluster_barrier_wait();
  STAMP(7);
#else
  __syncthreads();
#endif
  for (int e = tid; e < experts; e += kThreads) {  // the slices added in rank order, into slice 0
    float l = partials[e];
    for (int q = 1; q < slices; ++q) l += partials[q * experts + e];
    partials[e] = l;
  }
  __syncthreads();
  STAMP(8);
  BlockTopK<kThreads, Form>(partials, a.top, scratch, a.weights, a.experts);
  STAMP(9);
}

// Block `rank`'s share [begin, end) of n things split over `slices` blocks.
struct Share {
  int begin, end;
  __device__ Share(int n, int rank, int slices)
      : begin(static_cast<int>(1LL * n * rank / slices)), end(static_cast<int>(1LL * n * (rank + 1) / slices)) {}
};

// sums[c] = the cluster's `part`s added in rank order, c < n, in every block of the cluster (part:
// each block's own, in its shared memory). Every thread of the cluster calls it. One slice: a copy.
__device__ __forceinline__ void AddClusterParts(const float* part, float* sums, int n, int slices) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (slices > 1) {
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    cluster.sync();  // every block's part is in its shared memory
    for (int c = threadIdx.x; c < n; c += kThreads) {
      float s = 0.f;
      for (int q = 0; q < slices; ++q) s += cluster.map_shared_rank(part, q)[c];
      sums[c] = s;
    }
    __cluster_barrier_arrive();  // this block's reads are done; LeaveCluster waits for every block's
    __syncthreads();
    return;
  }
#endif
  for (int c = threadIdx.x; c < n; c += kThreads) sums[c] = part[c];
  __syncthreads();
}

// No block of a cluster leaves while another may still read its shared memory (AddClusterParts).
__device__ __forceinline__ void LeaveCluster(int slices) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (slices > 1) __cluster_barrier_wait();
#endif
}

//@BODY
}  // namespace
}  // namespace te_async
using namespace te_async;
__global__ void Flush(uint4* p, size_t n, unsigned long long* end) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = make_uint4(i, 1, 2, 3);
  __syncthreads();
  if (threadIdx.x == 0) end[blockIdx.x] = GlobalNs();
}
__global__ void ReadFlush(const uint4* p, size_t n, int evict_first, unsigned long long* end, int* sink) {
  unsigned acc = 0; uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint4 v;
    if (evict_first) asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p + i), "l"(pol));
    else asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p + i));
    acc ^= v.x ^ v.w;
  }
  if (acc == 0x1234567u) sink[0] = 1;
  __syncthreads();
  if (threadIdx.x == 0) end[blockIdx.x] = GlobalNs();
}
__global__ void Rewrite(__nv_bfloat16* dst, const __nv_bfloat16* src, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}
__global__ void Dependent(const int* experts, unsigned long long* entry, unsigned long long* waited, int* sink) {
  if (threadIdx.x == 0) entry[blockIdx.x] = GlobalNs();
  WaitForPrevious();
  if (threadIdx.x == 0) { waited[blockIdx.x] = GlobalNs(); sink[blockIdx.x] = experts[blockIdx.x % PROBE_K]; }
}
int main(int argc, char** argv) {
  const int mode = argc > 1 ? atoi(argv[1]) : 0;  // 0 write flush, 1 read flush, 2 read flush evict_first, 3 read flush + code warmed
  const int H = 2048, E = PROBE_E, K = PROBE_K, kDep = 239, kFlushBlocks = 264, kIters = 40;
  std::vector<__nv_bfloat16> hx(H), hs(H), hr((size_t)H * E);
  uint32_t s = 12345; auto rnd = [&] { s = s * 1664525u + 1013904223u; return ((s >> 8) & 0xffff) / 65536.f - 0.5f; };
  for (auto& v : hx) v = __float2bfloat16(rnd() * 4); for (auto& v : hs) v = __float2bfloat16(1 + rnd() * 0.2f);
  for (auto& v : hr) v = __float2bfloat16(rnd() * 0.1f);
  __nv_bfloat16 *x, *sc, *router; float* w; int *ex, *sink; uint4* flush; unsigned long long *ns, *fend, *dent, *dwait; long long* clk;
  const size_t flush_n = (size_t)192 << 20 >> 4;
  CK(cudaMalloc(&x, H * 2)); CK(cudaMalloc(&sc, H * 2)); CK(cudaMalloc(&router, (size_t)H * E * 2));
  CK(cudaMalloc(&w, 64)); CK(cudaMalloc(&ex, 64)); CK(cudaMalloc(&sink, 4 * kDep)); CK(cudaMalloc(&flush, flush_n * 16));
  CK(cudaMalloc(&ns, 8 * 16 * 8)); CK(cudaMalloc(&clk, 8 * 16 * 8)); CK(cudaMalloc(&fend, 8 * kFlushBlocks));
  CK(cudaMalloc(&dent, 8 * kDep)); CK(cudaMalloc(&dwait, 8 * kDep));
  CK(cudaMemcpy(x, hx.data(), H * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(sc, hs.data(), H * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(router, hr.data(), (size_t)H * E * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpyToSymbol(g_ns, &ns, 8)); CK(cudaMemcpyToSymbol(g_clk, &clk, 8));
  RouteTokenArgs r{};
  r.x = x; r.norm = TokenNorm{sc, false, true, 1e-6f}; r.router_reads_normed = true; r.router = router;
  r.top = TopKOptions{E, K, 1, 1, PROBE_RENORM, 1.f}; r.hidden = H; r.weights = w; r.experts = ex;
  const size_t smem = RouteSharedBytes(H, E);
  __nv_bfloat16 *x2, *router2; float* w2; int* ex2;  // the code-warming launch's own operands
  CK(cudaMalloc(&x2, H * 2)); CK(cudaMalloc(&router2, (size_t)H * E * 2)); CK(cudaMalloc(&w2, 64)); CK(cudaMalloc(&ex2, 64));
  CK(cudaMemcpy(x2, hx.data(), H * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(router2, hr.data(), (size_t)H * E * 2, cudaMemcpyHostToDevice));
  RouteTokenArgs r2 = r; r2.x = x2; r2.router = router2; r2.weights = w2; r2.experts = ex2;
  cudaStream_t st; CK(cudaStreamCreate(&st));
  std::vector<std::vector<double>> ph(16 + 16 + 8);  // rank0 phases, max of other ranks, extra
  for (int it = 0; it < kIters; ++it) {
    CK(cudaMemset(ns, 0, 8 * 16 * 8));
    if (mode == 0) Flush<<<kFlushBlocks, 512, 0, st>>>(flush, flush_n, fend);
    else ReadFlush<<<kFlushBlocks, 512, 0, st>>>(flush, flush_n, mode == 2, fend, sink);
    if (mode == 3) {
      cudaLaunchConfig_t c = {}; c.gridDim = dim3(8); c.blockDim = dim3(256); c.dynamicSmemBytes = smem; c.stream = st;
      cudaLaunchAttribute a; a.id = cudaLaunchAttributeClusterDimension; a.val.clusterDim.x = 8; a.val.clusterDim.y = 1; a.val.clusterDim.z = 1;
      c.attrs = &a; c.numAttrs = 1;
      CK(cudaLaunchKernelEx(&c, RouteTokenKernel<__nv_bfloat16, __nv_bfloat16, TopKForm<PROBE_SLOTS, false, false>>, r2));
    }
    Rewrite<<<8, 256, 0, st>>>(x, x2, H);
    cudaLaunchConfig_t c = {}; c.gridDim = dim3(8); c.blockDim = dim3(256); c.dynamicSmemBytes = smem; c.stream = st;
    cudaLaunchAttribute a; a.id = cudaLaunchAttributeClusterDimension; a.val.clusterDim.x = 8; a.val.clusterDim.y = 1; a.val.clusterDim.z = 1;
    c.attrs = &a; c.numAttrs = 1;
    CK(cudaLaunchKernelEx(&c, RouteTokenKernel<__nv_bfloat16, __nv_bfloat16, TopKForm<PROBE_SLOTS, false, false>>, r));
    CK(LaunchDependent(Dependent, dim3(kDep), dim3(256), 0, st, true, (const int*)ex, dent, dwait, sink));
    CK(cudaStreamSynchronize(st));
    std::vector<unsigned long long> hns(128), hf(kFlushBlocks), he(kDep), hw(kDep); std::vector<long long> hc(128);
    CK(cudaMemcpy(hns.data(), ns, 1024, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hc.data(), clk, 1024, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hf.data(), fend, 8 * kFlushBlocks, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(he.data(), dent, 8 * kDep, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hw.data(), dwait, 8 * kDep, cudaMemcpyDeviceToHost));
    if (it < 5) continue;  // warm-up
    unsigned long long t0 = ~0ull; for (int b = 0; b < 8; ++b) t0 = std::min(t0, hns[b * 16]);
    for (int k = 0; k < 16; ++k) {
      if (hns[k]) ph[k].push_back((double)(hns[k] - t0) / 1000);
      double mx = -1; for (int b = 1; b < 8; ++b) if (hns[b * 16 + k]) mx = std::max(mx, (double)(hns[b * 16 + k] - t0) / 1000);
      if (mx >= 0) ph[16 + k].push_back(mx);
    }
    const unsigned long long fe = *std::max_element(hf.begin(), hf.end());
    ph[32].push_back(((double)t0 - (double)fe) / 1000);
    ph[33].push_back(((double)*std::min_element(he.begin(), he.end()) - t0) / 1000);
    ph[34].push_back(((double)*std::min_element(hw.begin(), hw.end()) - t0) / 1000);
    ph[35].push_back(((double)*std::max_element(hw.begin(), hw.end()) - t0) / 1000);
    ph[36].push_back((double)(hc[9] - hc[0]) / ((double)(hns[9] - hns[0]) + 1e-9));  // rank 0's SM clock, GHz
  }
  auto med = [](std::vector<double> v) { if (v.empty()) return -1.0; std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  const char* names[10] = {"entry", "preloads issued", "x loaded, normed", "GEMV done", "groups in scratch", "cluster wait 1",
                           "slice summed", "rank 0 wait 2", "slices summed", "top-k written"};
  printf("mode %d (0 write flush, 1 read flush, 2 read flush evict_first, 3 read flush + code warmed; x rewritten after it)\n", mode);
  printf("us after the route's first block entry, median of %d (rank 0 | latest other rank)\n", kIters - 5);
  for (int k = 0; k < 10; ++k) printf("  S%d %-20s %7.2f | %7.2f\n", k, names[k], med(ph[k]), med(ph[16 + k]));
  printf("  flush end -> route entry %.2f; dependent first entry %.2f, first wake %.2f, last wake %.2f; rank 0 SM clock %.2f GHz\n",
         med(ph[32]), med(ph[33]), med(ph[34]), med(ph[35]), med(ph[36]));
  std::vector<float> hwt(K); std::vector<int> het(K);
  CK(cudaMemcpy(hwt.data(), w, 4 * K, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(het.data(), ex, 4 * K, cudaMemcpyDeviceToHost));
  printf("  experts"); for (int j = 0; j < K; ++j) printf(" %d:%.5f", het[j], hwt[j]); printf("\n");
  return 0;
}
