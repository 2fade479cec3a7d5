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

#include "cuda/attention_tile.cuh"
#include "cuda/cuda_check.h"
#include "cuda/decode_attention.h"
#include "cuda/handlers.h"
#include "debug_flags.h"

namespace te_async {
namespace {

namespace ffi = xla::ffi;
using attention_tile::bf16;
using attention_tile::kRows;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kKeys = 8 * kWarps;  // keys per tile: a split's chunk is a multiple of it (decode_attention.KEY_TILE)
template <int DK, int DR, int DV, bool kValuesAreKeys>
using Layout = attention_tile::Layout<DK + DR, DV, kValuesAreKeys, kWarps>;

struct Args {
  const bf16 *q, *q_rope, *k, *k_rope, *v;  // q [B,T,H,dk], q_rope [B,T,H,dr]; k, k_rope, v [L,B,N,Hkv,d]
  const int *layer, *position;              // device scalars
  int batch, tokens, heads, kv_heads, max_len, layers, window, chunk;
  float scale_log2;  // the softmax scale times log2(e): scores are kept in log2 units
  float* partial;    // [splits, B*Hkv, kRows, dv + 2]: unnormalised output, then max and sum
  bf16* out;         // [B, T, H, dv]
};

template <int DK, int DR, int DV, bool kValuesAreKeys>
__global__ void __launch_bounds__(kThreads) DecodeAttentionKernel(Args a) {
  constexpr int DQ = DK + DR;
  using L = Layout<DK, DR, DV, kValuesAreKeys>;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sq = reinterpret_cast<bf16*>(smem + L::kQ);
  const float* s_max = reinterpret_cast<const float*>(smem + L::kStats);
  const float* s_sum = s_max + kRows;

  const int bh = blockIdx.y, b = bh / a.kv_heads, kv_head = bh % a.kv_heads;
  const int group = a.heads / a.kv_heads, rows = group * a.tokens;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int layer = *a.layer, position = *a.position;
  float* partial = a.partial + (static_cast<size_t>(blockIdx.x) * gridDim.y + bh) * kRows * (DV + 2);

  // Keys [first, last) that some row can see, within this split's chunk.
  int first = blockIdx.x * a.chunk;
  const int last = min(min(first + a.chunk, a.max_len), position + a.tokens);
  if (a.window > 0) first = max(first, position - a.window + 1);
  if (layer < 0 || layer >= a.layers || position < 0 || first >= last) {
    if (tid < kRows) partial[tid * (DV + 2) + DV] = -INFINITY, partial[tid * (DV + 2) + DV + 1] = 0.f;
    return;
  }

  // Row r: token r / group, head kv_head * group + r % group; rows from `rows` on are zeros.
  for (int c = tid; c < kRows * (DQ / 8); c += kThreads) {
    const int r = c / (DQ / 8), d = c % (DQ / 8) * 8;
    const size_t row = (static_cast<size_t>(b) * a.tokens + r / group) * a.heads + kv_head * group + r % group;
    const bf16* src = r >= rows ? a.q : d < DK ? a.q + row * DK + d : a.q_rope + row * DR + d - DK;
    attention_tile::CopyAsync16(sq + r * L::kQStride + d, src, r < rows);
  }
  const attention_tile::KeyRows keys{a.k, a.k_rope, a.v,
                                     (static_cast<size_t>(layer) * a.batch + b) * a.max_len * a.kv_heads + kv_head,
                                     static_cast<size_t>(a.kv_heads)};
  float o[L::kValueTiles][4];
  attention_tile::AttendChunk<DK, DR, DV, kValuesAreKeys, kWarps>(keys, first, last, {rows, group, position, a.window},
                                                              a.scale_log2, smem, o);
#pragma unroll
  for (int j = 0; j < L::kValueTiles; ++j) {
    const int col = warp * (DV / kWarps) + j * 8 + 2 * t4;
    partial[g * (DV + 2) + col] = o[j][0], partial[g * (DV + 2) + col + 1] = o[j][1];
    partial[(g + 8) * (DV + 2) + col] = o[j][2], partial[(g + 8) * (DV + 2) + col + 1] = o[j][3];
  }
  if (tid < kRows) partial[tid * (DV + 2) + DV] = s_max[tid], partial[tid * (DV + 2) + DV + 1] = s_sum[tid];
}

template <typename Op>
__device__ __forceinline__ float BlockReduce(float x, float* scratch, Op op) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, d));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  x = scratch[0];
  for (int w = 1; w < kWarps; ++w) x = op(x, scratch[w]);
  __syncthreads();  // scratch is reused by the next reduction
  return x;
}

// The merge: out = sum_s 2^(max_s - M) O_s / sum_s 2^(max_s - M) sum_s over the splits s of a row.
// Block (bh, r, chunk) takes kMergeColumns columns of row r: thread (lane, quad) adds up 4 columns
// over the splits lane, lane + kMergeLanes, ..., so that every load of a thread is independent of
// the others (one block walking all splits of a row took 16 us at 64 splits, DeepSeek-V2-Lite at
// B=1); the lanes' sums are then added in lane order, so the result is the same in every run.
// Splits that saw no key (max -inf) never wrote O and are skipped.
constexpr int kMergeColumns = 64;
constexpr int kMergeQuads = kMergeColumns / 4;
constexpr int kMergeLanes = kThreads / kMergeQuads;

