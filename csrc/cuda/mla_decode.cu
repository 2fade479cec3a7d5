// DeepSeek's multi-head latent attention at decode, absorbed, in one kernel.
//
// Decode never expands MLA's compressed cache: kv_b_proj's key half is absorbed into the query
// (q_latent = q_nope W_uk, per head) and its value half into the output (out = (P c) W_uv), so that
// a step reads the cache of latents c (and rope keys) once. Done by XLA that is about 17 small
// kernels per layer at one token (the absorbed query, a copy of the scanned layer's cache, scores,
// softmax, P.V, the output), each paying a launch and a DRAM round trip for a few MB; te_async's
// split kernel (decode_attention.cu) still needs the two einsums and a merge kernel around it.
//
// Here S thread-block clusters of C blocks (C = 16 or 8, S from 1 to 8: the plan below) take one
// (sequence, new token, group of 16 heads), cluster s the s-th of S shares of its keys:
//   1. block j computes q_latent for latent dims [j 512 / C, (j + 1) 512 / C) of the 16 heads from
//      its slice of W_uk (staged in shared memory), so that W_uk is read once per cluster;
//   2. every block gathers the whole q_latent (and q_pe) through distributed shared memory, then
//      attends to its 1/C of the cluster's keys (attention_tile.cuh's AttendChunk, 64-key tiles);
//   3. block j merges the C partial outputs of its 16 / C heads in rank order (deterministic);
//   4. with one cluster (S = 1) it rounds the latent output to bf16, as the unfused path does, and
//      multiplies it by its heads' W_uv, staged while the cluster merged; with S > 1 it writes the
//      merged partial output to `partial`, and MlaCombineKernel merges the S of each head in order,
//      rounds and projects them. At one sequence the splits took DeepSeek-V2-Lite's 4096 keys from
//      33 to 29 us on an H200 (one cluster against 7): the fixed work before and after the keys
//      (W_uk's staging, the merge) dominates, see docs/internals.md table A3.
// At the start every block asks the L2 for what it reads later (its chunk of the cache, its rows of
// kv_b_proj) with bulk prefetches, so that each phase's loads find their bytes on chip instead of
// paying one DRAM latency after another. A query that sees no key (a negative position, a bad layer
// index) gets NaN, as decode_attention does.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "cuda/attention_tile.cuh"
#include "cuda/cluster_launch.h"
#include "cuda/cuda_check.h"
#include "cuda/handlers.h"
#include "cuda/mla_decode.h"
#include "cuda/poison.h"

