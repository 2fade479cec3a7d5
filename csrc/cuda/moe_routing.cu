// MoE routing of a decode-sized batch in one kernel: router logits [T, E] -> the top-k experts and
// weights of each token, the group sizes, and the stable order of the T*k (token, choice) pairs by
// expert with its inverse. It replaces XLA's softmax, top-k, argsort, bincount and scatter kernels
// (about ten launches per MoE layer) and, like them, reads nothing on the host, so it can sit in a
// CUDA graph. te_async/routing.py holds the JAX reference it must match.
//
// One block of 1024 threads (T*k <= kRouteMaxChoices, E <= kRouteMaxExperts: decode sizes).
//   1. Warp per token: its top-k experts and weights (route_top_k.cuh), by softmax or by
//      DeepSeek-V3's sigmoid scoring with its optional correction bias [E].
//   2. Group sizes: integer atomics in shared memory (counts, so their order does not matter),
//      then an exclusive scan by one warp.
//   3. Order: warp w takes experts w, w+32, ...; for each it walks the choices in flat order
//      (token-major) with a ballot, so a choice's row is its expert's offset plus the number of
//      earlier choices of that expert: the stable sort, deterministic, no float atomics.
#include <cuda_runtime.h>

#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/handlers.h"
#include "cuda/moe_routing.h"
#include "cuda/route_top_k.cuh"
#include "debug_flags.h"

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

// Step 1 for token t, by one warp: writes its k weights and experts and counts them in `count`.
__device__ void RouteToken(const RouteArgs& a, int t, int lane, int* chosen_sh, int* count) {
  float w;
  int e;
  WarpTopK(a.logits + static_cast<long long>(t) * a.top.experts, a.top, lane, w, e);
  if (lane < a.top.top_k) {
    const int at = t * a.top.top_k + lane;
    a.weights[at] = w;
    a.chosen[at] = e;
    chosen_sh[at] = e;
    atomicAdd(&count[e], 1);
  }
}

// One block per launch, so minBlocksPerSM 1: left open, ptxas held the kernel to 32 registers
// once the sigmoid path was in and spilled (with it: 40, no spills).
__global__ void __launch_bounds__(kRouteThreads, 1) RouteKernel(RouteArgs a) {
  __shared__ int chosen[kRouteMaxChoices];
  __shared__ int count[kRouteMaxExperts];
  __shared__ int offset[kRouteMaxExperts];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int choices = a.tokens * a.top.top_k;
  for (int e = tid; e < a.top.experts; e += kRouteThreads) count[e] = 0;
  __syncthreads();
  for (int t = warp; t < a.tokens; t += kRouteWarps) RouteToken(a, t, lane, chosen, count);
  __syncthreads();

  if (warp == 0) {  // exclusive scan of the counts: lane l sums experts [l * 8, l * 8 + 8)
    int c[kPerLane], run = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane * kPerLane + i;
      c[i] = e < a.top.experts ? count[e] : 0;
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
      if (e < a.top.experts) {
        offset[e] = at;
        a.group_sizes[e] = c[i];
      }
      at += c[i];
    }
  }
  __syncthreads();

  for (int e = warp; e < a.top.experts; e += kRouteWarps) {
    int row = offset[e];
    for (int base = 0; base < choices; base += 32) {
      const int i = base + lane;
      const bool mine = i < choices && chosen[i] == e;
      const unsigned hits = __ballot_sync(0xffffffffu, mine);
      if (mine) {
        const int r = row + __popc(hits & ((1u << lane) - 1u));
        a.choice_of_row[r] = i;
        a.row_of_choice[i] = r;
      }
      row += __popc(hits);
    }
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
  if (PoisonOutputs()) {  // every output element is written: poison shows one that is not
    for (auto [p, bytes] : {std::pair<void*, size_t>{weights->untyped_data(), weights->size_bytes()},
                            {experts->untyped_data(), experts->size_bytes()},
                            {group_sizes->untyped_data(), group_sizes->size_bytes()},
                            {choice_of_row->untyped_data(), choice_of_row->size_bytes()},
                            {row_of_choice->untyped_data(), row_of_choice->size_bytes()}}) {
      TE_ASYNC_CUDA(cudaMemsetAsync(p, 0xff, bytes, stream));
    }
  }
  RouteKernel<<<1, kRouteThreads, 0, stream>>>(a);
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
