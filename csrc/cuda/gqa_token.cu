// Grouped-query attention (Mixtral, Qwen2-MoE, Qwen3-MoE) for one new token per sequence in one FFI
// call (te_async/gqa_token.py), each kernel after the first a programmatic dependent of the one before
// (programmatic_launch.cuh). GqaToken runs kernels 1-3, from the input projections' output to the
// heads' outputs; GqaTokenBlock the whole attention half of a decoder layer, 0-4:
//
//   0. ProductKernel with a norm weight (token_product.cuh), block (32 columns, two sequences):
//      input_layernorm of the residual stream x and its product with w_in (q, k and v side by side).
//   1. GqaTokenPrepKernel, block (head, sequence) of one thread a dim: a query head gets its per-head
//      RMSNorm (Qwen3's q_norm, where given) and the rope and becomes the split kernel's query; a kv
//      head gets k_norm and the rope, and goes with its value into the stacked cache at (layer, b,
//      position), in place (the call's cache outputs alias its inputs).
//   2. DecodeAttentionKernel (decode_attention_kernels.cuh) over the cache: its first tile, keys
//      before the new token's, loads while the prep runs.
//   3. CombineKernel, the merge of the key splits, launched while the splits run.
//   4. SlicedProductKernel with a residual (token_product.cuh), block (a slice of the rows, 128 columns,
//      two sequences) in clusters of a tile's slices: x + o_proj over the heads' outputs. The merge
//      starts its dependents, so these blocks are resident and have loaded their first rows when it ends.
//
// At batch 1 XLA ran step 1 as about five kernels (the norms, the rope, two cache updates) between
// the input projections and decode_attention's call, each launched after the one before had ended,
// and steps 0 and 4 as the norm's two kernels, the projections' GEMM, o_proj's and the residual add.
// Values are rounded where te_async.models.attention rounds them (the RMSNorms: normalise in f32,
// round, times the weight, round; the projections; the rotated q and k; o_proj's output and the
// residual sum), so the split and merge kernels get what decode_attention gets on the unfused path.
// A layer index or position outside the cache writes nothing; the attention then gives NaN (a bad
// layer, a negative position) or sees the keys it can.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/decode_attention.h"
#include "cuda/decode_attention_kernels.cuh"
#include "cuda/device_gemm.h"
#include "cuda/gqa_token.h"
#include "cuda/handlers.h"
#include "cuda/norm_rope.cuh"
#include "cuda/poison.h"
#include "cuda/programmatic_launch.cuh"
#include "cuda/token_product.cuh"
#include "grouped_gemm_args.h"