namespace te_async {
namespace {

namespace ffi = xla::ffi;
namespace cg = cooperative_groups;
using attention_tile::bf16;

constexpr int kNope = kMlaDecodeDims.nope, kRope = kMlaDecodeDims.rope;
constexpr int kLatent = kMlaDecodeDims.latent, kValue = kMlaDecodeDims.value;
constexpr int kKvRow = kNope + kValue;          // kv_b_proj's elements per (latent dim, head)
constexpr int kHeads = attention_tile::kRows;  // heads per cluster: the MMA's M
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxCluster = 16, kMinCluster = 8, kMaxSplits = kMlaDecodeMaxSplits;
constexpr int kMaxSlice = kLatent / kMinCluster;         // latent dims per block
constexpr int kMaxBlockHeads = kHeads / kMinCluster;     // heads a block merges and projects
using Tile = attention_tile::Layout<kLatent + kRope, kLatent, true, kWarps>;  // scores over the latent and rope key

// Shared memory. The attention's layout (Tile) is reused before it (W_uk's staging) and after it
// (W_uv's staging, the partial outputs the cluster merges); its stats stay where the other blocks
// read them. Behind it: this block's q_latent slice, its heads' merged latent and the projection's sums.
constexpr int kPassRows = 32;             // latent dims of W_uk staged at once
constexpr int kWRow = kNope + 8;          // bf16 per staged (latent dim, head) row: 272 B, conflict-free
constexpr size_t kWukBytes = static_cast<size_t>(kPassRows) * kHeads * kWRow * 2;
constexpr size_t kWuvBytes = static_cast<size_t>(kLatent) * kValue * 2;
constexpr size_t kOutOffset = kWuvBytes;  // [16][512] f32 partial outputs
constexpr size_t kQlOffset = Tile::kBytes;
constexpr size_t kLatOffset = kQlOffset + static_cast<size_t>(kHeads) * kMaxSlice * 2;
constexpr size_t kSumOffset = kLatOffset + static_cast<size_t>(kMaxBlockHeads) * kLatent * 4;
constexpr size_t kSmemBytes = kSumOffset + static_cast<size_t>(kThreads / (kValue / 8)) * kValue * 4;
static_assert(kWukBytes <= Tile::kStats && kOutOffset + static_cast<size_t>(kHeads) * kLatent * 4 <= Tile::kStats,
              "the staging areas must leave the attention's stats alone");
static_assert(kQlOffset % 16 == 0 && kSmemBytes <= 227 * 1024, "shared memory");

struct MlaArgs {
  const bf16 *q_nope, *q_pe;  // [B, T, H, 128], [B, T, H, 64]
  const bf16* w_kv;           // kv_b_proj [512, H, 128 + 128]: W_uk, then W_uv, per (latent dim, head)
  const bf16 *ckv, *kpe;      // the stacked cache [L, B, N, 512], [L, B, N, 64]
  const int *layer, *position;
  int batch, tokens, heads, max_len, layers, window, splits;
  float scale_log2;  // the softmax scale times log2(e)
  float* partial;    // [splits, B*T*H, 512 + 2]: merged unnormalised latent output, max and sum (S > 1)
  bf16* out;         // [B, T, H, 128]
};
constexpr int kPartialRow = kLatent + 2;

__device__ __forceinline__ void PrefetchL2(const void* p, unsigned bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}

// acc + sum of x[i] y[i] over 8 bf16 pairs.
__device__ __forceinline__ float Dot8(const uint4& x, const uint4& y, float acc) {
  const __nv_bfloat162* a = reinterpret_cast<const __nv_bfloat162*>(&x);
  const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&y);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = __bfloat1622float2(a[i]), fb = __bfloat1622float2(b[i]);
    acc = fmaf(fa.x, fb.x, acc);
    acc = fmaf(fa.y, fb.y, acc);
  }
  return acc;
}

