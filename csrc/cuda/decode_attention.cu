// Decode attention over a stacked KV cache, read where it lies.
//
// Inside the decoder's scan over a run of layers the cache is one array [L, B, N, ...]. XLA's
// attention reads layer l of it through a dynamic slice that it materialises: a copy of the whole
// layer's cache in every step (4.78 of 20.6 ms of GPU time in DeepSeek-V2-Lite's B=64 step). This
// kernel takes the stacked array and the layer index (a device scalar) instead, reads only the keys
// some query can see (up to position + T), and reads each key once, for the scores and the values.
//
// Flash decoding. Block (split, b * Hkv + kv_head) takes the query rows that share a kv head (its
// G = H / Hkv query heads times the T new tokens, at most 16: one MMA tile) against one chunk of
// keys, in tiles of 32 keys (attention_tile.cuh's AttendChunk: tensor-core scores and P.V with an
// online softmax); the block writes its unnormalised output with its running max and sum, and
// CombineKernel merges the splits in a fixed order (deterministic). A query that sees no key (a negative position, a bad layer index) gets
// NaN, as a softmax over nothing does.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <iterator>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/cuda_check.h"
#include "cuda/decode_attention.h"
#include "cuda/decode_attention_kernels.cuh"
#include "cuda/handlers.h"
#include "cuda/poison.h"

