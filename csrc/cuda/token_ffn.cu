// One token's SwiGLU feed-forward in one kernel: the routed experts it chose and the shared experts
// (or a dense MLP), fc1, the activation and fc2 together (te_async/token_ffn.py). At one token per
// step a feed-forward's time is the read of its weights, and every launch between its GEMMs costs
// fixed latency; here each output unit u of an expert (gate column u, linear column u and row u of
// fc2) depends on nothing but x, so a block can run fc1, the activation and fc2 of a block of units
// without waiting for any other block: no grid barrier, no atomics, each block writes a partial
// output of its own.
//
// Two FFI calls, each ending in ReducePartialsKernel (below), which sums the blocks' partials:
// - te_async_token_ffn: TokenFfnKernel, on an x that is already normalised, with the experts and
//   weights of an earlier routing.
// - te_async_token_moe: a decoder's MoE block for one token, moe(rmsnorm(x)) routed in the call:
//   RouteTokenKernel (the norm, the router GEMM with its rows split over a thread-block cluster
//   of kRouteSlices blocks, each writing its partial logits into rank 0's shared memory, where
//   they are added in rank order, the block top-k of route_top_k.cuh; one block below compute
//   capability 9.0; the router's first loads are issued before the norm, see RouterSlice), then
//   TokenFfnKernel, which normalises x itself (the same code, so the same values). On compute
//   capability 9.0 and up the second is a programmatic dependent launch: the first triggers it
//   at once, so its blocks load x and the shared experts' blocks run while the routing runs; a
//   routed block waits (cudaGridDependencySynchronize) before it reads its expert. The kernels
//   are in one call, so XLA captures them into one graph node, where the programmatic edges hold.
//
// TokenFfnKernel. Work items: the units of each source (the shared experts, then routed choice c
// of the top-k) cut into blocks of `units` (a multiple of 8) -> one thread-block cluster of
// `slices` blocks per item (token_ffn.plan_split: wide blocks of units, so few items, split over
// clusters where that keeps the SMs filled; one block per item below compute capability 9.0,
// which has no clusters). The shared experts' blocks come first, so
// that the block scheduler starts them first: where the items exceed one wave of resident
// blocks, they are the ones that run during the routing (with one wave, as plan_split prefers,
// the order measured no different: docs/internals.md, table GM's notes; every block taking a
// shared slice before its routed item, so that all blocks read during the routing, measured
// slower, as did issuing each phase's first loads ahead: table TF's notes). Item i of choice c
// reads expert experts[c] on the GPU, so the kernel sits in a CUDA graph. Per block (256 threads)
// of rank r in its item's cluster:
//   1. x [H] to shared memory as f32 (normalised there in the MoE call).
//   2. fc1: the item's gate and linear columns (2 * units / 8 16-byte vectors per row of
//      w_fc1 [H, 2F]) times x, summed over the block's share of H (rows r * H / slices ..):
//      thread (g, v) owns vector v and rows g, g + G, ... (G row groups), 8 independent
//      ld.global.nc loads in flight per thread, f32 FMAs; the G partial sums of each column are
//      added in group order. Then each block adds the cluster's partial sums in rank order, read
//      from their shared memory (deterministic, and the same in every block of the cluster).
//   3. a[u] = silu(h_gate[u]) * h_lin[u], with h and a rounded to x's dtype as the unfused
//      path rounds them (grouped_mlp: fc1 writes x's dtype; te_async.mlp.activate).
//   4. fc2: rows u0 .. u0 + units of w_fc2 [F, H] times a, for the block's share of H's columns,
//      the same way, and that share of the item's f32 partial output, times the routing weight
//      (or the shared scale), goes to partial[i, :].
// ReducePartialsKernel then sums partial over the items for 8 columns a block (one load of every
// item's 32 bytes a thread, then a fixed tree: repeated runs give the same bits), rounds to x's
// dtype and, in the MoE call, adds the residual x. It is a programmatic dependent of
// TokenFfnKernel (compute capability 9.0 and up), so its blocks are resident and have read x when
// the last expert block ends. It replaced XLA's sum and its convert-and-add: about as fast, one
// kernel fewer (docs/internals.md, table UN's notes). A sum inside TokenFfnKernel, by
// the last block of each group of items and then the last group, measured slower than XLA's
// (46.8 against 39.0 us a layer in the whole model's B=1 step).
// An expert id outside [0, E) cannot be raised inside a graph: that item's row of out is NaN, so
// the token's output is NaN.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/float_convert.cuh"
#include "cuda/device_gemm.h"
#include "cuda/handlers.h"
#include "cuda/moe_routing.h"
#include "cuda/poison.h"
#include "cuda/programmatic_launch.cuh"
#include "cuda/route_top_k.cuh"
#include "cuda/vector_loads.cuh"
#include "grouped_gemm_args.h"

