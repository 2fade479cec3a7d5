// The routing of a decode-sized batch by one thread block: router logits [T, E] -> each token's
// top-k experts and weights, the group sizes, and the stable order of the T*k (token, choice) pairs
// by expert with its inverse. te_async/routing.py holds the JAX reference it must match. Run by
// moe_routing.cu's RouteKernel (the logits from global memory) and route_rows.cu's RouteRowsKernel
// (from the shared memory of its cluster's first block).
//
// kRouteThreads threads (T*k <= kRouteMaxChoices, E <= kRouteMaxExperts: decode sizes).
//   1. Warp w routes tokens w, w+32, ..., two at a time while it has two (route_top_k.cuh), by
//      softmax or by DeepSeek-V3's sigmoid scoring with its optional correction bias [E].
//   2. Group sizes: integer atomics in shared memory (counts, so their order does not matter),
//      then an exclusive scan by one warp. Beside it every warp ranks its consecutive chunks of 32
//      choices (flat, token-major order), one after the other: a choice's rank among the warp's
//      earlier choices of its expert (__match_any_sync), and the warp's count of each expert.
//   3. Order: a choice's row is its expert's offset, plus the earlier warps' counts of its expert,
//      plus its rank: the stable sort, deterministic, no float atomics.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "xla/ffi/api/ffi.h"

#include "cuda/moe_routing.h"
#include "cuda/route_top_k.cuh"

namespace te_async {

constexpr int kRouteThreads = 1024;
constexpr int kRouteWarps = kRouteThreads / 32;
constexpr int kPerLane = kTopKPerLane;
static_assert(kRouteMaxExperts == 32 * kPerLane, "a warp holds a token's scores, kPerLane per lane");

struct RouteArgs {
  const float* logits;
  int tokens;
  TopKOptions top;
  float* weights;         // [T, k]
  int* chosen;            // [T, k]
  int* group_sizes;       // [E]
  int* choice_of_row;     // [T*k]: the flat (token, choice) index of each sorted row
  int* row_of_choice;     // [T*k]: the inverse
};

// Step 1 for tokens t[0..kTokens), by one warp: writes their k weights and experts and counts them
// in `count`.
template <int kTokens, typename Form>
__device__ void RouteTokens(const RouteArgs& a, const int (&t)[kTokens], int lane, int16_t* chosen_sh, int* count) {
  const float* rows[kTokens];
#pragma unroll
  for (int n = 0; n < kTokens; ++n) rows[n] = a.logits + static_cast<long long>(t[n]) * a.top.experts;
  float w[kTokens];
  int e[kTokens];
  WarpTopK<kTokens, Form>(rows, a.top, lane, w, e);
  if (lane < a.top.top_k) {
#pragma unroll
    for (int n = 0; n < kTokens; ++n) {
      const int at = t[n] * a.top.top_k + lane;
      a.weights[at] = w[n];
      a.chosen[at] = e[n];
      chosen_sh[at] = static_cast<int16_t>(e[n]);
      atomicAdd(&count[e[n]], 1);
    }
  }
}

constexpr int kChunkRounds = kRouteMaxChoices / kRouteThreads;  // chunks of 32 choices a warp, at most
static_assert(kRouteMaxChoices % kRouteThreads == 0 && kChunkRounds * 32 < 256 && kRouteMaxExperts <= 32768,
              "whole chunks; a warp's count of an expert in a byte; experts in int16");

// The routing of a.tokens tokens by one block of kRouteThreads threads (steps 1-3 above); a.logits
// may point into shared memory.
template <typename Form>
__device__ inline void RouteBlock(const RouteArgs& a) {
  __shared__ int16_t chosen[kRouteMaxChoices];
  __shared__ int count[kRouteMaxExperts];
  __shared__ int offset[kRouteMaxExperts];
  __shared__ __align__(4) uint8_t warp_count[kRouteWarps * kRouteMaxExperts];  // [warp][E]: its chunks' choices of e
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, experts = a.top.experts;
  const int choices = a.tokens * a.top.top_k;
  const int rounds = (choices + kRouteThreads - 1) / kRouteThreads;  // warp w ranks chunks [w rounds, (w + 1) rounds)
  for (int e = tid; e < experts; e += kRouteThreads) count[e] = 0;
  for (int i = tid; i < kRouteWarps * experts / 4; i += kRouteThreads) reinterpret_cast<int*>(warp_count)[i] = 0;
  __syncthreads();
  int t = warp;
  for (; t + kRouteWarps < a.tokens; t += 2 * kRouteWarps) {
    RouteTokens<2, Form>(a, {t, t + kRouteWarps}, lane, chosen, count);
  }
  if (t < a.tokens) RouteTokens<1, Form>(a, {t}, lane, chosen, count);
  __syncthreads();

  if (warp == 0) {  // exclusive scan of the counts: lane l sums experts [l * 8, l * 8 + 8)
    int c[kPerLane], run = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane * kPerLane + i;
      c[i] = e < experts ? count[e] : 0;
      run += c[i];
    }
    int incl = run;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int u = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += u;
    }
    int at = incl - run;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane * kPerLane + i;
      if (e < experts) {
        offset[e] = at;
        a.group_sizes[e] = c[i];
      }
      at += c[i];
    }
  }
  // Choice (warp rounds + j) 32 + lane: its expert (-1: none) and its rank among the warp's earlier
  // choices of that expert; the warp's count of each expert after its chunks in warp_count.
  uint8_t* mine_count = warp_count + warp * experts;
  int mine[kChunkRounds], rank[kChunkRounds];