namespace te_async {
namespace {

namespace ffi = xla::ffi;
using bf16 = __nv_bfloat16;

constexpr int kShape = 1;  // decode_attention.h: grouped-query heads of 128 dims
constexpr int kHeadDim = kDecodeAttentionShapes[kShape].key_dims;
static_assert(kDecodeAttentionShapes[kShape].rope_dims == 0 && kDecodeAttentionShapes[kShape].value_dims == kHeadDim &&
                  !kDecodeAttentionShapes[kShape].values_are_keys && kHeadDim % 64 == 0,
              "grouped-query heads: keys and values of kHeadDim dims");
constexpr int kHalf = kHeadDim / 2;
constexpr int kMaxRows = kDecodeAttentionMaxRows;  // the split kernel's query rows: heads per kv head
constexpr int kWarps = kHeadDim / 32;
// The block's products (token_product.cuh): the input projections by ProductKernel (its widths, as
// mla_token.cu's: one block an SM, 1.2 waves for Qwen3's 5120 columns on 132 SMs). Streamed by
// SlicedProductKernel in one wave of clusters (5 slices) it ended 0.7 us earlier in the trip but slowed
// the attention beside it by 1.7 us (generate's loop level), and in two waves (6 slices) it took 16.5 us
// against 13.6: docs/results/2026-12-07-h100-gqa-oproj-streamed. o_proj by SlicedProductKernel
// (LaunchSliced), whose light blocks (112 registers) become resident during the attention and load
// their first rows there without slowing it, where ProductKernel's (221 registers, one an SM) slowed
// the merge by 10 us: the layer 1.8 us shorter, Qwen3-30B-A3B B=1 1.019x faster a token (same results).
using token_product::kInputColumns;
using token_product::kInputThreads;
using token_product::kProductGroups;
using token_product::kSliceColumns;
using token_product::ProductArgs;
static_assert(kGqaTokenBlockRowStep == kProductGroups && kGqaTokenBlockRowStep % kSliceColumns == 0 &&
                  kHeadDim % kInputColumns == 0 && kGqaTokenBlockMaxHidden % kInputThreads == 0,
              "whole blocks");

struct PrepArgs {
  const bf16* projected;         // [B, (H + 2 Hkv) d]: q's heads, then k's, then v's
  const bf16 *q_norm, *k_norm;   // [d] each, or null: no per-head norm
  const float *cos, *sin;        // [d], the token's rotation, duplicated over the halves
  const int *layer, *position;   // device scalars
  bf16 *k_cache, *v_cache;       // the stacked cache [L, B, N, Hkv, d]
  bf16* q;                       // [B, H, d]: the split kernel's query
  int batch, heads, kv_heads, max_len, layers;
  float eps;
};

__global__ void __launch_bounds__(kHeadDim) GqaTokenPrepKernel(PrepArgs a) {
  StartDependents();  // the split kernel may start loading the keys before the new token's
  __shared__ float head[kHeadDim];
  __shared__ float scratch[kWarps];
  const int h = blockIdx.x, b = blockIdx.y, t = threadIdx.x;
  const bool query = h < a.heads;
  const bf16* in = a.projected + (static_cast<size_t>(b) * (a.heads + 2 * a.kv_heads) + h) * kHeadDim;
  const bf16* norm = query ? a.q_norm : a.k_norm;
  const bf16 weight = norm != nullptr ? norm[t] : bf16{};  // the call's inputs, read before the wait
  const float cos = a.cos[t], sin = a.sin[t];
  WaitForPrevious();  // GqaTokenBlock: the input projections (returns at once in GqaToken)
  float x = __bfloat162float(in[t]);
  if (norm != nullptr) x = Normalized(x, InverseRms<kWarps>(x * x, kHeadDim, a.eps, scratch), weight);
  head[t] = x;
  __syncthreads();
  const bf16 rotated = RotatedHalf(x, head[t < kHalf ? t + kHalf : t - kHalf], cos, sin, t < kHalf);
  if (query) {
    a.q[(static_cast<size_t>(b) * a.heads + h) * kHeadDim + t] = rotated;
    return;
  }
  const int layer = *a.layer, position = *a.position;
  if (layer < 0 || layer >= a.layers || position < 0 || position >= a.max_len) return;
  const size_t at =
      (((static_cast<size_t>(layer) * a.batch + b) * a.max_len + position) * a.kv_heads + h - a.heads) * kHeadDim + t;
  a.k_cache[at] = rotated;
  a.v_cache[at] = in[static_cast<size_t>(a.kv_heads) * kHeadDim + t];  // head h's value, Hkv heads on
}

using BF16Buffer = ffi::Buffer<ffi::BF16>;
using BF16Result = ffi::Result<ffi::Buffer<ffi::BF16>>;

bool Is(ffi::Span<const int64_t> d, std::initializer_list<int64_t> dims) {
  return std::equal(d.begin(), d.end(), dims.begin(), dims.end());
}

const bf16* In(const BF16Buffer& b) { return static_cast<const bf16*>(b.untyped_data()); }
bf16* Out(BF16Result& b) { return static_cast<bf16*>(b->untyped_data()); }

// Kernels 1-3 of both calls, from the input projections' output `projected` (dims `pd`) to the heads'
// outputs `out`: the shapes checked and the workspaces poisoned where asked before anything is
// launched; then `first` (GqaTokenBlock's kernel 0, which writes `projected`; empty in GqaToken,
// whose `projected` is its input), the prep (a programmatic dependent of `first`'s kernel), the
// splits and the merge.
ffi::Error Attention(cudaStream_t stream, const bf16* projected, ffi::Span<const int64_t> pd, const BF16Buffer& q_norm,
                     const BF16Buffer& k_norm, ffi::Buffer<ffi::F32> cos, ffi::Buffer<ffi::F32> sin,
                     const BF16Buffer& k_cache, const BF16Buffer& v_cache, ffi::Buffer<ffi::S32> layer,
                     ffi::Buffer<ffi::S32> position, BF16Result& out, BF16Result& k_out, BF16Result& v_out,
                     BF16Result& q, ffi::Result<ffi::Buffer<ffi::F32>>& partial, float scale, int64_t window,
                     float eps, const std::function<ffi::Error()>& first) {
  auto bad = [&](const std::string& why) {
    return ffi::Error::InvalidArgument("te_async gqa_token: " + why + " (projected " + Dims(pd) + ", k_cache " +
                                       Dims(k_cache.dimensions()) + ", v_cache " + Dims(v_cache.dimensions()) +
                                       ", out " + Dims(out->dimensions()) + ", partial " +
                                       Dims(partial->dimensions()) + ")");
  };
  const auto od = out->dimensions(), cd = k_cache.dimensions(), sd = partial->dimensions();
  if (od.size() != 4 || cd.size() != 5 || sd.size() != 4 || pd.size() != 3) return bad("ranks");
  const int64_t batch = od[0], heads = od[2], layers = cd[0], max_len = cd[2], kv_heads = cd[3], splits = sd[0];
  const auto norm_ok = [&](const BF16Buffer& n) { return Is(n.dimensions(), {0}) || Is(n.dimensions(), {kHeadDim}); };
  if (!Is(od, {batch, 1, heads, kHeadDim}) || !Is(pd, {batch, 1, (heads + 2 * kv_heads) * kHeadDim}) ||
      !Is(cd, {layers, batch, max_len, kv_heads, kHeadDim}) ||
      !Is(v_cache.dimensions(), {layers, batch, max_len, kv_heads, kHeadDim}) || !norm_ok(q_norm) ||
      !norm_ok(k_norm) || !Is(cos.dimensions(), {kHeadDim}) || !Is(sin.dimensions(), {kHeadDim}) ||
      layer.element_count() != 1 || position.element_count() != 1 || !Is(q->dimensions(), {batch, 1, heads, kHeadDim}) ||
      !Is(sd, {splits, batch * kv_heads, kMaxRows, kHeadDim + 2})) {
    return bad("shapes: projected [B, 1, (H + 2 Hkv) * " + std::to_string(kHeadDim) + "], q_norm and k_norm [" +
               std::to_string(kHeadDim) + "] or [0], cos and sin [" + std::to_string(kHeadDim) +
               "], caches [L, B, N, Hkv, " + std::to_string(kHeadDim) + "], out [B, 1, H, " +
               std::to_string(kHeadDim) + "], partial [splits, B * Hkv, " + std::to_string(kMaxRows) + ", " +
               std::to_string(kHeadDim + 2) + "]");
  }
  if (kv_heads < 1 || heads % kv_heads != 0 || heads / kv_heads > kMaxRows || batch < 1 || batch > 65535 ||
      batch * kv_heads > 65535 || splits < 1 || splits > kDecodeAttentionMaxSplits || max_len > (int64_t{1} << 30) ||
      layers * batch * max_len * kv_heads > (int64_t{1} << 40)) {
    return bad("H a multiple of Hkv with at most " + std::to_string(kMaxRows) + " query heads per kv head, B * Hkv " +
               "<= 65535, 1 to " + std::to_string(kDecodeAttentionMaxSplits) +
               " splits, a cache of at most 2^30 tokens");
  }
  if (k_out->untyped_data() != k_cache.untyped_data() || v_out->untyped_data() != v_cache.untyped_data()) {
    return bad("the cache outputs must alias the cache inputs");
  }
  const auto optional = [&](const BF16Buffer& b) { return b.element_count() == 0 ? nullptr : In(b); };
  TE_ASYNC_RETURN_IF_ERROR(PoisonOutputBuffers(stream, *out, *q, *partial));
  const PrepArgs prep{projected, optional(q_norm), optional(k_norm), cos.typed_data(), sin.typed_data(),
                      layer.typed_data(), position.typed_data(), Out(k_out), Out(v_out), Out(q),
                      static_cast<int>(batch), static_cast<int>(heads), static_cast<int>(kv_heads),
                      static_cast<int>(max_len), static_cast<int>(layers), eps};
  if (first) TE_ASYNC_RETURN_IF_ERROR(first());
  TE_ASYNC_RETURN_IF_ERROR(LaunchChained(GqaTokenPrepKernel, dim3(heads + kv_heads, batch), kHeadDim, prep, stream,
                                         static_cast<bool>(first), "launch of GqaTokenPrepKernel"));

  using namespace decode_attention_kernels;  // NOLINT: the kernels this call chains behind the prep
  const Args attend{Out(q), Out(q), Out(k_out), Out(k_out), Out(v_out), layer.typed_data(), position.typed_data(),
                    static_cast<int>(batch), 1, static_cast<int>(heads), static_cast<int>(kv_heads),
                    static_cast<int>(max_len), static_cast<int>(layers), static_cast<int>(window),
                    SplitChunk(max_len, splits), scale * kLog2e, partial->typed_data(), Out(out)};
  TE_ASYNC_RETURN_IF_ERROR(LaunchSplits<kShape>(stream, attend, static_cast<int>(splits), true));
  return LaunchMerge<kShape>(stream, attend, static_cast<int>(splits), true);
}

ffi::Error GqaToken(cudaStream_t stream, BF16Buffer projected, BF16Buffer q_norm, BF16Buffer k_norm,
                    ffi::Buffer<ffi::F32> cos, ffi::Buffer<ffi::F32> sin, BF16Buffer k_cache, BF16Buffer v_cache,
                    ffi::Buffer<ffi::S32> layer, ffi::Buffer<ffi::S32> position, BF16Result out, BF16Result k_out,
                    BF16Result v_out, BF16Result q, ffi::Result<ffi::Buffer<ffi::F32>> partial, float scale,
                    int64_t window, float eps) {
  return Attention(stream, In(projected), projected.dimensions(), q_norm, k_norm, cos, sin, k_cache, v_cache, layer,
                   position, out, k_out, v_out, q, partial, scale, window, eps, {});
}

ffi::Error GqaTokenBlock(cudaStream_t stream, BF16Buffer x, BF16Buffer norm, BF16Buffer w_in, BF16Buffer wo,
                         BF16Buffer q_norm, BF16Buffer k_norm, ffi::Buffer<ffi::F32> cos, ffi::Buffer<ffi::F32> sin,
                         BF16Buffer k_cache, BF16Buffer v_cache, ffi::Buffer<ffi::S32> layer,
                         ffi::Buffer<ffi::S32> position, BF16Result out, BF16Result k_out, BF16Result v_out,
                         BF16Result q, ffi::Result<ffi::Buffer<ffi::F32>> partial, BF16Result projected,
                         BF16Result heads_out, float scale, int64_t window, float eps) {
  auto bad = [&](const std::string& why) {
    return ffi::Error::InvalidArgument("te_async gqa_token_block: " + why + " (x " + Dims(x.dimensions()) +
                                       ", norm " + Dims(norm.dimensions()) + ", w_in " + Dims(w_in.dimensions()) +
                                       ", wo " + Dims(wo.dimensions()) + ", heads' outputs " +
                                       Dims(heads_out->dimensions()) + ")");
  };
  const auto xd = x.dimensions(), wd = w_in.dimensions(), hd = heads_out->dimensions();
  if (xd.size() != 3 || wd.size() != 2 || hd.size() != 4) return bad("ranks");
  const int64_t batch = xd[0], hidden = xd[2], width = wd[1], rows = hd[2] * kHeadDim;
  if (!Is(xd, {batch, 1, hidden}) || !Is(norm.dimensions(), {hidden}) || !Is(wd, {hidden, width}) ||
      !Is(wo.dimensions(), {rows, hidden}) || !Is(out->dimensions(), {batch, 1, hidden}) ||
      !Is(projected->dimensions(), {batch, 1, width}) || !Is(hd, {batch, 1, hd[2], kHeadDim})) {
    return bad("shapes: x [B, 1, hidden], norm [hidden], w_in [hidden, (H + 2 Hkv) * " + std::to_string(kHeadDim) +
               "], wo [H * " + std::to_string(kHeadDim) + ", hidden], out [B, 1, hidden]");
  }
  if (hidden < 1 || hidden > kGqaTokenBlockMaxHidden || hidden % kGqaTokenBlockRowStep != 0 ||
      rows > kGqaTokenBlockMaxRows || rows % kGqaTokenBlockRowStep != 0 || batch < 1 || batch > 65535) {
    return bad("a hidden size and H * " + std::to_string(kHeadDim) + " that are multiples of " +
               std::to_string(kGqaTokenBlockRowStep) + ", at most " + std::to_string(kGqaTokenBlockMaxHidden) +
               " and " + std::to_string(kGqaTokenBlockMaxRows));
  }
  TE_ASYNC_RETURN_IF_ERROR(PoisonOutputBuffers(stream, *out, *projected));
  const ProductArgs input{In(x), nullptr, In(norm), In(w_in), nullptr, Out(projected), static_cast<int>(batch),
                          static_cast<int>(hidden), static_cast<int>(width), eps};
  const auto input_projections = [&] {
    return token_product::LaunchProduct<kInputColumns, kGqaTokenBlockMaxHidden, 1>(
        input, stream, false, "launch of the input projections' ProductKernel");
  };
  TE_ASYNC_RETURN_IF_ERROR(Attention(stream, Out(projected), projected->dimensions(), q_norm, k_norm, cos, sin,
                                     k_cache, v_cache, layer, position, heads_out, k_out, v_out, q, partial, scale,
                                     window, eps, input_projections));
  const ProductArgs output{Out(heads_out), nullptr, nullptr, In(wo), In(x), Out(out), static_cast<int>(batch),
                           static_cast<int>(rows), static_cast<int>(hidden), 0.f};
  const auto info = QueryCurrentDevice();
  if (info.has_error()) return info.error();
  return token_product::LaunchSliced<kGqaTokenBlockMaxRows, 1>(output, info->sm_count, info->compute_capability, stream,
                                                               true, "launch of o_proj's SlicedProductKernel");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kGqaTokenCuda, GqaToken,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // projected: q, k and v side by side
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // q_norm, or [0]
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // k_norm, or [0]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // cos
                                  .Arg<ffi::Buffer<ffi::F32>>()   // sin
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // k_cache
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // v_cache
                                  .Arg<ffi::Buffer<ffi::S32>>()   // layer
                                  .Arg<ffi::Buffer<ffi::S32>>()   // position
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // out: the heads' outputs
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // k_cache, aliased
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // v_cache, aliased
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // q: the rotated query (workspace)
                                  .Ret<ffi::Buffer<ffi::F32>>()   // partial: the splits' outputs (workspace)
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("window")
                                  .Attr<float>("eps"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(kGqaTokenBlockCuda, GqaTokenBlock,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // x: the residual stream
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // norm: input_layernorm's weight
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // w_in: q, k and v's weights side by side
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // wo
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // q_norm, or [0]
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // k_norm, or [0]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // cos
                                  .Arg<ffi::Buffer<ffi::F32>>()   // sin
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // k_cache
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // v_cache
                                  .Arg<ffi::Buffer<ffi::S32>>()   // layer
                                  .Arg<ffi::Buffer<ffi::S32>>()   // position
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // out: x + o_proj's output
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // k_cache, aliased
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // v_cache, aliased
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // q: the rotated query (workspace)
                                  .Ret<ffi::Buffer<ffi::F32>>()   // partial: the splits' outputs (workspace)
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // projected: q, k and v (workspace)
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // the heads' outputs, o_proj's input (workspace)
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("window")
                                  .Attr<float>("eps"),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace te_async