namespace te_async {
namespace {

namespace ffi = xla::ffi;

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 2;  // measured as fast as one 512-thread block and faster than four (docs/internals.md, TF)
constexpr int kRouteSlices = 8;  // RouteTokenKernel's cluster (the portable size): 32 KB of router each at E = 64, H = 2048
constexpr int kVec = 8;           // 16-bit elements per 16-byte vector (4 for a float32 router)
constexpr int kUnroll = 8;        // loads in flight per thread
constexpr int kNormSums = 32;     // sums of 8 threads' partials of x^2, in one order for both kernels
constexpr int kMaxHidden = 4096;  // x in shared memory as f32, with the sums' scratch
constexpr int kMaxUnits = 256;
constexpr int kMaxSlices = kPortableClusterSize;  // blocks of an item's cluster

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
  LoadToken<T>(static_cast<const T*>(a.x), a.hidden, a.router_reads_normed ? a.norm : TokenNorm{}, xs, sums);
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
  if (owner) {
#pragma unroll
    for (int j = 0; j < V; ++j) scratch[g * experts + v * V + j] = acc[j];
  }
  __syncthreads();
  return groups;
}

// The norm, the router GEMM and the top-k of one token. Each block of the cluster computes its
// slice's partial logits and writes them into rank 0's shared memory; rank 0 adds them in rank
// order and runs the block top-k, while the other blocks have already exited.
template <typename T, typename W, typename Form>
__global__ void __launch_bounds__(kThreads) RouteTokenKernel(RouteTokenArgs a) {
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
  float* slice = static_cast<float*>(__cluster_map_shared_rank(partials, 0)) + rank * experts;
#else
  float* slice = partials;
#endif
  if (tid < experts) slice[tid] = mine;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __cluster_barrier_arrive();  // releases this slice's writes; rank 0 acquires them in its wait
  if (rank != 0) return;
  __cluster_barrier_wait();
#else
  __syncthreads();
#endif
  for (int e = tid; e < experts; e += kThreads) {  // the slices added in rank order, into slice 0
    float l = partials[e];
    for (int q = 1; q < slices; ++q) l += partials[q * experts + e];
    partials[e] = l;
  }
  __syncthreads();
  BlockTopK<kThreads, Form>(partials, a.top, scratch, a.weights, a.experts);
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

template <typename T>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) TokenFfnKernel(TokenFfnArgs a) {
  StartDependents();  // ReducePartialsKernel's blocks may take the SMs' free slots and read x
  extern __shared__ float smem[];
  float* xs = smem;                    // [H]
  float* part = xs + a.hidden;         // [2 * units]: this block's fc1 sums over its rows
  float* h = part + 2 * a.units;       // [2 * units]: the cluster's, gate sums then linear sums
  float* act = h + 2 * a.units;        // [units]
  float* sums = act + a.units;         // [kNormSums]
  float* scratch = sums + kNormSums;   // [kThreads * kVec]
  const int item = blockIdx.x / a.slices, rank = blockIdx.x % a.slices, tid = threadIdx.x;
  const bool routed = item >= a.shared_items;
  const int choice = routed ? (item - a.shared_items) / a.blocks_per_choice : 0;
  const int ffn = routed ? a.ffn : a.shared_ffn;
  const int u0 = (routed ? (item - a.shared_items) % a.blocks_per_choice : item) * a.units;
  const int units = min(a.units, ffn - u0);
  float* out = a.out + static_cast<long long>(item) * a.hidden;
  const Share rows(a.hidden, rank, a.slices), columns(a.hidden / kVec, rank, a.slices);
  LoadToken<T>(static_cast<const T*>(a.x), a.hidden, a.norm, xs, sums);
  if (routed) WaitForPrevious();  // its expert and weight
  const int expert = routed ? a.experts[choice] : 0;
  const float scale = routed ? a.weights[choice] : a.shared_scale == nullptr ? 1.f : *a.shared_scale;
  if (routed && (expert < 0 || expert >= a.num_experts)) {  // alike in every block of the cluster
    for (int i = columns.begin * kVec + tid; i < columns.end * kVec; i += kThreads) out[i] = NAN;
    return;
  }
  const long long h2f = 2LL * a.hidden * ffn;
  const T* w1 = routed ? static_cast<const T*>(a.w1) + expert * h2f : static_cast<const T*>(a.shared_w1);
  const T* w2 = routed ? static_cast<const T*>(a.w2) + expert * (h2f / 2) : static_cast<const T*>(a.shared_w2);
  const int half = units / kVec;  // vectors of gate (and of linear) columns per row
  WeightedRowSum<T, kThreads>(
      w1 + 2LL * ffn * rows.begin, 2LL * ffn, rows.end - rows.begin, xs + rows.begin, 2 * half,
      [=](int c) { return static_cast<long long>(u0) + (c < half ? c * kVec : ffn + (c - half) * kVec); }, scratch,
      [=](int col, float s) { part[col] = s; });
  AddClusterParts(part, h, 2 * units, a.slices);
  for (int u = tid; u < units; u += kThreads) {
    const float gate = Rounded<T>(h[u]), lin = Rounded<T>(h[units + u]);
    act[u] = Rounded<T>(SwigluF32(gate, lin));
  }
  __syncthreads();
  WeightedRowSum<T, kThreads>(
      w2 + static_cast<long long>(u0) * a.hidden, a.hidden, units, act, columns.end - columns.begin,
      [=](int c) { return static_cast<long long>(columns.begin + c) * kVec; }, scratch,
      [=](int col, float s) { out[columns.begin * kVec + col] = scale * s; });
  LeaveCluster(a.slices);
}

// out[c] = round(sum over items of partial[item][c]), plus x[c] rounded again where residual (as
// x + round(y) in x's dtype is), for kReduceColumns columns c a block. Thread t adds items t,
// t + kThreads, ... in order, each warp its lanes by an xor butterfly, then the warps in order.
template <typename T>
__global__ void __launch_bounds__(kThreads) ReducePartialsKernel(ReduceArgs a) {
  __shared__ float warp_sums[kThreads / 32][kReduceColumns];
  const int c0 = blockIdx.x * kReduceColumns, tid = threadIdx.x;
  const float residual = a.residual && tid < kReduceColumns ? ToFloat<T>(static_cast<const T*>(a.x)[c0 + tid]) : 0.f;
  WaitForPrevious();  // TokenFfnKernel's partials
  float s[kReduceColumns] = {};
  for (int i = tid; i < a.items; i += kThreads) {
    const float4* p = reinterpret_cast<const float4*>(a.partial + static_cast<long long>(i) * a.hidden + c0);
    const float4 lo = p[0], hi = p[1];
    const float v[kReduceColumns] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int j = 0; j < kReduceColumns; ++j) s[j] += v[j];
  }
#pragma unroll
  for (int j = 0; j < kReduceColumns; ++j) {
    const float w = WarpSum(s[j]);
    if (tid % 32 == 0) warp_sums[tid / 32][j] = w;
  }
  __syncthreads();
  if (tid >= kReduceColumns) return;
  float y = warp_sums[0][tid];
  for (int w = 1; w < kThreads / 32; ++w) y += warp_sums[w][tid];
  y = Rounded<T>(y);
  static_cast<T*>(a.out)[c0 + tid] = FromFloat<T>(a.residual ? residual + y : y);
}