__global__ void __launch_bounds__(kThreads, 1) MlaDecodeKernel(MlaArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char smem[];
  cg::cluster_group cluster = cg::this_cluster();
  const int blocks = static_cast<int>(cluster.num_blocks()), rank = static_cast<int>(cluster.block_rank());
  const int slice = kLatent / blocks, block_heads = kHeads / blocks;
  const int groups = (a.heads + kHeads - 1) / kHeads, split = blockIdx.x / blocks % a.splits;
  const int id = blockIdx.x / blocks / a.splits;
  const int head0 = id % groups * kHeads, rows = min(kHeads, a.heads - head0);
  const int b = id / groups / a.tokens, t = id / groups % a.tokens;
  const int tid = threadIdx.x;
  const size_t bth = (static_cast<size_t>(b) * a.tokens + t) * a.heads + head0;  // row of head0 of this token
  const size_t latent_stride = static_cast<size_t>(a.heads) * kKvRow;        // w_kv per latent dim

  // The keys this token sees, [lo, hi), and this block's chunk of them, [first, last): chunk
  // split * C + rank of S * C, in steps of 16 keys.
  const int layer = *a.layer, position = *a.position + t;
  const bool valid = layer >= 0 && layer < a.layers && *a.position >= 0;
  const int hi = valid ? min(a.max_len, position + 1) : 0;
  const int lo = a.window > 0 ? max(0, position - a.window + 1) : 0;
  const int shares = blocks * a.splits;
  const int chunk = hi > lo ? ((hi - lo + shares - 1) / shares + 15) / 16 * 16 : 0;
  const int first = min(lo + (split * blocks + rank) * chunk, hi), last = min(first + chunk, hi);
  const size_t key_row0 = (static_cast<size_t>(valid ? layer : 0) * a.batch + b) * a.max_len;

  // Everything this block reads from phase 2 on, into the L2 now: its latent rows of kv_b_proj for the
  // group's heads (W_uk for phase 1 and, across the cluster, all of W_uv), and its chunk of the cache.
  for (int i = tid; i < slice; i += kThreads) {
    PrefetchL2(a.w_kv + (static_cast<size_t>(rank) * slice + i) * latent_stride + head0 * kKvRow, rows * kKvRow * 2);
  }
  if (tid == 0 && first < last) {
    PrefetchL2(a.ckv + (key_row0 + first) * kLatent, (last - first) * kLatent * 2);
    PrefetchL2(a.kpe + (key_row0 + first) * kRope, (last - first) * kRope * 2);
  }

  // 1. q_latent[h, r] = q_nope[h] . W_uk[r, h] for this block's latent dims: thread (h, r0) holds q_nope[h]
  // and takes dims r0, r0 + 16 of each staged pass, rounded to bf16 like the unfused path's einsum.
  const int h = tid % kHeads, r0 = tid / kHeads;
  uint4 q[kNope / 8];
  {
    const uint4* src = reinterpret_cast<const uint4*>(a.q_nope + (bth + h) * kNope);
#pragma unroll
    for (int i = 0; i < kNope / 8; ++i) q[i] = h < rows ? src[i] : make_uint4(0, 0, 0, 0);
  }
  bf16* staged = reinterpret_cast<bf16*>(smem);
  bf16* q_latent = reinterpret_cast<bf16*>(smem + kQlOffset);  // [16][kMaxSlice]: this block's dims
  for (int pass = 0; pass < slice; pass += kPassRows) {
    for (int c = tid; c < kPassRows * kHeads * (kNope / 8); c += kThreads) {
      const int r = c / (kHeads * kNope / 8), hh = c / (kNope / 8) % kHeads, d = c % (kNope / 8) * 8;
      const bf16* src = a.w_kv + (static_cast<size_t>(rank) * slice + pass + r) * latent_stride + (head0 + hh) * kKvRow + d;
      attention_tile::CopyAsync16(staged + (r * kHeads + hh) * kWRow + d, hh < rows ? src : a.w_kv, hh < rows);
    }
    attention_tile::CommitCopies();
    attention_tile::WaitCopies();
    __syncthreads();
    for (int r = r0; r < kPassRows; r += kThreads / kHeads) {
      const uint4* w = reinterpret_cast<const uint4*>(staged + (r * kHeads + h) * kWRow);
      float even = 0.f, odd = 0.f;
#pragma unroll
      for (int i = 0; i < kNope / 8; i += 2) even = Dot8(w[i], q[i], even), odd = Dot8(w[i + 1], q[i + 1], odd);
      q_latent[h * kMaxSlice + pass + r] = __float2bfloat16(even + odd);
    }
    __syncthreads();  // the next pass overwrites the staged rows
  }
  cluster.sync();  // every block's q_latent slice is in its shared memory

  // 2. The query rows (q_latent from the cluster, q_pe from global memory), then the block's keys.
  bf16* sq = reinterpret_cast<bf16*>(smem + Tile::kQ);
  for (int c = tid; c < kHeads * (kLatent / 8); c += kThreads) {
    const int hh = c / (kLatent / 8), d = c % (kLatent / 8) * 8, owner = d / slice;
    const bf16* remote = cluster.map_shared_rank(q_latent, owner);
    *reinterpret_cast<uint4*>(sq + hh * Tile::kQStride + d) =
        *reinterpret_cast<const uint4*>(remote + hh * kMaxSlice + d - owner * slice);
  }
  for (int c = tid; c < kHeads * (kRope / 8); c += kThreads) {
    const int hh = c / (kRope / 8), d = c % (kRope / 8) * 8;
    attention_tile::CopyAsync16(sq + hh * Tile::kQStride + kLatent + d, hh < rows ? a.q_pe + (bth + hh) * kRope + d : a.q_pe,
                                hh < rows);
  }
  attention_tile::CommitCopies();
  const attention_tile::KeyRows keys{a.ckv, a.kpe, a.ckv, key_row0, 1};
  float o[Tile::kValueTiles][4];
  attention_tile::AttendChunk<kLatent, kRope, kLatent, true, kWarps>(
      keys, first, last, first, {rows, kHeads, position, a.window}, a.scale_log2, smem, o);
  attention_tile::WaitCopies();  // q_pe's copies, where the block had no key to wait for them
  __syncthreads();

  // 3. Stage W_uv of this block's first head while the cluster exchanges the partial outputs.
  bf16* w_uv = reinterpret_cast<bf16*>(smem);  // [512][128]
  auto stage_w_uv = [&](int hh) {
    for (int c = tid; c < kLatent * (kValue / 8); c += kThreads) {
      const int r = c / (kValue / 8), d = c % (kValue / 8) * 8;
      attention_tile::CopyAsync16(w_uv + r * kValue + d, a.w_kv + r * latent_stride + (head0 + hh) * kKvRow + kNope + d, true);
    }
    attention_tile::CommitCopies();
  };
  const int my_head0 = rank * block_heads;
  if (a.splits == 1 && my_head0 < rows) stage_w_uv(my_head0);
  float* partial = reinterpret_cast<float*>(smem + kOutOffset);  // [16][512]
  {
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int j = 0; j < Tile::kValueTiles; ++j) {
      const int col = warp * (kLatent / kWarps) + j * 8 + 2 * t4;
      *reinterpret_cast<float2*>(partial + g * kLatent + col) = make_float2(o[j][0], o[j][1]);
      *reinterpret_cast<float2*>(partial + (g + 8) * kLatent + col) = make_float2(o[j][2], o[j][3]);
    }
  }
  cluster.sync();  // every block's partial output and stats are in its shared memory

  const float* s_max = reinterpret_cast<const float*>(smem + Tile::kStats);
  const float* s_sum = s_max + attention_tile::kRows;
  float* latent = reinterpret_cast<float*>(smem + kLatOffset);  // [kMaxBlockHeads][512]
  for (int k = 0; k < block_heads && my_head0 + k < rows; ++k) {
    const int hh = my_head0 + k;
    float m = -INFINITY, weight[kMaxCluster], total = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxCluster; ++s) {
      if (s < blocks) m = fmaxf(m, cluster.map_shared_rank(s_max, s)[hh]);
    }