namespace te_async {
namespace {

namespace ffi = xla::ffi;
using namespace decode_attention_kernels;  // NOLINT: the kernels this file launches

template <int I>
using ShapeAt = std::integral_constant<int, I>;

// found(ShapeAt<i>{}) for the instantiated shape i of these dims, none() where no kernel takes them.
template <typename Found, typename None>
auto WithShape(int key_dims, int rope_dims, int value_dims, bool values_are_keys, Found found, None none) {
  static_assert(std::size(kDecodeAttentionShapes) == 2, "one case per instantiated shape");
  const auto is = [&](const DecodeAttentionShape& s) {
    return key_dims == s.key_dims && rope_dims == s.rope_dims && value_dims == s.value_dims &&
           values_are_keys == s.values_are_keys;
  };
  if (is(kDecodeAttentionShapes[0])) return found(ShapeAt<0>{});
  if (is(kDecodeAttentionShapes[1])) return found(ShapeAt<1>{});
  return none();
}

ffi::Error DecodeAttention(cudaStream_t stream, ffi::Buffer<ffi::BF16> q, ffi::Buffer<ffi::BF16> q_rope,
                           ffi::Buffer<ffi::BF16> k, ffi::Buffer<ffi::BF16> k_rope, ffi::Buffer<ffi::BF16> v,
                           ffi::Buffer<ffi::S32> layer, ffi::Buffer<ffi::S32> position,
                           ffi::Result<ffi::Buffer<ffi::BF16>> out, ffi::Result<ffi::Buffer<ffi::F32>> partial,
                           float scale, int64_t window, bool values_are_keys) {
  auto bad = [](const std::string& why) { return ffi::Error::InvalidArgument("te_async decode_attention: " + why); };
  const auto qd = q.dimensions(), rd = q_rope.dimensions(), kd = k.dimensions(), krd = k_rope.dimensions();
  const auto vd = v.dimensions(), od = out->dimensions(), pd = partial->dimensions();
  if (qd.size() != 4 || rd.size() != 4 || kd.size() != 5 || krd.size() != 5 || vd.size() != 5 || od.size() != 4 ||
      pd.size() != 4 || layer.element_count() != 1 || position.element_count() != 1) {
    return bad("ranks: q, q_rope, out [B,T,H,d]; k, k_rope, v [L,B,N,Hkv,d]; partial [splits, B*Hkv, 16, dv+2]; "
               "layer and position scalars");
  }
  const int64_t batch = qd[0], tokens = qd[1], heads = qd[2], dk = qd[3], dr = rd[3];
  const int64_t layers = kd[0], max_len = kd[2], kv_heads = kd[3], dv = vd[4], splits = pd[0];
  const bool same_lead = rd[0] == batch && rd[1] == tokens && rd[2] == heads && od[0] == batch && od[1] == tokens &&
                         od[2] == heads && od[3] == dv;
  bool same_cache = kd[1] == batch && kd[4] == dk && krd[4] == dr;
  for (int i = 0; i < 4; ++i) same_cache = same_cache && krd[i] == kd[i] && vd[i] == kd[i];
  if (!same_lead || !same_cache || kv_heads < 1 || heads % kv_heads != 0) {
    return bad("shapes disagree: q [B,T,H,dk], q_rope [B,T,H,dr], k [L,B,N,Hkv,dk], k_rope [L,B,N,Hkv,dr], "
               "v [L,B,N,Hkv,dv], out [B,T,H,dv], H a multiple of Hkv");
  }
  if (heads / kv_heads * tokens > kRows) {
    return bad("at most " + std::to_string(kRows) + " query rows per kv head (H / Hkv * T), got " +
               std::to_string(heads / kv_heads * tokens));
  }
  if (splits < 1 || splits > kDecodeAttentionMaxSplits || pd[1] != batch * kv_heads || pd[2] != kRows ||
      pd[3] != dv + 2 || batch * kv_heads > 65535) {
    return bad("partial must be [splits <= " + std::to_string(kDecodeAttentionMaxSplits) +
               ", B*Hkv <= 65535, 16, dv + 2]");
  }
  if (values_are_keys && (v.untyped_data() != k.untyped_data() || dv != dk)) {
    return bad("values_are_keys needs v to be k itself");
  }
  if (max_len > (int64_t{1} << 30) || layers * batch * max_len * kv_heads > (int64_t{1} << 40)) {
    return bad("the cache is too large");
  }
  const auto in = [](const ffi::Buffer<ffi::BF16>& x) { return static_cast<const bf16*>(x.untyped_data()); };
  Args a{in(q), in(q_rope), in(k), in(k_rope), in(v),
         layer.typed_data(), position.typed_data(), static_cast<int>(batch), static_cast<int>(tokens),
         static_cast<int>(heads), static_cast<int>(kv_heads), static_cast<int>(max_len), static_cast<int>(layers),
         static_cast<int>(window), 0,
         scale * kLog2e, partial->typed_data(), static_cast<bf16*>(out->untyped_data())};
  a.chunk = SplitChunk(max_len, splits);
  // The splits' outputs too: only a split that sees no key leaves its O unwritten.
  TE_ASYNC_RETURN_IF_ERROR(PoisonOutputBuffers(stream, *out, *partial));
  if (out->element_count() == 0) return ffi::Error::Success();
  return WithShape(
      static_cast<int>(dk), static_cast<int>(dr), static_cast<int>(dv), values_are_keys,
      [&](auto i) {
        constexpr int I = decltype(i)::value;
        TE_ASYNC_RETURN_IF_ERROR(LaunchSplits<I>(stream, a, splits, false));
        return LaunchMerge<I>(stream, a, splits, false);
      },
      [&] {
        return bad("no kernel for key dims " + std::to_string(dk) + ", rope dims " + std::to_string(dr) +
                   ", value dims " + std::to_string(dv) + (values_are_keys ? " with the values the keys" : "") +
                   " (te_async._ffi.cuda_module().DECODE_ATTENTION_SHAPES)");
      });
}

}  // namespace

int DecodeAttentionBlocksPerSm(int key_dims, int rope_dims, int value_dims, bool values_are_keys) {
  const auto check = [](cudaError_t status, const char* what) {
    if (status != cudaSuccess) {
      throw std::runtime_error(std::string("te_async decode_attention: ") + what + " failed: " +
                               cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
    }
  };
  return WithShape(
      key_dims, rope_dims, value_dims, values_are_keys,
      [&](auto i) {
        constexpr int I = decltype(i)::value;
        check(AllowSharedMemory<I>(), "cudaFuncSetAttribute");
        int blocks = 0;
        check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, Shape<I>::kKernel, kThreads, Shape<I>::kBytes),
              "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
        return blocks;
      },
      [] { return 0; });
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kDecodeAttentionCuda, DecodeAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("window")
                                  .Attr<bool>("values_are_keys"),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace te_async