bool HasDims(const ffi::AnyBuffer& b, std::initializer_list<int64_t> dims) {
  const auto d = b.dimensions();
  return d.size() == dims.size() && std::equal(dims.begin(), dims.end(), d.begin());
}

// The feed-forward's operands, checked, as TokenFfnKernel's arguments (the norm left to the
// caller); `bad` words the error. k: the routed choices (0: none).
ffi::ErrorOr<TokenFfnArgs> FfnArgs(ffi::AnyBuffer x, ffi::AnyBuffer w1, ffi::AnyBuffer w2, int64_t k,
                                   ffi::AnyBuffer shared_w1, ffi::AnyBuffer shared_w2, ffi::AnyBuffer y,
                                   ffi::AnyBuffer out, int64_t units, int64_t slices, bool clusters,
                                   const std::function<ffi::Error(const std::string&)>& bad) {
  auto fail = [&](const std::string& why) { return ffi::Unexpected(bad(why)); };
  const auto xd = x.dimensions(), d1 = w1.dimensions(), d2 = w2.dimensions();
  const auto s1 = shared_w1.dimensions(), s2 = shared_w2.dimensions();
  const auto type = x.element_type();
  if (type != ffi::DataType::BF16 && type != ffi::DataType::F16) return fail("x must be bfloat16 or float16");
  if (xd.size() != 2 || xd[0] != 1) return fail("x must be [1, H]: one token");
  const int64_t hidden = xd[1];
  if (hidden % kVec != 0 || hidden < kVec || hidden > kMaxHidden) {
    return fail("H must be a multiple of 8 in [8, " + std::to_string(kMaxHidden) + "]");
  }
  if (d1.size() != 3 || d2.size() != 3 || d1[1] != hidden || d1[2] != 2 * d2[1] || d2[0] != d1[0] || d2[2] != hidden) {
    return fail("need w_fc1 [E, H, 2F] and w_fc2 [E, F, H]");
  }
  if (s1.size() != 2 || s2.size() != 2 || s1[0] != hidden || s1[1] != 2 * s2[0] || s2[1] != hidden) {
    return fail("need shared w_gate_up [H, 2Fs] and w_down [Fs, H] (Fs = 0: no shared experts)");
  }
  const int64_t num_experts = d1[0], ffn = d2[1], shared_ffn = s2[0];
  if (k > 0 && (num_experts < 1 || ffn < 1)) return fail("routed choices need at least one expert of F >= 1");
  if (ffn % kVec != 0 || shared_ffn % kVec != 0) return fail("F and Fs must be multiples of 8");
  for (const ffi::AnyBuffer* w : {&w1, &w2, &shared_w1, &shared_w2}) {
    if (w->element_type() != type) return fail("x and every weight must share a dtype");
  }
  if (units % kVec != 0 || units < kVec || units > kMaxUnits) {
    return fail("units must be a multiple of 8 in [8, " + std::to_string(kMaxUnits) + "], got " + std::to_string(units));
  }
  if (slices < 1 || slices > kMaxSlices || slices > hidden / kVec) {
    return fail("slices must be in [1, min(" + std::to_string(kMaxSlices) + ", H / 8)], got " + std::to_string(slices));
  }
  if (slices > 1 && !clusters) return fail("slices > 1 needs thread-block clusters (compute capability 9.0 and up)");
  const int64_t per_choice = k > 0 ? CeilDiv(ffn, units) : 0, shared_items = CeilDiv(shared_ffn, units);
  const int64_t items = k * per_choice + shared_items;
  if (items < 1) return fail("nothing to compute: no routed choices and no shared experts");
  if (y.element_type() != type || !HasDims(y, {1, hidden})) return fail("y must be [1, H] in x's dtype");
  if (out.element_type() != ffi::DataType::F32 || !HasDims(out, {items, hidden})) {
    return fail("out must be float32 [items, H] with items = k * ceil(F / units) + ceil(Fs / units) = " +
                std::to_string(items));
  }
  for (const void* p : {x.untyped_data(), w1.untyped_data(), w2.untyped_data(), shared_w1.untyped_data(),
                        shared_w2.untyped_data()}) {
    if (!Aligned16(p)) return fail("operands must be 16-byte aligned");
  }
  TokenFfnArgs a{};
  a.x = x.untyped_data();
  a.w1 = w1.untyped_data();
  a.w2 = w2.untyped_data();
  a.shared_w1 = shared_w1.untyped_data();
  a.shared_w2 = shared_w2.untyped_data();
  a.out = static_cast<float*>(out.untyped_data());
  a.hidden = static_cast<int>(hidden);
  a.num_experts = static_cast<int>(num_experts);
  a.top_k = static_cast<int>(k);
  a.ffn = static_cast<int>(ffn);
  a.shared_ffn = static_cast<int>(shared_ffn);
  a.units = static_cast<int>(units);
  a.slices = static_cast<int>(slices);
  a.blocks_per_choice = static_cast<int>(per_choice);
  a.shared_items = static_cast<int>(shared_items);
  a.items = static_cast<int>(items);
  return a;
}