template <int DV>
__global__ void __launch_bounds__(kThreads) CombineKernel(Args a, int splits) {
  static_assert(DV % kMergeColumns == 0, "whole merge chunks");
  __shared__ float weight[kDecodeAttentionMaxSplits];
  __shared__ float scratch[kWarps];
  __shared__ float4 lane_sums[kMergeLanes][kMergeQuads];
  const int bh = blockIdx.x, r = blockIdx.y, b = bh / a.kv_heads, kv_head = bh % a.kv_heads;
  const int group = a.heads / a.kv_heads;
  if (r >= group * a.tokens) return;
  const size_t split_stride = static_cast<size_t>(gridDim.x) * kRows * (DV + 2);
  const float* row = a.partial + (static_cast<size_t>(bh) * kRows + r) * (DV + 2);
  float m = -INFINITY;
  for (int s = threadIdx.x; s < splits; s += kThreads) m = fmaxf(m, row[s * split_stride + DV]);
  m = BlockReduce(m, scratch, [](float x, float y) { return fmaxf(x, y); });
  float total = 0.f;
  for (int s = threadIdx.x; s < splits; s += kThreads) {
    const float ms = row[s * split_stride + DV];
    weight[s] = ms == -INFINITY ? 0.f : exp2f(ms - m);
    total += weight[s] * row[s * split_stride + DV + 1];
  }
  total = BlockReduce(total, scratch, [](float x, float y) { return x + y; });  // also publishes `weight`
  const int quad = threadIdx.x % kMergeQuads, lane = threadIdx.x / kMergeQuads;
  const int col = blockIdx.z * kMergeColumns + 4 * quad;
  float4 acc = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
  for (int s = lane; s < splits; s += kMergeLanes) {
    if (weight[s] == 0.f) continue;
    // (DV + 2) floats per row: an 8-byte aligned pair of float2 loads, not a float4
    const float2 lo = *reinterpret_cast<const float2*>(row + s * split_stride + col);
    const float2 hi = *reinterpret_cast<const float2*>(row + s * split_stride + col + 2);
    acc.x += weight[s] * lo.x, acc.y += weight[s] * lo.y, acc.z += weight[s] * hi.x, acc.w += weight[s] * hi.y;
  }
  lane_sums[lane][quad] = acc;
  __syncthreads();
  if (lane != 0) return;
  for (int l = 1; l < kMergeLanes; ++l) {
    const float4 x = lane_sums[l][quad];
    acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
  }
  bf16* out = a.out + ((static_cast<size_t>(b) * a.tokens + r / group) * a.heads + kv_head * group + r % group) * DV;
  // no key seen: 0 / 0
  out[col] = __float2bfloat16(acc.x / total), out[col + 1] = __float2bfloat16(acc.y / total);
  out[col + 2] = __float2bfloat16(acc.z / total), out[col + 3] = __float2bfloat16(acc.w / total);
}

// Instantiated shape I: its split kernel and that kernel's shared memory.
template <int I>
struct Shape {
  static constexpr DecodeAttentionShape s = kDecodeAttentionShapes[I];
  static constexpr size_t kBytes = Layout<s.key_dims, s.rope_dims, s.value_dims, s.values_are_keys>::kBytes;
  static constexpr auto kKernel = DecodeAttentionKernel<s.key_dims, s.rope_dims, s.value_dims, s.values_are_keys>;
};

// The split kernel of shape I, allowed its shared memory (before a launch or an occupancy query).
template <int I>
cudaError_t AllowSharedMemory() {
  return cudaFuncSetAttribute(Shape<I>::kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(Shape<I>::kBytes));
}

template <int I>
ffi::Error Launch(cudaStream_t stream, const Args& a, int splits) {
  TE_ASYNC_CUDA((AllowSharedMemory<I>()));
  Shape<I>::kKernel<<<dim3(splits, a.batch * a.kv_heads), kThreads, Shape<I>::kBytes, stream>>>(a);
  TE_ASYNC_CUDA(cudaGetLastError());
  constexpr int kValueDims = Shape<I>::s.value_dims;
  CombineKernel<kValueDims><<<dim3(a.batch * a.kv_heads, kRows, kValueDims / kMergeColumns), kThreads, 0, stream>>>(
      a, splits);
  return CudaStatus(cudaGetLastError(), "launch of the decode attention's CombineKernel");
}

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
         scale * 1.4426950408889634f /* log2(e) */, partial->typed_data(), static_cast<bf16*>(out->untyped_data())};
  a.chunk = static_cast<int>(((max_len + splits - 1) / splits + kKeys - 1) / kKeys * kKeys);
  if (PoisonOutputs()) TE_ASYNC_CUDA(cudaMemsetAsync(out->untyped_data(), 0xff, out->size_bytes(), stream));
  if (out->element_count() == 0) return ffi::Error::Success();
  return WithShape(
      static_cast<int>(dk), static_cast<int>(dr), static_cast<int>(dv), values_are_keys,
      [&](auto i) { return Launch<decltype(i)::value>(stream, a, splits); },
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