#pragma unroll
  for (int j = 0; j < kChunkRounds; ++j) {
    const int i = (warp * rounds + j) * 32 + lane;
    mine[j] = j < rounds && i < choices ? chosen[i] : -1;
    if (j >= rounds) continue;  // the whole warp
    const unsigned peers = __match_any_sync(0xffffffffu, mine[j]), before = peers & ((1u << lane) - 1u);
    rank[j] = __popc(before) + (mine[j] >= 0 ? mine_count[mine[j]] : 0);
    __syncwarp();
    if (mine[j] >= 0 && before == 0) mine_count[mine[j]] += static_cast<uint8_t>(__popc(peers));
    __syncwarp();
  }
  __syncthreads();

#pragma unroll
  for (int j = 0; j < kChunkRounds; ++j) {
    const int e = mine[j];
    if (e < 0) continue;
    int r = offset[e] + rank[j];
    for (int w = 0; w < warp; ++w) r += warp_count[w * experts + e];
    const int i = (warp * rounds + j) * 32 + lane;
    a.choice_of_row[r] = i;
    a.row_of_choice[i] = r;
  }
}

// The routing options and outputs of a handler that routes T tokens over E experts, checked (errors
// begin with `call`), the outputs poisoned where TE_ASYNC_POISON_OUTPUTS is set; the logits are the
// caller's to set (moe_routing.cu). bias: sigmoid's correction bias [E] on the device, or nullptr.
xla::ffi::ErrorOr<RouteArgs> RoutingOutputs(
    const char* call, cudaStream_t stream, int64_t t, int64_t e, const float* bias,
    xla::ffi::Result<xla::ffi::Buffer<xla::ffi::F32>> weights, xla::ffi::Result<xla::ffi::Buffer<xla::ffi::S32>> experts,
    xla::ffi::Result<xla::ffi::Buffer<xla::ffi::S32>> group_sizes,
    xla::ffi::Result<xla::ffi::Buffer<xla::ffi::S32>> choice_of_row,
    xla::ffi::Result<xla::ffi::Buffer<xla::ffi::S32>> row_of_choice, int64_t top_k, int64_t n_group, int64_t topk_group,
    bool renormalize, float scaling, bool sigmoid);

}  // namespace te_async