// Whether the device takes programmatic dependent launches (compute capability 9.0 and up).
ffi::ErrorOr<bool> ProgrammaticLaunches() {
  auto info = QueryCurrentDevice();
  if (info.has_error()) return ffi::Unexpected(info.error());
  return info->compute_capability >= 90;
}

// TokenFfnKernel over a.items clusters of a.slices blocks (a programmatic dependent of
// RouteTokenKernel where after_routing), then ReducePartialsKernel into y [H] (of TokenFfnKernel
// where programmatic).
ffi::Error LaunchFfn(const TokenFfnArgs& a, ffi::DataType type, bool after_routing, bool programmatic, void* y,
                     bool residual, cudaStream_t stream) {
  const ReduceArgs r{a.out, a.x, y, a.items, a.hidden, residual};
  const auto launch = [&](auto ffn, auto reduce) {
    TE_ASYNC_RETURN_IF_ERROR(CudaStatus(
        LaunchDependentClusters(ffn, dim3(static_cast<unsigned>(a.items * a.slices)), dim3(kThreads),
                                FfnSharedBytes(a.hidden, a.units), stream, after_routing, a.slices, a),
        "launch of TokenFfnKernel"));
    return CudaStatus(LaunchDependent(reduce, dim3(static_cast<unsigned>(a.hidden / kReduceColumns)), dim3(kThreads), 0,
                                      stream, programmatic, r),
                      "launch of ReducePartialsKernel");
  };
  return type == ffi::DataType::BF16 ? launch(TokenFfnKernel<__nv_bfloat16>, ReducePartialsKernel<__nv_bfloat16>)
                                     : launch(TokenFfnKernel<__half>, ReducePartialsKernel<__half>);
}

