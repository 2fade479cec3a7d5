// MoE routing of a decode-sized batch in one kernel: router logits [T, E] -> the top-k experts and
// weights of each token, the group sizes, and the stable order of the T*k (token, choice) pairs by
// expert with its inverse. It replaces XLA's softmax, top-k, argsort, bincount and scatter kernels
// (about ten launches per MoE layer) and, like them, reads nothing on the host, so it can sit in a
// CUDA graph. te_async/routing.py holds the JAX reference it must match.
//
// One block of 1024 threads, route_block.cuh's RouteBlock (T*k <= kRouteMaxChoices, E <=
// kRouteMaxExperts: decode sizes), which says how.
// At 64 tokens of DeepSeek-V2-Lite (E = 64, top-6) on an H100 it takes 9.1 us alone, 10.7 behind cold
// caches and 8.8 in bench decode's step, where one token a warp and an order walked by one ballot
// of 32 choices at a time per expert took 11.5, 15.4 and 12.5 (docs/benchmarks.md, under table D1);
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
#include "cuda/route_block.cuh"
#include "debug_flags.h"

namespace te_async {
namespace {

namespace ffi = xla::ffi;

// One block per launch, so minBlocksPerSM 1: left open, ptxas held the kernel to 32 registers
// once the sigmoid path was in and spilled (with it: no spills).
template <typename Form>
__global__ void __launch_bounds__(kRouteThreads, 1) RouteKernel(RouteArgs a) {
  RouteBlock<Form>(a);
}

// bias: sigmoid's correction bias [E], or [0] for none.
ffi::Error RouteDecode(cudaStream_t stream, ffi::Buffer<ffi::F32> logits, ffi::Buffer<ffi::F32> bias,
                       ffi::Result<ffi::Buffer<ffi::F32>> weights, ffi::Result<ffi::Buffer<ffi::S32>> experts,
                       ffi::Result<ffi::Buffer<ffi::S32>> group_sizes, ffi::Result<ffi::Buffer<ffi::S32>> choice_of_row,
                       ffi::Result<ffi::Buffer<ffi::S32>> row_of_choice, int64_t top_k, int64_t n_group,
                       int64_t topk_group, bool renormalize, float scaling, bool sigmoid) {
  const auto ld = logits.dimensions(), bd = bias.dimensions();
  if (ld.size() != 2) return ffi::Error::InvalidArgument("te_async route: logits must be [T, E]");
  if (bd.size() != 1 || (bd[0] != 0 && bd[0] != ld[1])) {
    return ffi::Error::InvalidArgument("te_async route: the correction bias must be [E] or [0] (none)");
  }
  auto a = RoutingOutputs("te_async route", stream, ld[0], ld[1], bd[0] != 0 ? bias.typed_data() : nullptr, weights, experts, group_sizes, choice_of_row,
                          row_of_choice, top_k, n_group, topk_group, renormalize, scaling, sigmoid);
  if (a.has_error()) return a.error();
  a->logits = logits.typed_data();
  WithForm(a->top, [&](auto form) { RouteKernel<decltype(form)><<<1, kRouteThreads, 0, stream>>>(*a); });
  return CudaStatus(cudaGetLastError(), "launch of RouteKernel");
}

}  // namespace

ffi::ErrorOr<RouteArgs> RoutingOutputs(const char* call, cudaStream_t stream, int64_t t, int64_t e,
                                       const float* bias, ffi::Result<ffi::Buffer<ffi::F32>> weights,
                                       ffi::Result<ffi::Buffer<ffi::S32>> experts,
                                       ffi::Result<ffi::Buffer<ffi::S32>> group_sizes,
                                       ffi::Result<ffi::Buffer<ffi::S32>> choice_of_row,
                                       ffi::Result<ffi::Buffer<ffi::S32>> row_of_choice, int64_t top_k, int64_t n_group,
                                       int64_t topk_group, bool renormalize, float scaling, bool sigmoid) {
  auto bad = [&](const std::string& why) { return ffi::Unexpected(ffi::Error::InvalidArgument(std::string(call) + ": " + why)); };
  const int64_t n = t * top_k;
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
  if (bias != nullptr && !sigmoid) return bad("a correction bias needs sigmoid scoring");
  const auto want = [](auto& b, std::initializer_list<int64_t> dims) {
    const auto d = b->dimensions();
    return d.size() == dims.size() && std::equal(dims.begin(), dims.end(), d.begin());
  };
  if (!want(weights, {t, top_k}) || !want(experts, {t, top_k}) || !want(group_sizes, {e}) ||
      !want(choice_of_row, {n}) || !want(row_of_choice, {n})) {
    return bad("outputs must be weights/experts [T, k], group_sizes [E], choice_of_row/row_of_choice [T*k]");
  }
  RouteArgs a{nullptr, static_cast<int>(t),
              TopKOptions{static_cast<int>(e), static_cast<int>(top_k), static_cast<int>(n_group),
                          static_cast<int>(topk_group), renormalize, scaling, sigmoid, bias},
              weights->typed_data(), experts->typed_data(), group_sizes->typed_data(),
              choice_of_row->typed_data(), row_of_choice->typed_data()};
  if (PoisonOutputs()) {  // every output element is written: poison shows one that is not
    for (auto [p, bytes] : {std::pair<void*, size_t>{weights->untyped_data(), weights->size_bytes()},
                            {experts->untyped_data(), experts->size_bytes()},
                            {group_sizes->untyped_data(), group_sizes->size_bytes()},
                            {choice_of_row->untyped_data(), choice_of_row->size_bytes()},
                            {row_of_choice->untyped_data(), row_of_choice->size_bytes()}}) {
      if (auto error = CudaStatus(cudaMemsetAsync(p, 0xff, bytes, stream), "cudaMemsetAsync"); error.failure()) {
        return ffi::Unexpected(error);
      }
    }
  }
  return a;
}

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
