// MoE routing of a decode-sized batch in one kernel: router logits [T, E] -> the top-k experts and
// weights of each token, the group sizes, and the stable order of the T*k (token, choice) pairs by
// expert with its inverse. It replaces XLA's softmax, top-k, argsort, bincount and scatter kernels
// (about ten launches per MoE layer) and, like them, reads nothing on the host, so it can sit in a
// CUDA graph. te_async/routing.py holds the JAX reference it must match.
//
// One block of 1024 threads (T*k <= kRouteMaxChoices, E <= kRouteMaxExperts: decode sizes).
//   1. Warp w routes tokens w, w+32, ..., two at a time while it has two (route_top_k.cuh), by
//      softmax or by DeepSeek-V3's sigmoid scoring with its optional correction bias [E].
//   2. Group sizes: integer atomics in shared memory (counts, so their order does not matter),
//      then an exclusive scan by one warp. Beside it every warp ranks its consecutive chunks of 32
//      choices (flat, token-major order), one after the other: a choice's rank among the warp's
//      earlier choices of its expert (__match_any_sync), and the warp's count of each expert.
//   3. Order: a choice's row is its expert's offset, plus the earlier warps' counts of its expert,
//      plus its rank: the stable sort, deterministic, no float atomics.
// At 64 tokens of DeepSeek-V2-Lite (E = 64, top-6) on an H100 it takes 9.1 us alone, 10.7 behind cold
// caches and 8.8 in bench decode's step, where one token a warp and an order walked by one ballot
// of 32 choices at a time per expert took 11.5, 15.4 and 12.5 (docs/internals.md, Fused decode MoE);
// since then a launch holds one top-k form's code (route_top_k.cuh's TopKForm).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/handlers.h"
#include "cuda/moe_routing.h"
#include "cuda/poison.h"
#include "cuda/route_top_k.cuh"

namespace te_async {
namespace {

namespace ffi = xla::ffi;

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

// One block per launch, so minBlocksPerSM 1: left open, ptxas held the kernel to 32 registers
// once the sigmoid path was in and spilled (with it: no spills).
template <typename Form>
__global__ void __launch_bounds__(kRouteThreads, 1) RouteKernel(RouteArgs a) {
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

// bias: sigmoid's correction bias [E], or [0] for none.
ffi::Error RouteDecode(cudaStream_t stream, ffi::Buffer<ffi::F32> logits, ffi::Buffer<ffi::F32> bias,
                       ffi::Result<ffi::Buffer<ffi::F32>> weights, ffi::Result<ffi::Buffer<ffi::S32>> experts,
                       ffi::Result<ffi::Buffer<ffi::S32>> group_sizes, ffi::Result<ffi::Buffer<ffi::S32>> choice_of_row,
                       ffi::Result<ffi::Buffer<ffi::S32>> row_of_choice, int64_t top_k, int64_t n_group,
                       int64_t topk_group, bool renormalize, float scaling, bool sigmoid) {
  auto bad = [](const std::string& why) { return ffi::Error::InvalidArgument("te_async route: " + why); };
  const auto ld = logits.dimensions();
  if (ld.size() != 2) return bad("logits must be [T, E]");
  const int64_t t = ld[0], e = ld[1], n = t * top_k;
  if (e < 1 || e > kRouteMaxExperts) return bad("1 to " + std::to_string(kRouteMaxExperts) + " experts, got " + std::to_string(e));
  if (top_k < 1 || top_k > e || top_k > 32) return bad("top_k must be in [1, min(E, 32)], got " + std::to_string(top_k));
  if (n > kRouteMaxChoices) {
    return bad("at most " + std::to_string(kRouteMaxChoices) + " tokens x top_k, got " + std::to_string(n));
  }
  if (n_group < 1 || n_group > 32 || e % n_group != 0 || topk_group < 1 || topk_group > n_group) {
    return bad("n_group must divide E and be at most 32, 1 <= topk_group <= n_group; got n_group " +
               std::to_string(n_group) + ", topk_group " + std::to_string(topk_group));
  }
  if (sigmoid && n_group > 1 && e / n_group < 2) {
    return bad("sigmoid scoring ranks groups by their two best experts: n_group " + std::to_string(n_group) +
               " leaves " + std::to_string(e / n_group) + " expert per group");
  }
  const auto bd = bias.dimensions();
  if (bd.size() != 1 || (bd[0] != 0 && bd[0] != e)) return bad("the correction bias must be [E] or [0] (none)");
  const bool biased = bd[0] != 0;
  if (biased && !sigmoid) return bad("a correction bias needs sigmoid scoring");
  const auto want = [](auto& b, std::initializer_list<int64_t> dims) {
    const auto d = b->dimensions();
    return d.size() == dims.size() && std::equal(dims.begin(), dims.end(), d.begin());
  };
  if (!want(weights, {t, top_k}) || !want(experts, {t, top_k}) || !want(group_sizes, {e}) ||
      !want(choice_of_row, {n}) || !want(row_of_choice, {n})) {
    return bad("outputs must be weights/experts [T, k], group_sizes [E], choice_of_row/row_of_choice [T*k]");
  }
  RouteArgs a{logits.typed_data(), static_cast<int>(t),
              TopKOptions{static_cast<int>(e), static_cast<int>(top_k), static_cast<int>(n_group),
                          static_cast<int>(topk_group), renormalize, scaling, sigmoid,
                          biased ? bias.typed_data() : nullptr},
              weights->typed_data(), experts->typed_data(), group_sizes->typed_data(),
              choice_of_row->typed_data(), row_of_choice->typed_data()};
  // Every output element is written: poison shows one that is not.
  TE_ASYNC_RETURN_IF_ERROR(
      PoisonOutputBuffers(stream, *weights, *experts, *group_sizes, *choice_of_row, *row_of_choice));
  WithForm(a.top, [&](auto form) { RouteKernel<decltype(form)><<<1, kRouteThreads, 0, stream>>>(a); });
  return CudaStatus(cudaGetLastError(), "launch of RouteKernel");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kRouteCuda, RouteDecode,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<int64_t>("top_k")
                                  .Attr<int64_t>("n_group")
                                  .Attr<int64_t>("topk_group")
                                  .Attr<bool>("renormalize")
                                  .Attr<float>("scaling")
                                  .Attr<bool>("sigmoid"),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace te_async