ffi::Error TokenFfn(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer w1, ffi::AnyBuffer w2,
                    ffi::Buffer<ffi::S32> experts, ffi::Buffer<ffi::F32> weights, ffi::AnyBuffer shared_w1,
                    ffi::AnyBuffer shared_w2, ffi::Buffer<ffi::F32> shared_scale, ffi::Result<ffi::AnyBuffer> y,
                    ffi::Result<ffi::AnyBuffer> out, int64_t units, int64_t slices) {
  auto bad = [&](const std::string& what) {
    return ffi::Error::InvalidArgument("te_async token_ffn: " + what + " (x " + Dims(x) + ", w_fc1 " + Dims(w1) +
                                       ", w_fc2 " + Dims(w2) + ", shared w_gate_up " + Dims(shared_w1) +
                                       ", shared w_down " + Dims(shared_w2) + ", out " + Dims(*out) + ")");
  };
  const int64_t k = experts.element_count();
  if (weights.element_count() != k) return bad("experts and weights must have k entries");
  if (shared_scale.element_count() != 1) return bad("shared_scale must have one entry");
  const auto programmatic = ProgrammaticLaunches();
  if (programmatic.has_error()) return programmatic.error();
  auto a = FfnArgs(x, w1, w2, k, shared_w1, shared_w2, *y, *out, units, slices, *programmatic, bad);
  if (a.has_error()) return a.error();
  a->experts = experts.typed_data();
  a->weights = weights.typed_data();
  a->shared_scale = shared_scale.typed_data();
  TE_ASYNC_RETURN_IF_ERROR(PoisonOutputBuffers(stream, *y, *out));
  return LaunchFfn(*a, x.element_type(), false, *programmatic, y->untyped_data(), false, stream);
}

