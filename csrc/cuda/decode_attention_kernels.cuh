// The decode attention's kernels: DecodeAttentionKernel, one block per (key split, sequence x kv
// head), and CombineKernel, the merge of the splits (decode_attention.cu's FFI call and header);
// mla_token.cu chains the split kernel behind its own and merges in its output kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "cuda/attention_tile.cuh"
#include "cuda/block_reduce.cuh"
#include "cuda/cuda_check.h"
#include "cuda/decode_attention.h"
#include "cuda/programmatic_launch.cuh"
#include "xla/ffi/api/ffi.h"

namespace te_async {
namespace decode_attention_kernels {
namespace {

namespace ffi = xla::ffi;
using attention_tile::bf16;
using attention_tile::kRows;

// Warps of the merge and, by default, of the split kernel (mla_token.cu launches it with 8).
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
template <int DK, int DR, int DV, bool kValuesAreKeys, int kSplitWarps>
using Layout = attention_tile::Layout<DK + DR, DV, kValuesAreKeys, kSplitWarps>;

constexpr float kLog2e = 1.4426950408889634f;  // Args::scale_log2 = scale * kLog2e

// Keys per split for `splits` splits of max_len keys: whole tiles of 8 keys per warp (4 warps: 32,
// decode_attention.KEY_TILE).
template <int kSplitWarps = kWarps>
int SplitChunk(int64_t max_len, int64_t splits) {
  constexpr int kKeys = 8 * kSplitWarps;
  return static_cast<int>(((max_len + splits - 1) / splits + kKeys - 1) / kKeys * kKeys);
}

struct Args {
  const bf16 *q, *q_rope, *k, *k_rope, *v;  // q [B,T,H,dk], q_rope [B,T,H,dr]; k, k_rope, v [L,B,N,Hkv,d]
  const int *layer, *position;              // device scalars
  int batch, tokens, heads, kv_heads, max_len, layers, window, chunk;
  float scale_log2;  // the softmax scale times log2(e): scores are kept in log2 units
  float* partial;    // [splits, B*Hkv, kRows, dv + 2]: unnormalised output, then max and sum
  bf16* out;         // [B, T, H, dv]
};

template <int DK, int DR, int DV, bool kValuesAreKeys, int kSplitWarps>
__global__ void __launch_bounds__(32 * kSplitWarps) DecodeAttentionKernel(Args a) {
  constexpr int DQ = DK + DR;
  using L = Layout<DK, DR, DV, kValuesAreKeys, kSplitWarps>;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sq = reinterpret_cast<bf16*>(smem + L::kQ);
  const float* s_max = reinterpret_cast<const float*>(smem + L::kStats);
  const float* s_sum = s_max + kRows;
  StartDependents();

  const int bh = blockIdx.y, b = bh / a.kv_heads, kv_head = bh % a.kv_heads;
  const int group = a.heads / a.kv_heads, rows = group * a.tokens;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int layer = *a.layer, position = *a.position;  // the call's inputs: no previous kernel writes them
  float* partial = a.partial + (static_cast<size_t>(blockIdx.x) * gridDim.y + bh) * kRows * (DV + 2);

  // Keys [first, last) that some row can see, within this split's chunk.
  int first = blockIdx.x * a.chunk;
  const int last = min(min(first + a.chunk, a.max_len), position + a.tokens);
  if (a.window > 0) first = max(first, position - a.window + 1);
  if (layer < 0 || layer >= a.layers || position < 0 || first >= last) {
    WaitForPrevious();  // every block ends after the kernel before it, as without the programmatic launch
    if (tid < kRows) partial[tid * (DV + 2) + DV] = -INFINITY, partial[tid * (DV + 2) + DV + 1] = 0.f;
    return;
  }
  // The keys before the new tokens' are in the cache already: the first tile's start copying while
  // the previous kernel (mla_token.cu's prep, which writes the new row) runs.
  const attention_tile::KeyRows keys{a.k, a.k_rope, a.v,
                                     (static_cast<size_t>(layer) * a.batch + b) * a.max_len * a.kv_heads + kv_head,
                                     static_cast<size_t>(a.kv_heads)};
  const int loaded = max(first, min(last, position));
  attention_tile::PrefetchFirstTile<DK, DR, DV, kValuesAreKeys, kSplitWarps>(keys, first, loaded, smem);
  WaitForPrevious();  // q (mla_token.cu: and the new cache row) written by the previous kernel

  // Row r: token r / group, head kv_head * group + r % group; rows from `rows` on are zeros.
  for (int c = tid; c < kRows * (DQ / 8); c += L::kThreads) {
    const int r = c / (DQ / 8), d = c % (DQ / 8) * 8;
    const size_t row = (static_cast<size_t>(b) * a.tokens + r / group) * a.heads + kv_head * group + r % group;
    const bf16* src = r >= rows ? a.q : d < DK ? a.q + row * DK + d : a.q_rope + row * DR + d - DK;
    attention_tile::CopyAsync16(sq + r * L::kQStride + d, src, r < rows);
  }
  float o[L::kValueTiles][4];
  attention_tile::AttendChunk<DK, DR, DV, kValuesAreKeys, kSplitWarps>(keys, first, last, loaded,
                                                                   {rows, group, position, a.window}, a.scale_log2,
                                                                   smem, o);
  // The block's partial output is one contiguous run of kRows (DV + 2) floats: staged in shared memory
  // (the tiles and query rows, which AttendChunk no longer reads), then written in 16-byte stores. The
  // MMA fragments' scattered 4-byte stores took about 5 of a block's 9 us after its wait at one
  // sequence (H100, docs/results/2026-12-07-h100-mla-split); this way the kernel ends 3.1 us sooner
  // (docs/results/2026-12-07-h100-mla-split-stores).
  constexpr int kPartialFloats = kRows * (DV + 2);
  static_assert(kPartialFloats * sizeof(float) <= L::kStats && kPartialFloats % 4 == 0,
                "the staged partial fits below the stats, in whole 16-byte vectors");
  float* staged = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int j = 0; j < L::kValueTiles; ++j) {  // (DV + 2) and col are even: 8-byte aligned pairs
    const int col = warp * (DV / kSplitWarps) + j * 8 + 2 * t4;
    *reinterpret_cast<float2*>(staged + g * (DV + 2) + col) = make_float2(o[j][0], o[j][1]);
    *reinterpret_cast<float2*>(staged + (g + 8) * (DV + 2) + col) = make_float2(o[j][2], o[j][3]);
  }
  if (tid < kRows) staged[tid * (DV + 2) + DV] = s_max[tid], staged[tid * (DV + 2) + DV + 1] = s_sum[tid];
  __syncthreads();
  const float4* from = reinterpret_cast<const float4*>(staged);
  float4* to = reinterpret_cast<float4*>(partial);  // 16-byte aligned: a block's run is 64 (DV + 2) bytes
  for (int i = tid; i < kPartialFloats / 4; i += L::kThreads) to[i] = from[i];
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
  StartDependents();  // gqa_token.cu's o_proj may start loading its weights
  WaitForPrevious();  // the splits' outputs (returns at once where the launch has no dependency)
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
  m = BlockReduce<kWarps>(m, scratch, [](float x, float y) { return fmaxf(x, y); });
  float total = 0.f;
  for (int s = threadIdx.x; s < splits; s += kThreads) {
    const float ms = row[s * split_stride + DV];
    weight[s] = ms == -INFINITY ? 0.f : exp2f(ms - m);
    total += weight[s] * row[s * split_stride + DV + 1];
  }
  total = BlockReduce<kWarps>(total, scratch, [](float x, float y) { return x + y; });  // also publishes `weight`
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

// Instantiated shape I: its split kernel of kSplitWarps warps and that kernel's shared memory.
template <int I, int kSplitWarps = kWarps>
struct Shape {
  static constexpr DecodeAttentionShape s = kDecodeAttentionShapes[I];
  static constexpr size_t kBytes =
      Layout<s.key_dims, s.rope_dims, s.value_dims, s.values_are_keys, kSplitWarps>::kBytes;
  static constexpr auto kKernel =
      DecodeAttentionKernel<s.key_dims, s.rope_dims, s.value_dims, s.values_are_keys, kSplitWarps>;
};

// The split kernel of shape I, allowed its shared memory (before a launch or an occupancy query).
template <int I, int kSplitWarps = kWarps>
cudaError_t AllowSharedMemory() {
  using S = Shape<I, kSplitWarps>;
  return cudaFuncSetAttribute(S::kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(S::kBytes));
}

// The split kernel of shape I over `splits` key chunks (a.chunk from SplitChunk<kSplitWarps>);
// after_previous: a programmatic dependent of the stream's previous kernel (it waits for it before
// it reads the query; mla_token.cu).
template <int I, int kSplitWarps = kWarps>
ffi::Error LaunchSplits(cudaStream_t stream, const Args& a, int splits, bool after_previous) {
  using S = Shape<I, kSplitWarps>;
  TE_ASYNC_CUDA((AllowSharedMemory<I, kSplitWarps>()));
  return CudaStatus(LaunchDependent(S::kKernel, dim3(splits, a.batch * a.kv_heads), dim3(32 * kSplitWarps), S::kBytes,
                                    stream, after_previous, a),
                    "launch of the decode attention's split kernel");
}

// The merge of shape I's splits, behind the split kernel in the stream; after_previous: a
// programmatic dependent of it, launched while the splits run (the split kernel lets dependents start
// at once), which waits for them before it reads their outputs (gqa_token.cu).
template <int I>
ffi::Error LaunchMerge(cudaStream_t stream, const Args& a, int splits, bool after_previous) {
  constexpr int kValueDims = Shape<I>::s.value_dims;
  const dim3 grid(a.batch * a.kv_heads, kRows, kValueDims / kMergeColumns);
  return CudaStatus(
      LaunchDependent(CombineKernel<kValueDims>, grid, dim3(kThreads), 0, stream, after_previous, a, splits),
      "launch of the decode attention's CombineKernel");
}

}  // namespace
}  // namespace decode_attention_kernels
}  // namespace te_async