#pragma unroll
    for (int s = 0; s < kMaxCluster; ++s) {
      const float ms = s < blocks ? cluster.map_shared_rank(s_max, s)[hh] : -INFINITY;
      weight[s] = ms == -INFINITY ? 0.f : exp2f(ms - m);
      if (s < blocks) total += weight[s] * cluster.map_shared_rank(s_sum, s)[hh];
    }
    const int col = 2 * tid;
    float2 acc = make_float2(0.f, 0.f);
#pragma unroll
    for (int s = 0; s < kMaxCluster; ++s) {
      if (s >= blocks || weight[s] == 0.f) continue;
      const float2 x = *reinterpret_cast<const float2*>(cluster.map_shared_rank(partial, s) + hh * kLatent + col);
      acc.x = fmaf(weight[s], x.x, acc.x), acc.y = fmaf(weight[s], x.y, acc.y);
    }
    if (a.splits > 1) {  // the cluster's share, for MlaCombineKernel
      float* row = a.partial + (static_cast<size_t>(split) * a.batch * a.tokens * a.heads + bth + hh) * kPartialRow;
      *reinterpret_cast<float2*>(row + col) = acc;
      if (tid == 0) row[kLatent] = m, row[kLatent + 1] = total;
      continue;
    }
    // no key seen: 0 / 0
    latent[k * kLatent + col] = __bfloat162float(__float2bfloat16(acc.x / total));
    latent[k * kLatent + col + 1] = __bfloat162float(__float2bfloat16(acc.y / total));
  }
  cluster.sync();  // no block reads another's shared memory from here on
  if (a.splits > 1) return;

  // 4. out[h] = latent[h] . W_uv[:, h]: thread (column block vc, latent rows [32 rg, 32 rg + 32)), the
  // 16 row groups' sums then added in order.
  float* sums = reinterpret_cast<float*>(smem + kSumOffset);  // [16][128]
  const int vc = tid % (kValue / 8), rg = tid / (kValue / 8);
  constexpr int kGroupRows = kLatent / (kThreads / (kValue / 8));
  for (int k = 0; k < block_heads && my_head0 + k < rows; ++k) {
    if (k > 0) {
      __syncthreads();  // the previous head's W_uv and sums are consumed
      stage_w_uv(my_head0 + k);
    }
    attention_tile::WaitCopies();
    __syncthreads();
    float acc[8] = {};
    for (int r = rg * kGroupRows; r < (rg + 1) * kGroupRows; ++r) {
      const float x = latent[k * kLatent + r];
      const uint4 w = *reinterpret_cast<const uint4*>(w_uv + r * kValue + vc * 8);
      const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&w);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(wp[i]);
        acc[2 * i] = fmaf(x, f.x, acc[2 * i]), acc[2 * i + 1] = fmaf(x, f.y, acc[2 * i + 1]);
      }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) sums[rg * kValue + vc * 8 + i] = acc[i];
    __syncthreads();
    if (tid < kValue) {
      float s = 0.f;
      for (int g = 0; g < kThreads / (kValue / 8); ++g) s += sums[g * kValue + tid];
      a.out[(bth + my_head0 + k) * kValue + tid] = __float2bfloat16(s);
    }
  }
