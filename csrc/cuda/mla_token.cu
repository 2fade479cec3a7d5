// DeepSeek's multi-head latent attention for one new token per sequence, the whole attention half
// of a decoder layer (input_layernorm to the residual add), in one FFI call of five kernels, each
// but the first a programmatic dependent of the one before (programmatic_launch.cuh;
// te_async/mla_token.py). At batch 1 XLA ran this part of a layer as about 24 kernels and two
// copies of the layer's cache slice (docs/design-b1-attention-block.md).
//
//   0. ProductKernel (token_product.cuh) with a norm weight, block (32 columns, two sequences):
//      input_layernorm of the residual stream x and its product with w_in, q_proj's and
//      kv_a_proj_with_mqa's weights side by side.
//   1. MlaTokenPrepKernel, block (head h x 64 latent columns, sequence b): the absorbed query
//      q_latent[h, cols] = q_nope[h] . W_uk[h][:, cols] over wkv_b's key half; the first column
//      block of each head also rotates the head's rope query, and one more block per sequence
//      normalises the new latent (kv_a_layernorm), rotates the rope key and writes both into the
//      stacked cache at (layer, b, position), in place (the call's cache outputs alias its inputs).
//   2. DecodeAttentionKernel over the latent cache, one kv head (decode_attention_kernels.cuh), of
//      8 warps: each key split's unnormalised output with its max and sum.
//   3. MlaTokenOutKernel, block (head h x latent part, sequence b): the merge of head h's splits into
//      a quarter of its latent output, then that quarter's columns of W_uv[h] (wkv_b's value half)
//      times it: the head's output as four partial sums.
//   4. ProductKernel with a residual, block (16 columns, two sequences): x + o_proj over the heads'
//      outputs (the partial sums added in order and rounded).
// Each boundary needs the whole previous result, hence five kernels. Each lets the next start at
// once: the dependents load their weights (W_uk, W_uv, o_proj's: 2, 2 and 8 MB at DeepSeek-V2-
// Lite's shapes) into registers while the kernels before them, which leave most of the HBM's
// bandwidth unused at one sequence, run.
//
// Values are rounded to bf16 where te_async.models' unfused path rounds them: both RMSNorms
// (normalise in f32, round, times the weight, round), the input projections, both rotated rope
// parts, the latent query, the attention's latent output, the heads' outputs, o_proj's output and
// the residual sum. A layer index or position outside the cache writes nothing; the attention then
// gives NaN (a bad layer, a negative position) or sees the keys it can (a position past the cache,
// whose logits te_async.models makes NaN).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "cuda/block_reduce.cuh"
#include "cuda/cuda_check.h"
#include "cuda/decode_attention_kernels.cuh"
#include "cuda/float_convert.cuh"
#include "cuda/handlers.h"
#include "cuda/mla_decode.h"
#include "cuda/mla_token.h"
#include "cuda/norm_rope.cuh"
#include "cuda/poison.h"
#include "cuda/programmatic_launch.cuh"
#include "cuda/token_product.cuh"
#include "cuda/vector_loads.cuh"
#include "grouped_gemm_args.h"

