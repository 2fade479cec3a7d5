// Grouped-query attention (Mixtral, Qwen2-MoE, Qwen3-MoE) for one new token per sequence, from the
// input projections' output to the heads' outputs, in one FFI call of three kernels, each after the
// first a programmatic dependent of the one before (programmatic_launch.cuh; te_async/gqa_token.py):
//
//   0. GqaTokenPrepKernel, block (head, sequence) of one thread a dim: a query head gets its per-head
//      RMSNorm (Qwen3's q_norm, where given) and the rope and becomes the split kernel's query; a kv
//      head gets k_norm and the rope, and goes with its value into the stacked cache at (layer, b,
//      position), in place (the call's cache outputs alias its inputs).
//   1. DecodeAttentionKernel (decode_attention_kernels.cuh) over the cache: its first tile, keys
//      before the new token's, loads while the prep runs.
//   2. CombineKernel, the merge of the key splits, launched while the splits run.
//
// At batch 1 XLA ran step 0 as about five kernels (the norms, the rope, two cache updates) between
// the input projections and decode_attention's call, each launched after the one before had ended.
// Values are rounded where te_async.models.attention rounds them (both RMSNorms: normalise in f32,
// round, times the weight, round; the rotated q and k), so the split and merge kernels get what
// decode_attention gets on the unfused path. A layer index or position outside the cache writes
// nothing; the attention then gives NaN (a bad layer, a negative position) or sees the keys it can.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/decode_attention.h"
#include "cuda/decode_attention_kernels.cuh"
#include "cuda/handlers.h"
#include "cuda/norm_rope.cuh"
#include "cuda/programmatic_launch.cuh"
#include "debug_flags.h"
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
  float x = __bfloat162float(in[t]);
  if (norm != nullptr) x = Normalized(x, InverseRms<kWarps>(x * x, kHeadDim, a.eps, scratch), norm[t]);
  head[t] = x;
  __syncthreads();
  const bf16 rotated = RotatedHalf(x, head[t < kHalf ? t + kHalf : t - kHalf], a.cos[t], a.sin[t], t < kHalf);
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

ffi::Error GqaToken(cudaStream_t stream, ffi::Buffer<ffi::BF16> projected, ffi::Buffer<ffi::BF16> q_norm,
                    ffi::Buffer<ffi::BF16> k_norm, ffi::Buffer<ffi::F32> cos, ffi::Buffer<ffi::F32> sin,
                    ffi::Buffer<ffi::BF16> k_cache, ffi::Buffer<ffi::BF16> v_cache, ffi::Buffer<ffi::S32> layer,
                    ffi::Buffer<ffi::S32> position, ffi::Result<ffi::Buffer<ffi::BF16>> out,
                    ffi::Result<ffi::Buffer<ffi::BF16>> k_out, ffi::Result<ffi::Buffer<ffi::BF16>> v_out,
                    ffi::Result<ffi::Buffer<ffi::BF16>> q, ffi::Result<ffi::Buffer<ffi::F32>> partial, float scale,
                    int64_t window, float eps) {
  auto bad = [&](const std::string& why) {
    return ffi::Error::InvalidArgument("te_async gqa_token: " + why + " (projected " + Dims(projected.dimensions()) +
                                       ", k_cache " + Dims(k_cache.dimensions()) + ", v_cache " +
                                       Dims(v_cache.dimensions()) + ", out " + Dims(out->dimensions()) + ", partial " +
                                       Dims(partial->dimensions()) + ")");
  };
  const auto od = out->dimensions(), cd = k_cache.dimensions(), pd = partial->dimensions();
  if (od.size() != 4 || cd.size() != 5 || pd.size() != 4 || projected.dimensions().size() != 3) return bad("ranks");
  const int64_t batch = od[0], heads = od[2], layers = cd[0], max_len = cd[2], kv_heads = cd[3], splits = pd[0];
  const auto is = [](const auto& buffer, std::initializer_list<int64_t> dims) {
    const auto d = buffer.dimensions();
    return std::equal(d.begin(), d.end(), dims.begin(), dims.end());
  };
  const auto norm_ok = [&](const ffi::Buffer<ffi::BF16>& n) { return is(n, {0}) || is(n, {kHeadDim}); };
  if (!is(*out, {batch, 1, heads, kHeadDim}) || !is(projected, {batch, 1, (heads + 2 * kv_heads) * kHeadDim}) ||
      !is(k_cache, {layers, batch, max_len, kv_heads, kHeadDim}) ||
      !is(v_cache, {layers, batch, max_len, kv_heads, kHeadDim}) || !norm_ok(q_norm) || !norm_ok(k_norm) ||
      !is(cos, {kHeadDim}) || !is(sin, {kHeadDim}) || layer.element_count() != 1 || position.element_count() != 1 ||
      !is(*q, {batch, 1, heads, kHeadDim}) ||
      !is(*partial, {splits, batch * kv_heads, kMaxRows, kHeadDim + 2})) {
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
  const auto in = [](const ffi::Buffer<ffi::BF16>& b) { return static_cast<const bf16*>(b.untyped_data()); };
  const auto res = [](ffi::Result<ffi::Buffer<ffi::BF16>>& b) { return static_cast<bf16*>(b->untyped_data()); };
  const auto optional = [&](const ffi::Buffer<ffi::BF16>& b) { return b.element_count() == 0 ? nullptr : in(b); };
  if (PoisonOutputs()) {
    for (auto* r : {&out, &q}) {
      TE_ASYNC_CUDA(cudaMemsetAsync((*r)->untyped_data(), 0xff, (*r)->size_bytes(), stream));
    }
    TE_ASYNC_CUDA(cudaMemsetAsync(partial->untyped_data(), 0xff, partial->size_bytes(), stream));
  }
  const PrepArgs prep{in(projected), optional(q_norm), optional(k_norm), cos.typed_data(), sin.typed_data(),
                      layer.typed_data(), position.typed_data(), res(k_out), res(v_out), res(q),
                      static_cast<int>(batch), static_cast<int>(heads), static_cast<int>(kv_heads),
                      static_cast<int>(max_len), static_cast<int>(layers), eps};
  GqaTokenPrepKernel<<<dim3(heads + kv_heads, batch), kHeadDim, 0, stream>>>(prep);
  TE_ASYNC_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "launch of GqaTokenPrepKernel"));

  using namespace decode_attention_kernels;  // NOLINT: the kernels this call chains behind the prep
  const Args attend{res(q), res(q), res(k_out), res(k_out), res(v_out), layer.typed_data(), position.typed_data(),
                    static_cast<int>(batch), 1, static_cast<int>(heads), static_cast<int>(kv_heads),
                    static_cast<int>(max_len), static_cast<int>(layers), static_cast<int>(window),
                    SplitChunk(max_len, splits), scale * kLog2e, partial->typed_data(), res(out)};
  TE_ASYNC_RETURN_IF_ERROR(LaunchSplits<kShape>(stream, attend, static_cast<int>(splits), true));
  return LaunchMerge<kShape>(stream, attend, static_cast<int>(splits), true);
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

}  // namespace te_async