#else
  __trap();  // clusters: ClusterBlocks finds none below compute capability 9.0, so this never launches
#endif
}

// With S > 1: out[b, t, h] = round(sum_s 2^(m_s - M) O_s / sum_s 2^(m_s - M) l_s) W_uv[:, h], the S
// shares in order. Block (row b t h, 32 value columns); thread (column, group of 64 latent rows).
constexpr int kCombineColumns = 32;
__global__ void __launch_bounds__(kThreads) MlaCombineKernel(MlaArgs a) {
  __shared__ float latent[kLatent];
  __shared__ float sums[kThreads / kCombineColumns][kCombineColumns];
  const size_t row = blockIdx.x, rows_total = static_cast<size_t>(a.batch) * a.tokens * a.heads;
  const int h = static_cast<int>(row % a.heads), tid = threadIdx.x;
  const float* part = a.partial + row * kPartialRow;
  float m = -INFINITY, total = 0.f, weight[kMaxSplits];
  for (int s = 0; s < a.splits; ++s) m = fmaxf(m, part[s * rows_total * kPartialRow + kLatent]);
  for (int s = 0; s < a.splits; ++s) {
    const float ms = part[s * rows_total * kPartialRow + kLatent];
    weight[s] = ms == -INFINITY ? 0.f : exp2f(ms - m);
    total += weight[s] * part[s * rows_total * kPartialRow + kLatent + 1];
  }
  for (int d = tid; d < kLatent; d += kThreads) {
    float acc = 0.f;
    for (int s = 0; s < a.splits; ++s) {
      if (weight[s] != 0.f) acc = fmaf(weight[s], part[s * rows_total * kPartialRow + d], acc);
    }
    latent[d] = __bfloat162float(__float2bfloat16(acc / total));  // no key seen: 0 / 0
  }
  __syncthreads();
  const int c = tid % kCombineColumns, g = tid / kCombineColumns, col = blockIdx.y * kCombineColumns + c;
  constexpr int kGroupRows = kLatent / (kThreads / kCombineColumns);
  const bf16* w = a.w_kv + static_cast<size_t>(h) * kKvRow + kNope + col;
  float acc = 0.f;
  for (int r = g * kGroupRows; r < (g + 1) * kGroupRows; ++r) {
    acc = fmaf(latent[r], __bfloat162float(w[static_cast<size_t>(r) * a.heads * kKvRow]), acc);
  }
  sums[g][c] = acc;
  __syncthreads();
  if (g == 0) {
    float sum = 0.f;
    for (int i = 0; i < kThreads / kCombineColumns; ++i) sum += sums[i][c];
    a.out[row * kValue + col] = __float2bfloat16(sum);
  }
}

struct MlaPlan {
  int cluster, splits;
};