namespace te_async {
namespace {

namespace ffi = xla::ffi;
using bf16 = __nv_bfloat16;
using token_product::ColumnSums;
using token_product::kInputColumns;
using token_product::kOutputColumns;
using token_product::kProductGroups;
using token_product::LaunchProduct;
using token_product::LoadRows;
using token_product::ProductArgs;

constexpr int kNope = kMlaDecodeDims.nope, kRope = kMlaDecodeDims.rope;
constexpr int kLatent = kMlaDecodeDims.latent, kValue = kMlaDecodeDims.value;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = kDecodeAttentionMaxRows;  // the split kernel's query rows: one per head
constexpr int kLatentColumns = 64;              // absorbed-query columns per prep block: 16 KB of W_uk
constexpr int kLatentBlocks = kLatent / kLatentColumns;
constexpr int kColumnVectors = kLatentColumns / 8;        // 16-byte vectors of a W_uk row slice
constexpr int kRowGroups = kThreads / kColumnVectors;     // prep thread (g, v): rows g, g + kRowGroups, ...
constexpr int kRowsPerThread = kNope / kRowGroups;
// MlaTokenOutKernel, block (head, latent part, sequence): kPartColumns latent columns of the head's
// merge, then their share of W_uv times the merged latent (32 KB of W_uv a block).
constexpr int kParts = kMlaTokenLatentParts;
constexpr int kPartColumns = kLatent / kParts;
constexpr int kOutThreads = 512;
constexpr int kOutWarps = kOutThreads / 32;
constexpr int kMergePairs = kPartColumns / 2;             // merge thread (group, pair): columns 2 pair, 2 pair + 1
constexpr int kMergeGroups = kOutThreads / kMergePairs;   // of splits group, group + kMergeGroups, ...
constexpr int kMergeAhead = 8;                            // of which the first 8 are loaded before the stats
constexpr int kPartVectors = kPartColumns / 8;            // W_uv thread (g, v): 16-byte vector v of the part
constexpr int kPartRowGroups = kOutThreads / kPartVectors;  // of rows g, g + kPartRowGroups, ...
constexpr int kPartRows = kValue / kPartRowGroups;
// ProductKernel's blocks, kernels 0 and 4 (token_product.cuh's widths): thread (g, v) of a block owns
// 16-byte column vector v and rows g, g + kProductGroups, ...; o_proj's blocks fit beside the
// attention's, during which they load their rows.
constexpr int kLatentPerThread = kLatent / kThreads;
// The split kernel's warps: 8 take a 64-key tile, so that at one sequence each of the 64 splits
// attends one tile (4 warps took two 32-key tiles one after the other, 14.5 us at DeepSeek-V2-Lite's
// 4096 keys). It is instantiated for shape 0 of kDecodeAttentionShapes.
constexpr int kSplitWarps = 8;
constexpr DecodeAttentionShape kShape = kDecodeAttentionShapes[0];
static_assert(kShape.key_dims == kLatent && kShape.rope_dims == kRope && kShape.value_dims == kLatent &&
                  kShape.values_are_keys,
              "decode attention's shape 0 is MLA's latent cache");
static_assert(kLatent % kLatentColumns == 0 && kNope % kRowGroups == 0 && kLatent == 2 * kThreads &&
                  kLatent % kParts == 0 && kOutThreads % kMergePairs == 0 && kOutThreads % kPartVectors == 0 &&
                  kValue % kPartRowGroups == 0 && 32 % kPartVectors == 0 &&
                  kDecodeAttentionMaxSplits <= kOutThreads && kRope <= kThreads && kNope <= kThreads &&
                  kMlaTokenHiddenStep == kProductGroups && kDecodeAttentionMaxRows * kValue <= kMlaTokenMaxHidden &&
                  kValue % kProductGroups == 0 && (kNope + kRope) % kInputColumns == 0 &&
                  (kLatent + kRope) % kInputColumns == 0 && kMlaTokenHiddenStep % kOutputColumns == 0,
              "whole blocks");

struct PrepArgs {
  const bf16 *projected, *kv_norm, *w_kv;  // projected [B, width]: q [H, dn + dr] then kv_a [latent + dr];
                                           // kv_norm [latent], w_kv [H, dn + dv, latent]
  const float *cos, *sin;                 // [dr], the token's rotation (with YaRN's attention factor)
  const int *layer, *position;            // device scalars
  bf16 *ckv, *kpe;                        // the stacked cache [L, B, N, latent] and [L, B, N, dr]
  bf16 *q_latent, *q_rope;                // [B, H, latent], [B, H, dr]
  int batch, heads, width, max_len, layers;
  float eps;
  bool interleaved;  // the rope parts come as DeepSeek's interleaved pairs (rope.interleaved_to_half)
};

struct OutArgs {
  const float* partial;  // the split kernel's [splits, B, kRows, latent + 2]
  const bf16* w_kv;      // [H, dn + dv, latent]
  float* attention;      // [kParts, B, H * dv]: the heads' outputs as kParts partial sums, o_proj's input
  int heads, splits;
};

// Element i of rope part x (dr values) rotated as te_async.models.rope.apply_rope does, in the half
// layout (interleaved: DeepSeek's pairs, read as halves).
__device__ __forceinline__ bf16 Rotated(const bf16* x, int i, const float* cos, const float* sin, bool interleaved) {
  constexpr int kHalf = kRope / 2;
  const auto at = [&](int j) {
    return __bfloat162float(x[interleaved ? (j < kHalf ? 2 * j : 2 * (j - kHalf) + 1) : j]);
  };
  return RotatedHalf(at(i), at(i < kHalf ? i + kHalf : i - kHalf), cos[i], sin[i], i < kHalf);
}

// The prep's last block of each sequence: kv_a_layernorm of the new latent and the rotated rope key
// into the cache at (layer, b, position). It reads the call's inputs (the rotation, kv_norm, the
// layer and position) before it waits for the input projections; the other blocks' absorbed query
// runs beside it (block (0, b) did both, one after the other).
__device__ void WriteCacheRow(const PrepArgs& a, int b) {
  __shared__ float rotation[2][kRope];
  __shared__ float scratch[kWarps];
  const int tid = threadIdx.x, layer = *a.layer, position = *a.position;
  if (tid < kRope) rotation[0][tid] = a.cos[tid], rotation[1][tid] = a.sin[tid];
  bf16 weight[kLatentPerThread];
#pragma unroll
  for (int j = 0; j < kLatentPerThread; ++j) weight[j] = a.kv_norm[tid + j * kThreads];
  __syncthreads();  // `rotation`
  WaitForPrevious();  // kv_a
  const bf16* kv = a.projected + static_cast<size_t>(b) * a.width + a.heads * (kNope + kRope);
  const bf16 rope = tid < kRope ? Rotated(kv + kLatent, tid, rotation[0], rotation[1], a.interleaved) : bf16{};
  float x[kLatentPerThread], squares = 0.f;
#pragma unroll
  for (int j = 0; j < kLatentPerThread; ++j) {
    x[j] = __bfloat162float(kv[tid + j * kThreads]);
    squares = fmaf(x[j], x[j], squares);
  }
  const float r = InverseRms<kWarps>(squares, kLatent, a.eps, scratch);
  if (layer < 0 || layer >= a.layers || position < 0 || position >= a.max_len) return;
  const size_t row = (static_cast<size_t>(layer) * a.batch + b) * a.max_len + position;
  bf16* c = a.ckv + row * kLatent;
#pragma unroll
  for (int j = 0; j < kLatentPerThread; ++j) c[tid + j * kThreads] = __float2bfloat16(Normalized(x[j], r, weight[j]));
  if (tid < kRope) a.kpe[row * kRope + tid] = rope;
}

// Blocks (h x part, b) for the heads' absorbed queries (and, part 0, the rotated rope query): thread
// (g, v) loads its rows of the block's W_uk slice before it waits for the input projections. Block
// (heads x kLatentBlocks, b): WriteCacheRow.
__global__ void __launch_bounds__(kThreads) MlaTokenPrepKernel(PrepArgs a) {
  StartDependents();
  const int b = blockIdx.y;
  if (blockIdx.x == a.heads * kLatentBlocks) return WriteCacheRow(a, b);
  __shared__ float q_nope[kNope];
  __shared__ float sums[kWarps * kLatentColumns];
  const int h = blockIdx.x / kLatentBlocks, part = blockIdx.x % kLatentBlocks, tid = threadIdx.x;
  const int v = tid % kColumnVectors, g = tid / kColumnVectors;
  const bf16* w = a.w_kv + (static_cast<size_t>(h) * (kNope + kValue) + g) * kLatent + part * kLatentColumns + v * 8;
  uint4 wv[kRowsPerThread];
  LoadRows(wv, w, kRowGroups * kLatent, kRowsPerThread);
  WaitForPrevious();  // q
  const size_t bh = static_cast<size_t>(b) * a.heads + h;
  const bf16* q = a.projected + static_cast<size_t>(b) * a.width + h * (kNope + kRope);
  if (tid < kNope) q_nope[tid] = __bfloat162float(q[tid]);
  __syncthreads();
  const float sum = ColumnSums<1, kLatentColumns, kThreads>(wv, kRowsPerThread, q_nope, 0, 1, sums);
  if (tid < kLatentColumns) a.q_latent[bh * kLatent + part * kLatentColumns + tid] = __float2bfloat16(sum);
  if (part == 0 && tid < kRope) a.q_rope[bh * kRope + tid] = Rotated(q + kNope, tid, a.cos, a.sin, a.interleaved);
}

// Two floats at p by a relaxed load at GPU scope, which ptxas keeps in program order among the
// others (it issued the merge's plain stats load first, waited for it in the max's shuffles and only
// then issued the loads meant to overlap that wait). Read from L2, where the split kernel wrote them.
__device__ __forceinline__ float2 LoadPairInOrder(const float* p) {
  float2 v;
  asm volatile("ld.relaxed.gpu.global.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "l"(p));
  return v;
}

// The merge of head h's key splits into latent columns [part, part + 1) kPartColumns of its output
// (as CombineKernel: weights 2^(max_s - M) in a fixed order, rounded to bf16 as decode_attention's
// output is), then those columns of W_uv[h] times them: the head's output as kParts partial sums,
// which o_proj's kernel adds in order. A block per head read all 64 splits' 514 floats (131 KB) and
// took 5.3 us at B=1; a quarter of them each, four blocks a head. The block's W_uv rows are loaded
// into registers before it waits for the split kernel, and its first kMergeAhead splits' columns
// before it reduces the splits' stats.
__global__ void __launch_bounds__(kOutThreads) MlaTokenOutKernel(OutArgs a) {
  StartDependents();  // o_proj's kernel may start loading its weights
  __shared__ float weight[kDecodeAttentionMaxSplits];
  __shared__ float2 group_sums[kMergeGroups][kMergePairs];
  __shared__ float latent[kPartColumns];
  __shared__ float scratch[kOutWarps];
  const int h = blockIdx.x / kParts, part = blockIdx.x % kParts, b = blockIdx.y, tid = threadIdx.x;
  const int v = tid % kPartVectors, g = tid / kPartVectors;
  uint4 wv[kPartRows];
  LoadRows(wv, a.w_kv + (static_cast<size_t>(h) * (kNope + kValue) + kNope + g) * kLatent + part * kPartColumns + v * 8,
           kPartRowGroups * kLatent, kPartRows);
  WaitForPrevious();  // the split kernel's partial outputs

  const size_t split_stride = static_cast<size_t>(gridDim.y) * kRows * (kLatent + 2);
  const float* row = a.partial + (static_cast<size_t>(b) * kRows + h) * (kLatent + 2);
  const int pair = tid % kMergePairs, group = tid / kMergePairs;
  const float* column = row + part * kPartColumns + 2 * pair;  // (latent + 2) floats a row: 8-byte aligned pairs
  float2 ahead[kMergeAhead];
#pragma unroll
  for (int k = 0; k < kMergeAhead; ++k) {
    const int s = group + k * kMergeGroups;
    ahead[k] = s < a.splits ? LoadPairInOrder(column + s * split_stride) : make_float2(0.f, 0.f);
  }
  const float2 stats =
      tid < a.splits ? LoadPairInOrder(row + tid * split_stride + kLatent) : make_float2(-INFINITY, 0.f);
  const float m = BlockReduce<kOutWarps>(stats.x, scratch, [](float x, float y) { return fmaxf(x, y); });
  const float ws = stats.x == -INFINITY ? 0.f : exp2f(stats.x - m);  // a split that saw no key wrote no output
  if (tid < a.splits) weight[tid] = ws;
  const float total = BlockReduce<kOutWarps>(ws * stats.y, scratch, [](float x, float y) { return x + y; });
  float2 acc = {0.f, 0.f};  // `weight` is published by the reduction's barrier
  const auto add = [&](int s, float2 o) {
    const float w = weight[s];
    acc.x += w == 0.f ? 0.f : w * o.x;
    acc.y += w == 0.f ? 0.f : w * o.y;
  };
#pragma unroll
  for (int k = 0; k < kMergeAhead; ++k) {
    if (group + k * kMergeGroups < a.splits) add(group + k * kMergeGroups, ahead[k]);
  }
  for (int s = group + kMergeAhead * kMergeGroups; s < a.splits; s += kMergeGroups) {
    add(s, *reinterpret_cast<const float2*>(column + s * split_stride));
  }
  group_sums[group][pair] = acc;
  __syncthreads();
  if (group == 0) {  // the groups added in order; 0 / 0 where no split saw a key
    for (int i = 1; i < kMergeGroups; ++i) acc.x += group_sums[i][pair].x, acc.y += group_sums[i][pair].y;
    latent[2 * pair] = Rounded<bf16>(acc.x / total), latent[2 * pair + 1] = Rounded<bf16>(acc.y / total);
  }
  __syncthreads();

  // Row g + i kPartRowGroups of W_uv[h] times the part's latent: each thread its vector, then the
  // kPartVectors threads of the row (lanes of one warp) by a butterfly.
  float* out = a.attention + (static_cast<size_t>(part) * gridDim.y + b) * a.heads * kValue + h * kValue + g;
#pragma unroll
  for (int i = 0; i < kPartRows; ++i) {
    float f[8], sum = 0.f;
    Unpack<bf16>(wv[i], f);
#pragma unroll
    for (int j = 0; j < 8; ++j) sum = fmaf(f[j], latent[v * 8 + j], sum);
    sum = LaneGroupReduce(sum, kPartVectors, [](float x, float y) { return x + y; });
    if (v == 0) out[i * kPartRowGroups] = sum;
  }
}

ffi::Error MlaToken(cudaStream_t stream, ffi::Buffer<ffi::BF16> x, ffi::Buffer<ffi::BF16> norm,
                    ffi::Buffer<ffi::BF16> w_in, ffi::Buffer<ffi::BF16> kv_norm, ffi::Buffer<ffi::BF16> w_kv,
                    ffi::Buffer<ffi::BF16> wo, ffi::Buffer<ffi::F32> cos, ffi::Buffer<ffi::F32> sin,
                    ffi::Buffer<ffi::BF16> ckv, ffi::Buffer<ffi::BF16> kpe, ffi::Buffer<ffi::S32> layer,
                    ffi::Buffer<ffi::S32> position, ffi::Result<ffi::Buffer<ffi::BF16>> out,
                    ffi::Result<ffi::Buffer<ffi::BF16>> ckv_out, ffi::Result<ffi::Buffer<ffi::BF16>> kpe_out,
                    ffi::Result<ffi::Buffer<ffi::BF16>> projected, ffi::Result<ffi::Buffer<ffi::BF16>> q_latent,
                    ffi::Result<ffi::Buffer<ffi::BF16>> q_rope, ffi::Result<ffi::Buffer<ffi::F32>> partial,
                    ffi::Result<ffi::Buffer<ffi::F32>> attention, float scale, int64_t window, float eps,
                    float latent_eps, bool interleaved) {
  auto bad = [&](const std::string& why) {
    return ffi::Error::InvalidArgument("te_async mla_token: " + why + " (x " + Dims(x.dimensions()) + ", w_in " +
                                       Dims(w_in.dimensions()) + ", w_kv " + Dims(w_kv.dimensions()) + ", wo " +
                                       Dims(wo.dimensions()) + ", ckv " + Dims(ckv.dimensions()) + ", kpe " +
                                       Dims(kpe.dimensions()) + ", partial " + Dims(partial->dimensions()) + ")");
  };
  const auto xd = x.dimensions(), cd = ckv.dimensions(), pd = partial->dimensions(), kd = w_kv.dimensions();
  if (xd.size() != 3 || cd.size() != 4 || pd.size() != 4 || kd.size() != 3) return bad("ranks");
  const int64_t batch = xd[0], hidden = xd[2], heads = kd[0], layers = cd[0], max_len = cd[2], splits = pd[0];
  const int64_t width = heads * (kNope + kRope) + kLatent + kRope;  // w_in's columns: q, then kv_a
  const auto is = [](const auto& buffer, std::initializer_list<int64_t> dims) {
    const auto d = buffer.dimensions();
    return std::equal(d.begin(), d.end(), dims.begin(), dims.end());
  };
  if (!is(x, {batch, 1, hidden}) || !is(norm, {hidden}) || !is(w_in, {hidden, width}) || !is(kv_norm, {kLatent}) ||
      !is(w_kv, {heads, kNope + kValue, kLatent}) || !is(wo, {heads * kValue, hidden}) || !is(cos, {kRope}) ||
      !is(sin, {kRope}) || !is(ckv, {layers, batch, max_len, kLatent}) ||
      !is(kpe, {layers, batch, max_len, kRope}) || layer.element_count() != 1 || position.element_count() != 1 ||
      !is(*out, {batch, 1, hidden}) || !is(*projected, {batch, 1, width}) ||
      !is(*q_latent, {batch, 1, heads, kLatent}) || !is(*q_rope, {batch, 1, heads, kRope}) ||
      !is(*partial, {splits, batch, kRows, kLatent + 2}) || !is(*attention, {kParts, batch, heads * kValue})) {
    return bad("shapes: x [B, 1, hidden], norm [hidden], w_in [hidden, H * " + std::to_string(kNope + kRope) +
               " + " + std::to_string(kLatent + kRope) + "], w_kv [H, " + std::to_string(kNope + kValue) + ", " +
               std::to_string(kLatent) + "], wo [H * " + std::to_string(kValue) +
               ", hidden], cache [L, B, N, latent and rope], partial [splits, B, 16, latent + 2]");
  }
  if (heads < 1 || heads > kDecodeAttentionMaxRows || batch < 1 || batch > 65535 || splits < 1 ||
      splits > kDecodeAttentionMaxSplits || hidden < 1 || hidden > kMlaTokenMaxHidden ||
      hidden % kMlaTokenHiddenStep != 0 || max_len > (int64_t{1} << 30) ||
      layers * batch * max_len > (int64_t{1} << 40)) {
    return bad("1 to " + std::to_string(kDecodeAttentionMaxRows) + " heads, 1 to " +
               std::to_string(kDecodeAttentionMaxSplits) + " splits, a hidden size of at most " +
               std::to_string(kMlaTokenMaxHidden) + " that is a multiple of " + std::to_string(kMlaTokenHiddenStep) +
               ", a cache of at most 2^30 tokens");
  }
  if (ckv_out->untyped_data() != ckv.untyped_data() || kpe_out->untyped_data() != kpe.untyped_data()) {
    return bad("the cache outputs must alias the cache inputs");
  }
  const auto in = [](const ffi::Buffer<ffi::BF16>& b) { return static_cast<const bf16*>(b.untyped_data()); };
  const auto res = [](ffi::Result<ffi::Buffer<ffi::BF16>>& b) { return static_cast<bf16*>(b->untyped_data()); };
  // The splits' outputs too: only a split that sees no key leaves its O unwritten.
  TE_ASYNC_RETURN_IF_ERROR(PoisonOutputBuffers(stream, *out, *projected, *q_latent, *q_rope, *partial, *attention));
  const ProductArgs input{in(x), nullptr, in(norm), in(w_in), nullptr, res(projected), static_cast<int>(batch),
                          static_cast<int>(hidden), static_cast<int>(width), eps};
  TE_ASYNC_RETURN_IF_ERROR((LaunchProduct<kInputColumns, kMlaTokenMaxHidden, kParts>(
      input, stream, false, "launch of the input projections' ProductKernel")));

  const PrepArgs prep{res(projected), in(kv_norm), in(w_kv), cos.typed_data(), sin.typed_data(),
                      layer.typed_data(), position.typed_data(), res(ckv_out), res(kpe_out), res(q_latent),
                      res(q_rope), static_cast<int>(batch), static_cast<int>(heads), static_cast<int>(width),
                      static_cast<int>(max_len), static_cast<int>(layers), latent_eps, interleaved};
  TE_ASYNC_RETURN_IF_ERROR(LaunchChained(MlaTokenPrepKernel, dim3(heads * kLatentBlocks + 1, batch), kThreads, prep,
                                         stream, true, "launch of MlaTokenPrepKernel"));

  decode_attention_kernels::Args attend{
      res(q_latent), res(q_rope), res(ckv_out), res(kpe_out), res(ckv_out), layer.typed_data(),
      position.typed_data(), static_cast<int>(batch), 1, static_cast<int>(heads), 1, static_cast<int>(max_len),
      static_cast<int>(layers), static_cast<int>(window),
      decode_attention_kernels::SplitChunk<kSplitWarps>(max_len, splits),
      scale * decode_attention_kernels::kLog2e, partial->typed_data(), nullptr};
  TE_ASYNC_RETURN_IF_ERROR((decode_attention_kernels::LaunchSplits<0, kSplitWarps>(stream, attend,
                                                                                   static_cast<int>(splits), true)));

  const OutArgs merge{partial->typed_data(), in(w_kv), attention->typed_data(), static_cast<int>(heads),
                      static_cast<int>(splits)};
  TE_ASYNC_RETURN_IF_ERROR(LaunchChained(MlaTokenOutKernel, dim3(heads * kParts, batch), kOutThreads, merge, stream,
                                         true, "launch of MlaTokenOutKernel"));
  const ProductArgs output{nullptr, attention->typed_data(), nullptr, in(wo), in(x), res(out), static_cast<int>(batch),
                           static_cast<int>(heads * kValue), static_cast<int>(hidden), 0.f};
  return LaunchProduct<kOutputColumns, kMlaTokenMaxHidden, kParts>(output, stream, true,
                                                                   "launch of o_proj's ProductKernel");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kMlaTokenCuda, MlaToken,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // x: the residual stream
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // norm: input_layernorm's weight
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // w_in: q_proj and kv_a_proj_with_mqa side by side
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // kv_norm
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // w_kv
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // wo
                                  .Arg<ffi::Buffer<ffi::F32>>()   // cos
                                  .Arg<ffi::Buffer<ffi::F32>>()   // sin
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // ckv
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // kpe
                                  .Arg<ffi::Buffer<ffi::S32>>()   // layer
                                  .Arg<ffi::Buffer<ffi::S32>>()   // position
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // out: x + o_proj's output
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // ckv, aliased
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // kpe, aliased
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // projected: q and kv_a (workspace)
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // q_latent (workspace)
                                  .Ret<ffi::Buffer<ffi::BF16>>()  // q_rope (workspace)
                                  .Ret<ffi::Buffer<ffi::F32>>()   // partial (workspace)
                                  .Ret<ffi::Buffer<ffi::F32>>()   // attention: the heads' outputs in parts (workspace)
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("window")
                                  .Attr<float>("eps")
                                  .Attr<float>("latent_eps")
                                  .Attr<bool>("interleaved"),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace te_async
