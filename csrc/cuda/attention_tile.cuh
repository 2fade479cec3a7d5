// Flash decoding over one chunk of a cache's keys on the tensor cores, shared by the split kernel of
// decode_attention.cu and the fused MLA kernel of mla_decode.cu.
//
// A block holds up to 16 query rows (one MMA tile) in shared memory and walks its chunk of keys in
// tiles of 8 keys per warp that cp.async brings into shared memory while the previous tile is
// computed. Scores and P.V run on mma.sync m16n8k16 (bf16 in, f32 accumulate) with an online
// softmax in f32, kept in log2 units. MLA: the keys are the latent followed by the rope key, and the
// values are the latent itself, taken from the same shared-memory tile.
#pragma once

#include <cuda_bf16.h>

#include <climits>
#include <cmath>
#include <cstddef>
#include <type_traits>

#include "cuda/block_reduce.cuh"
#include "cuda/decode_attention.h"

namespace te_async {
namespace attention_tile {

using bf16 = __nv_bfloat16;

constexpr int kRows = kDecodeAttentionMaxRows;  // query rows per block: the MMA's M
constexpr int kPad = 8;  // bf16 per shared row: rows land 16 B apart mod 128, so fragment loads are conflict-free

__device__ __forceinline__ unsigned SharedAddress(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without the registers; valid == false writes zeros and reads nothing.
__device__ __forceinline__ void CopyAsync16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void CommitCopies() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void WaitCopies() { asm volatile("cp.async.wait_group 0;\n" ::); }

// Four 8x8 bf16 matrices from shared memory; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void LoadMatrices(unsigned (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(p)));
}

__device__ __forceinline__ void LoadMatricesTransposed(unsigned (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(p)));
}

// c[16x8] += a[16x16] b[16x8], bf16 in, f32 accumulate.
__device__ __forceinline__ void Mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Shared memory of one block's attention, in bytes from its start; DQ = dk + dr score dims, DV value
// dims, kWarps warps of 8 keys each per tile.
template <int DQ, int DV, bool kValuesAreKeys, int kWarps>
struct Layout {
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kKeys = 8 * kWarps;          // keys per tile
  static constexpr int kValueTiles = DV / kWarps / 8;  // n-tiles of 8 value columns per warp
  static constexpr int kQStride = DQ + kPad;  // Q rows and key rows (latent then rope key)
  static constexpr int kVStride = kValuesAreKeys ? kQStride : DV + kPad;
  static constexpr int kPStride = kKeys + kPad;
  static constexpr int kKTile = kKeys * kQStride;  // bf16 per key tile
  static constexpr int kVTile = kValuesAreKeys ? kKTile : kKeys * kVStride;
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + static_cast<size_t>(kRows) * kQStride * 2;
  static constexpr size_t kV = kK + 2 * static_cast<size_t>(kKTile) * 2;  // unused when the values are the keys
  static constexpr size_t kS = kV + (kValuesAreKeys ? 0 : 2 * static_cast<size_t>(kVTile) * 2);
  static constexpr size_t kP = kS + static_cast<size_t>(kRows) * kKeys * 4;
  static constexpr size_t kStats = kP + static_cast<size_t>(kRows) * kPStride * 2;  // max, sum, rescale per row
  static constexpr size_t kBytes = kStats + 3 * kRows * 4;
  static_assert(DQ % 32 == 0 && kValueTiles % 2 == 0 && kThreads % kRows == 0, "score dims in steps of 32, "
                "value columns in pairs of n-tiles per warp");
};

// Where the keys lie: key n's row is row0 + n * stride of k (DK dims), k_rope (DR) and v (DV).
struct KeyRows {
  const bf16 *k, *k_rope, *v;
  size_t row0, stride;
};

// Copies this thread's 16-byte chunks of the kKeys rows of a tile from key `start` on, of kDims dims,
// from `array` (key n's row at (row0 + n stride) kDims) to `to` (kToStride bf16 per row): chunk
// tid % (kDims / 8) of rows tid / (kDims / 8) + i kThreads / (kDims / 8), so that each copy's shared
// address is the thread's first plus a constant and its global one the thread's first plus i times
// one stride: about 6 instructions a copy. (Copying chunk tid + i kThreads of a whole key row took
// about 35, more than half of a tile's instructions; docs/internals.md, table AL.) Keys n in
// [r.from, r.to) are copied, keys n >= r.fill zero-filled, the others left as they are (another
// call copies them). kFull: the tile's keys all lie in [r.from, r.to), so only a chunk's first and
// last tiles test them.
struct TileRange {
  int from, to, fill;
};
template <int kDims, int kToStride, int kKeys, int kThreads, bool kFull>
__device__ __forceinline__ void CopyRows(const bf16* array, size_t row0, size_t stride, int start, TileRange r,
                                         bf16* to) {
  constexpr int kChunks = kDims / 8, kRowsPerPass = kThreads / kChunks, kCopies = kKeys / kRowsPerPass;
  static_assert(kThreads % kChunks == 0 && kKeys % kRowsPerPass == 0, "whole rows per pass, whole passes per tile");
  const int key = threadIdx.x / kChunks, d = threadIdx.x % kChunks * 8;
  const bf16* from = array + (row0 + static_cast<size_t>(start + key) * stride) * kDims + d;
  const size_t step = kRowsPerPass * stride * kDims;
  to += key * kToStride + d;
#pragma unroll
  for (int i = 0; i < kCopies; ++i) {
    const int n = start + key + i * kRowsPerPass;
    const bool copy = kFull || (n >= r.from && n < r.to);
    if (copy || n >= r.fill) CopyAsync16(to + i * kRowsPerPass * kToStride, copy ? from + i * step : array, copy);
  }
}

// Starts the copies of the tile of keys from `start` on into shared buffer `buffer` (of two) at
// Layout::kK (and kV), keys as CopyRows's TileRange says, and commits them as one group.
template <int DK, int DR, int DV, bool kValuesAreKeys, int kWarps>
__device__ __forceinline__ void LoadTile(const KeyRows& src, int start, TileRange r, int buffer, unsigned char* smem) {
  using L = Layout<DK + DR, DV, kValuesAreKeys, kWarps>;
  constexpr int kKeys = L::kKeys, kThreads = L::kThreads;
  auto copy = [&](auto full) {
    constexpr bool kFull = decltype(full)::value;
    bf16* keys = reinterpret_cast<bf16*>(smem + L::kK) + buffer * L::kKTile;
    CopyRows<DK, L::kQStride, kKeys, kThreads, kFull>(src.k, src.row0, src.stride, start, r, keys);
    if constexpr (DR > 0) {
      CopyRows<DR, L::kQStride, kKeys, kThreads, kFull>(src.k_rope, src.row0, src.stride, start, r, keys + DK);
    }
    if constexpr (!kValuesAreKeys) {
      CopyRows<DV, L::kVStride, kKeys, kThreads, kFull>(src.v, src.row0, src.stride, start, r,
                                                        reinterpret_cast<bf16*>(smem + L::kV) + buffer * L::kVTile);
    }
  };
  if (r.from <= start && start + kKeys <= r.to) copy(std::true_type{}); else copy(std::false_type{});
  CommitCopies();
}

// Keys [first, to) of the first tile of a chunk from `first` on, copied ahead: a dependent kernel
// starts them before it waits for the previous kernel, which writes only the keys from `to` on
// (mla_token.cu's prep writes the new token's row). AttendChunk(..., loaded = to) copies the rest.
template <int DK, int DR, int DV, bool kValuesAreKeys, int kWarps>
__device__ __forceinline__ void PrefetchFirstTile(const KeyRows& src, int first, int to, unsigned char* smem) {
  LoadTile<DK, DR, DV, kValuesAreKeys, kWarps>(src, first, {first, to, INT_MAX}, 0, smem);
}

// Which keys a query row sees: row r < rows is a query at position + r / group, which sees keys
// n <= that position (and n > it - window, for window > 0).
struct Visibility {
  int rows, group, position, window;
};

// Attends the query rows at Layout::kQ (copies into it may still be in flight, uncommitted or not)
// to keys [first, last): o gets the unnormalised output (warp w owns value columns [w DV / kWarps,
// (w + 1) DV / kWarps); o[j][e] is row g (+8 for e >= 2), column 8 j + 2 t4 (+1 for odd e) of them,
// g = lane / 4, t4 = lane % 4), and the floats at Layout::kStats each row's running max (log2
// units, -inf where no key was seen) and sum. first >= last leaves o zero and the max -inf. Keys
// [first, loaded) of the first tile are already being copied (PrefetchFirstTile; loaded = first:
// none).
template <int DK, int DR, int DV, bool kValuesAreKeys, int kWarps>
__device__ __forceinline__ void AttendChunk(const KeyRows& src, int first, int last, int loaded, const Visibility& vis,
                                            float scale_log2, unsigned char* smem,
                                            float (&o)[Layout<DK + DR, DV, kValuesAreKeys, kWarps>::kValueTiles][4]) {
  constexpr int DQ = DK + DR;
  using L = Layout<DQ, DV, kValuesAreKeys, kWarps>;
  constexpr int kKeys = L::kKeys, kThreads = L::kThreads, kRowThreads = kThreads / kRows;
  static_assert(kKeys / kRowThreads == 4, "4 keys per thread in the softmax");
  const bf16* sq = reinterpret_cast<const bf16*>(smem + L::kQ);
  bf16* sk = reinterpret_cast<bf16*>(smem + L::kK);
  bf16* sv = kValuesAreKeys ? sk : reinterpret_cast<bf16*>(smem + L::kV);
  float* ss = reinterpret_cast<float*>(smem + L::kS);
  bf16* sp = reinterpret_cast<bf16*>(smem + L::kP);
  float* s_max = reinterpret_cast<float*>(smem + L::kStats);
  float* s_sum = s_max + kRows;
  float* s_rescale = s_sum + kRows;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;

  const auto load_tile = [&](int start, TileRange r, int buffer) {
    LoadTile<DK, DR, DV, kValuesAreKeys, kWarps>(src, start, r, buffer, smem);
  };
  if (loaded < first + kKeys) {
    if (first < last) load_tile(first, {loaded, last, last}, 0);
  } else {
    CommitCopies();  // the first tile is all in flight; commit the caller's copies (the query rows)
  }
  if (tid < kRows) s_max[tid] = -INFINITY, s_sum[tid] = 0.f;
#pragma unroll
  for (int j = 0; j < L::kValueTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;

  const int tiles = first < last ? (last - first + kKeys - 1) / kKeys : 0;
  for (int i = 0; i < tiles; ++i) {
    WaitCopies();
    __syncthreads();  // tile i is in shared memory, and every warp is done with tile i - 1's buffer
    if (i + 1 < tiles) load_tile(first + (i + 1) * kKeys, {first, last, last}, (i + 1) & 1);
    const bf16* kt = sk + (i & 1) * L::kKTile;
    const bf16* vt = sv + (i & 1) * L::kVTile;
    const int start = first + i * kKeys;

    // Scores: warp w takes keys 8w .. 8w + 7 of the tile, two k-steps of 16 per round, into four
    // accumulators so that the MMAs' dependent chain is a quarter of the score dims.
    float s[4][4] = {};
#pragma unroll
    for (int d0 = 0; d0 < DQ; d0 += 32) {
      unsigned qa[4], qb[4], kb[4];
      LoadMatrices(qa, sq + (lane % 16) * L::kQStride + d0 + lane / 16 * 8);
      LoadMatrices(qb, sq + (lane % 16) * L::kQStride + d0 + 16 + lane / 16 * 8);
      LoadMatrices(kb, kt + (8 * warp + lane % 8) * L::kQStride + d0 + lane / 8 * 8);
      const int acc = d0 / 32 % 2 * 2;
      Mma(s[acc], qa, kb[0], kb[1]);
      Mma(s[acc + 1], qb, kb[2], kb[3]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {  // s[.][e]: row g (+8 for e >= 2), key 8w + 2 t4 (+1 for odd e)
      const int r = g + e / 2 * 8, key = 8 * warp + 2 * t4 + e % 2, n = start + key, seen = vis.position + r / vis.group;
      const bool visible = r < vis.rows && n < last && n <= seen && (vis.window <= 0 || n > seen - vis.window);
      const float score = (s[0][e] + s[1][e]) + (s[2][e] + s[3][e]);
      ss[r * kKeys + key] = visible ? score * scale_log2 : -INFINITY;
    }
    __syncthreads();

    {  // Online softmax: kRowThreads threads per row, 4 keys each. The sum adds the rounded P that P.V uses.
      const int r = tid / kRowThreads, part = tid % kRowThreads;
      float v[4], tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = ss[r * kKeys + part * 4 + j], tile_max = fmaxf(tile_max, v[j]);
      tile_max = LaneGroupReduce(tile_max, kRowThreads, [](float x, float y) { return fmaxf(x, y); });
      const float old_max = s_max[r], new_max = fmaxf(old_max, tile_max);
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const bf16 p = __float2bfloat16(new_max == -INFINITY ? 0.f : exp2f(v[j] - new_max));
        sp[r * L::kPStride + part * 4 + j] = p;
        sum += __bfloat162float(p);
      }
      sum = LaneGroupReduce(sum, kRowThreads, [](float x, float y) { return x + y; });
      if (part == 0) {
        const float rescale = new_max == -INFINITY ? 1.f : exp2f(old_max - new_max);
        s_rescale[r] = rescale, s_sum[r] = s_sum[r] * rescale + sum, s_max[r] = new_max;
      }
    }
    __syncthreads();

    // P.V: warp w owns value columns [w DV / kWarps, (w + 1) DV / kWarps).
    const float rescale_lo = s_rescale[g], rescale_hi = s_rescale[g + 8];
#pragma unroll
    for (int j = 0; j < L::kValueTiles; ++j) o[j][0] *= rescale_lo, o[j][1] *= rescale_lo, o[j][2] *= rescale_hi, o[j][3] *= rescale_hi;
#pragma unroll
    for (int k0 = 0; k0 < kKeys; k0 += 16) {
      unsigned pa[4];
      LoadMatrices(pa, sp + (lane % 16) * L::kPStride + k0 + lane / 16 * 8);
#pragma unroll
      for (int j = 0; j < L::kValueTiles; j += 2) {
        unsigned vb[4];
        const int n0 = warp * (DV / kWarps) + j * 8;
        LoadMatricesTransposed(vb, vt + (k0 + (lane / 8 % 2) * 8 + lane % 8) * L::kVStride + n0 + lane / 16 * 8);
        Mma(o[j], pa, vb[0], vb[1]);
        Mma(o[j + 1], pa, vb[2], vb[3]);
      }
    }
  }
  __syncthreads();  // the stats are final, and no warp still reads the tiles
}

}  // namespace attention_tile
}  // namespace te_async