template <typename T>
ffi::Error LaunchRoute(const RouteTokenArgs& r, bool router_f32, bool hopper, size_t smem, cudaStream_t stream) {
  const int cluster = hopper ? kRouteSlices : 1;  // one block below compute capability 9.0
  const auto launch = [&](auto kernel) {
    return LaunchDependentClusters(kernel, dim3(cluster), dim3(kThreads), smem, stream, false, cluster, r);
  };
  cudaError_t status;  // one instantiation per top-k form (softmax only here), so that a launch holds its own code
  WithForm<false>(r.top, [&](auto form) {
    using Form = decltype(form);
    status = router_f32 ? launch(RouteTokenKernel<T, float, Form>) : launch(RouteTokenKernel<T, T, Form>);
  });
  return CudaStatus(status, "launch of RouteTokenKernel");
}

ffi::Error TokenMoe(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer norm_scale, ffi::AnyBuffer router,
                    ffi::AnyBuffer w1, ffi::AnyBuffer w2, ffi::AnyBuffer shared_w1, ffi::AnyBuffer shared_w2,
                    ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> out,
                    ffi::Result<ffi::Buffer<ffi::F32>> weights, ffi::Result<ffi::Buffer<ffi::S32>> experts,
                    int64_t units, int64_t slices, int64_t top_k, int64_t n_group, int64_t topk_group, bool renormalize, float scaling,
                    float eps, bool round_first, bool router_reads_normed, bool residual) {
  auto bad = [&](const std::string& what) {
    return ffi::Error::InvalidArgument("te_async token_moe: " + what + " (x " + Dims(x) + ", norm scale " +
                                       Dims(norm_scale) + ", router " + Dims(router) + ", w_fc1 " + Dims(w1) +
                                       ", w_fc2 " + Dims(w2) + ", shared w_gate_up " + Dims(shared_w1) +
                                       ", shared w_down " + Dims(shared_w2) + ")");
  };
  const auto programmatic = ProgrammaticLaunches();
  if (programmatic.has_error()) return programmatic.error();
  auto a = FfnArgs(x, w1, w2, top_k, shared_w1, shared_w2, *y, *out, units, slices, *programmatic, bad);
  if (a.has_error()) return a.error();
  const int64_t hidden = a->hidden, num_experts = a->num_experts;
  if (num_experts < 1 || num_experts > kRouteMaxExperts || num_experts % kVec != 0) {
    return bad("the router needs E a multiple of 8 in [8, " + std::to_string(kRouteMaxExperts) + "]");
  }
  if (top_k < 1 || top_k > num_experts || top_k > 32) return bad("top_k must be in [1, min(E, 32)]");
  if (n_group < 1 || n_group > 32 || num_experts % n_group != 0 || topk_group < 1 || topk_group > n_group) {
    return bad("n_group must divide E and be at most 32, 1 <= topk_group <= n_group");
  }
  const auto router_type = router.element_type();
  if (!HasDims(router, {hidden, num_experts}) || (router_type != x.element_type() && router_type != ffi::DataType::F32)) {
    return bad("router must be [H, E], float32 or x's dtype");
  }
  const auto scale_type = norm_scale.element_type();
  if (!HasDims(norm_scale, {hidden}) || (scale_type != x.element_type() && scale_type != ffi::DataType::F32)) {
    return bad("the norm scale must be [H], float32 or x's dtype");
  }
  const std::initializer_list<int64_t> routing_dims = {1, top_k};
  const auto wd = weights->dimensions(), ed = experts->dimensions();
  if (!std::equal(wd.begin(), wd.end(), routing_dims.begin(), routing_dims.end()) ||
      !std::equal(ed.begin(), ed.end(), routing_dims.begin(), routing_dims.end())) {
    return bad("weights and experts must be [1, top_k]");
  }
  if (!Aligned16(router.untyped_data())) return bad("operands must be 16-byte aligned");
  const TokenNorm norm{norm_scale.untyped_data(), scale_type == ffi::DataType::F32, round_first, eps};
  a->norm = norm;
  a->experts = experts->typed_data();
  a->weights = weights->typed_data();
  a->shared_scale = nullptr;
  const RouteTokenArgs r{x.untyped_data(),
                         norm,
                         router_reads_normed,
                         router.untyped_data(),
                         TopKOptions{static_cast<int>(num_experts), static_cast<int>(top_k), static_cast<int>(n_group),
                                     static_cast<int>(topk_group), renormalize, scaling},
                         static_cast<int>(hidden),
                         weights->typed_data(),
                         experts->typed_data()};
  TE_ASYNC_RETURN_IF_ERROR(PoisonOutputBuffers(stream, *y, *out, *weights, *experts));
  const bool hopper = *programmatic, router_f32 = router_type == ffi::DataType::F32;
  const size_t smem = RouteSharedBytes(static_cast<int>(hidden), static_cast<int>(num_experts));
  TE_ASYNC_RETURN_IF_ERROR(x.element_type() == ffi::DataType::BF16
                               ? LaunchRoute<__nv_bfloat16>(r, router_f32, hopper, smem, stream)
                               : LaunchRoute<__half>(r, router_f32, hopper, smem, stream));
  return LaunchFfn(*a, x.element_type(), hopper, hopper, y->untyped_data(), residual, stream);
}

static_assert(FfnSharedBytes(kMaxHidden, kMaxUnits) <= 48 * 1024, "dynamic shared memory past the default limit");
static_assert(RouteSharedBytes(kMaxHidden, kRouteMaxExperts) <= 48 * 1024, "dynamic shared memory past the default limit");
static_assert(kRouteMaxExperts <= kThreads && 2 * kRouteMaxExperts + 64 <= kThreads * kVec,
              "BlockTopK's experts and shared memory");
static_assert(kVec % kReduceColumns == 0, "ReducePartialsKernel's blocks tile every H that FfnArgs accepts");

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kTokenFfnCuda, TokenFfn,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("units")
                                  .Attr<int64_t>("slices"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(kTokenMoeCuda, TokenMoe,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<int64_t>("units")
                                  .Attr<int64_t>("slices")
                                  .Attr<int64_t>("top_k")
                                  .Attr<int64_t>("n_group")
                                  .Attr<int64_t>("topk_group")
                                  .Attr<bool>("renormalize")
                                  .Attr<float>("scaling")
                                  .Attr<float>("eps")
                                  .Attr<bool>("round_first")
                                  .Attr<bool>("router_reads_normed")
                                  .Attr<bool>("residual"),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace te_async