// Blocks per cluster and clusters per (sequence, token, head group). Where some (C, S) keeps every
// cluster resident in one wave with at least 16 keys a block, the one with the most blocks (C = 16
// first: half of what each block reads); else S = 1 and the size with the fewest waves of clusters,
// each wave weighed by what one block reads (1 / size). S is at most `max_splits`, the partial
// buffer's. `forced_cluster` (8 or 16) and `forced_splits` (from the call's attributes, for tests
// and benchmarks) skip the choice.
ffi::ErrorOr<MlaPlan> Plan(long long clusters, long long max_len, int max_splits, int forced_cluster, int forced_splits) {
  if (auto e = CudaStatus(cudaFuncSetAttribute(MlaDecodeKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(kSmemBytes)),
                          "cudaFuncSetAttribute(MlaDecodeKernel, max dynamic shared memory)");
      e.failure()) {
    return ffi::Unexpected(e);
  }
  if (auto e = CudaStatus(cudaFuncSetAttribute(MlaDecodeKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
                          "cudaFuncSetAttribute(MlaDecodeKernel, non-portable cluster size)");
      e.failure()) {
    return ffi::Unexpected(e);
  }
  MlaPlan one_wave{0, 0}, waves{0, 1};
  double best_cost = 0.0;
  for (int size : {kMaxCluster, kMinCluster}) {
    if (forced_cluster != 0 && size != forced_cluster) continue;
    auto resident = ResidentClusters(MlaDecodeKernel, kThreads, size, kSmemBytes);
    if (resident.has_error()) return ffi::Unexpected(resident.error());
    if (*resident < 1) continue;
    const long long splits = std::min<long long>({max_splits, *resident / clusters, max_len / (16 * size)});
    if (splits >= 1 && splits * size > static_cast<long long>(one_wave.cluster) * one_wave.splits) {
      one_wave = {size, static_cast<int>(splits)};
    }
    const double cost = static_cast<double>((clusters + *resident - 1) / *resident) / size;
    if (waves.cluster == 0 || cost < best_cost - 1e-9) waves.cluster = size, best_cost = cost;
  }
  if (waves.cluster == 0) {
    return ffi::Unexpected(ffi::Error::Internal("te_async mla_decode: no cluster of " +
                                                std::to_string(forced_cluster ? forced_cluster : kMinCluster) +
                                                " blocks fits on this GPU (compute capability 9.0 or later needed)"));
  }
  MlaPlan plan = one_wave.cluster != 0 ? one_wave : waves;
  if (forced_splits != 0) plan.splits = forced_splits;
  return plan;
}

ffi::Error MlaDecode(cudaStream_t stream, ffi::Buffer<ffi::BF16> q_nope, ffi::Buffer<ffi::BF16> q_pe,
                     ffi::Buffer<ffi::BF16> w_kv, ffi::Buffer<ffi::BF16> ckv, ffi::Buffer<ffi::BF16> kpe,
                     ffi::Buffer<ffi::S32> layer, ffi::Buffer<ffi::S32> position, ffi::Result<ffi::Buffer<ffi::BF16>> out,
                     ffi::Result<ffi::Buffer<ffi::F32>> partial, float scale, int64_t window, int64_t cluster,
                     int64_t splits) {
  auto bad = [](const std::string& why) { return ffi::Error::InvalidArgument("te_async mla_decode: " + why); };
  const auto qd = q_nope.dimensions(), pd = q_pe.dimensions(), wd = w_kv.dimensions(), cd = ckv.dimensions();
  const auto kd = kpe.dimensions(), od = out->dimensions(), sd = partial->dimensions();
  if (qd.size() != 4 || pd.size() != 4 || wd.size() != 3 || cd.size() != 4 || kd.size() != 4 || od.size() != 4 ||
      sd.size() != 3 || layer.element_count() != 1 || position.element_count() != 1) {
    return bad("ranks: q_nope, q_pe, out [B,T,H,d]; w_kv [latent, H, nope + value]; ckv, kpe [L,B,N,d]; partial "
               "[max splits, B*T*H, latent + 2]; layer and position scalars");
  }
  const int64_t batch = qd[0], tokens = qd[1], heads = qd[2], layers = cd[0], max_len = cd[2];
  const bool fits = qd[3] == kNope && pd[0] == batch && pd[1] == tokens && pd[2] == heads && pd[3] == kRope &&
                    wd[0] == kLatent && wd[1] == heads && wd[2] == kKvRow && cd[1] == batch && cd[3] == kLatent &&
                    kd[0] == layers && kd[1] == batch && kd[2] == max_len && kd[3] == kRope && od[0] == batch &&
                    od[1] == tokens && od[2] == heads && od[3] == kValue;
  if (!fits) {
    return bad("shapes: q_nope [B,T,H," + std::to_string(kNope) + "], q_pe [B,T,H," + std::to_string(kRope) +
               "], w_kv [" + std::to_string(kLatent) + ",H," + std::to_string(kKvRow) + "], ckv [L,B,N," +
               std::to_string(kLatent) + "], kpe [L,B,N," + std::to_string(kRope) + "], out [B,T,H," +
               std::to_string(kValue) + "]");
  }
  const int64_t clusters = batch * tokens * ((heads + kHeads - 1) / kHeads);
  if (heads < 1 || clusters * kMaxSplits * kMaxCluster > INT32_MAX || max_len > (int64_t{1} << 30) ||
      layers * batch * max_len > (int64_t{1} << 40)) {
    return bad("too large: B * T * ceil(H / 16) head groups of " + std::to_string(kMaxSplits) +
               " clusters of 16 blocks must fit one grid, the cache 2^40 rows");
  }
  const int64_t max_splits = sd[0];
  if (max_splits < 1 || max_splits > kMaxSplits || sd[1] != batch * tokens * heads || sd[2] != kPartialRow) {
    return bad("partial must be [1 to " + std::to_string(kMaxSplits) + ", B*T*H, " + std::to_string(kPartialRow) + "]");
  }
  if (splits < 0 || splits > max_splits) {
    return bad("splits must be 0 (chosen) or at most the partial buffer's " + std::to_string(max_splits) + ", got " +
               std::to_string(splits));
  }
  if (cluster != 0 && cluster != kMinCluster && cluster != kMaxCluster) {
    return bad("cluster must be 0 (chosen), " + std::to_string(kMinCluster) + " or " + std::to_string(kMaxCluster) +
               ", got " + std::to_string(cluster));
  }
  if (window < 0) return bad("window must be 0 (none) or a positive number of keys, got " + std::to_string(window));
  TE_ASYNC_RETURN_IF_ERROR(PoisonOutputBuffers(stream, *out));
  if (out->element_count() == 0) return ffi::Error::Success();
  auto plan = Plan(clusters, max_len, static_cast<int>(max_splits), static_cast<int>(cluster), static_cast<int>(splits));
  if (plan.has_error()) return plan.error();
  const auto in = [](const ffi::Buffer<ffi::BF16>& x) { return static_cast<const bf16*>(x.untyped_data()); };
  const MlaArgs a{in(q_nope), in(q_pe), in(w_kv), in(ckv), in(kpe), layer.typed_data(), position.typed_data(),
                  static_cast<int>(batch), static_cast<int>(tokens), static_cast<int>(heads), static_cast<int>(max_len),
                  static_cast<int>(layers), static_cast<int>(window), plan->splits,
                  scale * 1.4426950408889634f /* log2(e) */, partial->typed_data(), static_cast<bf16*>(out->untyped_data())};
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config =
      ClusterLaunchConfig(clusters * plan->splits * plan->cluster, kThreads, plan->cluster, stream, attr, kSmemBytes);
  if (auto e = CudaStatus(cudaLaunchKernelEx(&config, MlaDecodeKernel, a), "launch of the fused MLA decode kernel");
      e.failure() || plan->splits == 1) {
    return e;
  }
  MlaCombineKernel<<<dim3(static_cast<unsigned>(batch * tokens * heads), kValue / kCombineColumns), kThreads, 0, stream>>>(a);
  return CudaStatus(cudaGetLastError(), "launch of the fused MLA decode's MlaCombineKernel");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kMlaDecodeCuda, MlaDecode,
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
                                  .Attr<int64_t>("cluster")
                                  .Attr<int64_t>("splits"),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace te_async
