// Decode-stage grouped GEMM, ragged m: out[M,N] rows of group e = lhs rows of e @ W[e], with
// rhs [G,K,N] (W[e] = rhs[e], forward) or [G,N,K] (W[e] = rhs[e]^T, dgrad). Chosen for M <= 512
// (tokens x top-k), where nearly every group has 0-2 rows and the time is set by reading the
// active experts' weights. Each active expert's weights are read from HBM once (a group with more
// than kChunkRows rows re-reads them per row chunk, from L2, at about the same time); an inactive
// expert's weights are never touched. f32 accumulation in registers, no atomics, no host
// synchronisation; one launch, no workspace (K split over a thread-block cluster where it pays, below).
//
// Exported rules (host side, LaunchSmallGroups):
//   R (rows per work item)  = kChunkRows = 8, fixed. A group's rows are cut into chunks of up to 8;
//                             each chunk runs a code path compiled for exactly its row count
//                             (1..8), so no FMA is spent on padding rows.
//   grid                    = min(2 * sm_count, blocks that can get an item), 256 threads/block,
//                             persistent: a block (or warp, [G,N,K]) strides over items by the
//                             number of blocks (warps). 2 blocks/SM is what __launch_bounds__
//                             (<=128 registers) and the ~45 KB of static shared memory allow.
//
// Work items (both layouts). Every block computes, in shared memory, the clamped group offsets
// (LoadGroupOffsets) and then chunk offsets: chunk counts ceil(rows_g / 8) for g < G plus one
// pseudo group G = the rows past the clamped total (written as zeros), prefix-summed with the
// same LoadGroupOffsets. With C = total chunks (active groups only: an empty group has none) and
// T = column tiles, item i -> (tile = i / C, chunk c = i % C), chunk c -> group by binary search.
// Consecutive items are the chunks of one column tile, so the row chunks of one group (which share
// weights) run at the same time on neighbouring blocks and meet in L2, and the first wave spreads
// the active experts over all SMs.
//
// [G,K,N] (forward), block item = 128 columns (16-bit; 64 for f32) x one row chunk x all of K:
//   thread t: cx = t % 16 owns the 16-byte column vector n0 + V*cx (256 contiguous bytes per k-row
//   for the 16 threads of a row), ky = t / 16 owns k-rows k = ky (mod 16): K is split over the 16
//   k-slices of the block (8 warps x 2). Per iteration a thread issues U independent 16-byte
//   ld.global.nc.L1::no_allocate loads (U k-rows; U = 8 for <= 4 rows, 4 otherwise: 128 or 64
//   bytes in flight per thread, 64 or 32 KB per SM) and then their FMAs; the loads of an
//   iteration that restages activations are issued before its barrier. No explicit double
//   buffering: with 16 resident warps per SM the other warps' loads cover one warp's FMAs, and
//   the extra buffer pushed the 8-variant kernel past 128 registers into spills. The chunk's
//   activation rows are staged once per 1024 k-rows into shared memory as f32 [k][8] (one or two
//   broadcast LDS.128 per k-row, no per-use conversion). Staging is latency-bound and stalls the
//   whole block at its barriers; with 1-2 rows a thread issues the loads of all its k-rows of a
//   stage before the first store, one L2 round trip instead of four (H200, DeepSeek T=1: 1.6-1.8
//   us less per kernel). Tried and measured slower (their runs: git history of docs/): narrower column pieces
//   for balance, 128 bytes a k-row (8 threads; 2-3 % slower at DeepSeek-V2-Lite's T = 8),
//   double-buffered weight loads, and a 2048-row stage in dynamic shared memory.
//   End: a 1-step shuffle reduce-scatter over the 2 k-slices of a warp, then a shared-memory sum
//   over the 8 warps, then coalesced stores converted to the out dtype.
// [G,N,K] (dgrad), warp item = 4 columns x one row chunk x all of K: lanes read along K (16-byte
//   vectors, 512 contiguous bytes per warp and column; 2 k-vectors per column per iteration for
//   <= 4 rows, 1 otherwise), activation vectors come from L1, and the 32 lanes' partial sums are
//   reduced by a padded shared-memory transpose. Warps take items independently (no barriers).
// Split K ([G,K,N], no row table). Where the items (column tiles x row chunks, at most MaxChunks
//   chunks) are fewer than the SMs, as in a dense GEMM of a few rows (one group: N = 576 gives 9
//   items), the weights would be read by a few SMs only. PlanSmallGroupsSplitK then cuts K into S
//   slices (a multiple of 256 k-rows, S <= kMaxSlices) so that about 2 blocks run per SM, and the
//   kernel is launched in thread-block clusters of S blocks (Hopper, compute capability 9.0 and
//   up; elsewhere S = 1): the blocks of a cluster take the S slices of the same item, leave their
//   f32 sums in shared memory, and each block then adds a share of the outputs over the S blocks'
//   shared memory (distributed shared memory), in slice order: deterministic, no atomics, no
//   workspace, no second kernel. Clusters stride over the items together, so their barriers meet.
// Dense calls (group_sizes == nullptr, dense_gemm.cc): one group of all rows, with no load of the
//   sizes before the weights' first loads.
// Scalar paths (K or N not a multiple of the 16-byte vector, or misaligned pointers) use the same
// mapping with element loads and bounds checks; they exist for correctness, not speed.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cooperative_groups.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/cluster_launch.h"
#include "cuda/cuda_check.h"
#include "cuda/device_gemm.h"
#include "cuda/float_convert.cuh"
#include "cuda/vector_loads.cuh"
#include "cuda/group_layout.cuh"
#include "grouped_gemm_args.h"

namespace te_async {
namespace {

namespace ffi = xla::ffi;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunkRows = 8;          // R
constexpr int kStageK = 1024;          // k-rows of activations staged per pass ([G,K,N] kernel)
constexpr int kBlocksPerSm = 2;
constexpr int kMaxG = static_cast<int>(kMaxGroups);
constexpr int kNkCols = 4;             // output columns per warp item ([G,N,K] kernel)
constexpr int kNkLd = 33;              // padded row of the per-warp transpose buffer
// [G,K,N] kernel: threads that read one k-row of a column tile, 16 bytes each: 256 contiguous bytes a
// k-row (on an H100 128-byte pieces read at 97-98 % of the rate of 256-byte ones, 64-byte pieces at
// 72 %: docs/internals.md, under table F).
constexpr int kKnCx = 16;
constexpr int kKnRowsPerLoad = kThreads / kKnCx;  // k-rows of a block's load; a thread's rows are this far apart
static_assert(kKnCx == 16, "KnItem's reduction sums the 2 k-slices of a warp (lanes 16 apart)");
constexpr int kSplitKGranule = 256;    // a K slice is a multiple of every kStep (kKnRowsPerLoad * U k-rows)
constexpr int kMaxSlices = kPortableClusterSize;  // K slices of an item
constexpr int kFusedMaxRows = static_cast<int>(kSmallGroupsFusedMaxRows);

// ---- element helpers -----------------------------------------------------------------------

// One element of a T array, as raw bits (read-only path).
template <typename T>
__device__ __forceinline__ unsigned int LoadRaw(const T* p) {
  if constexpr (sizeof(T) == 2) {
    return __ldg(reinterpret_cast<const unsigned short*>(p));
  } else {
    return __ldg(reinterpret_cast<const unsigned int*>(p));
  }
}

template <typename T>
__device__ __forceinline__ float LoadFloat(const T* p) {
  return RawToFloat<T>(LoadRaw(p));
}

// kVec elements starting at p, of which the first `valid` exist (scalar path), packed like memory.
template <typename T>
__device__ __forceinline__ uint4 LoadPartial(const T* p, int valid) {
  unsigned int w[4];
  if constexpr (sizeof(T) == 2) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned int lo = 2 * i < valid ? LoadRaw(p + 2 * i) : 0u;
      const unsigned int hi = 2 * i + 1 < valid ? LoadRaw(p + 2 * i + 1) : 0u;
      w[i] = lo | (hi << 16);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = i < valid ? LoadRaw(p + i) : 0u;
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// threadIdx.x through volatile asm: not loop-invariant to the compiler, so the per-item thread
// arithmetic of the 8 row-count variants is recomputed per item instead of being hoisted out of
// the item loop, where it would all stay live at once (and spill).
__device__ __forceinline__ int OpaqueTid() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}
// The same for a kernel argument (K, N), so that strides derived from it are not hoisted either.
__device__ __forceinline__ int Opaque(int x) {
  int y;
  asm volatile("mov.b32 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

// ---- work items ----------------------------------------------------------------------------

struct Args {
  const void* lhs;
  const void* rhs;
  const int32_t* sizes;
  unsigned long long* clamped_calls;
  void* out;
  int groups;
  int rows;
  int k;
  int n;
  // Split K ([G,K,N] only, SmallGroupsSplitK): block `slice` of a cluster of `slices` covers k-rows
  // [slice * slice_k, ...) of its item; the cluster adds the slices (SumClusterSlices).
  int slices;
  int slice_k;
  // Fusion (SmallGroupsFusion, device_gemm.h): lhs row stride, and the row table's inputs.
  int lhs_ld;
  const int32_t* choice_of_row;  // nullptr: row r reads lhs row r and writes out row r
  const float* choice_weights;
  int gather_div;  // > 0: row r reads lhs row choice_of_row[r] / gather_div
  bool scatter;    // row r writes out row choice_of_row[r], times choice_weights[choice_of_row[r]]
};

// Fused calls (SmallGroupsFusion): where each of the M <= kFusedMaxRows sorted rows comes from and
// goes to, loaded once per block before the group offsets (its loads overlap theirs), so that an
// item needs no load and no barrier for it.
struct RowTable {
  short src[kFusedMaxRows];  // lhs row, -1: zeros
  short dst[kFusedMaxRows];  // out row, -1: not written
  float scale[kFusedMaxRows];
};

// What a call fuses: the row table (gather and scatter), and swiglu in the prologue (lhs is
// [rows, 2K]; the routed experts' fc2 with the table, a dense MLP's second GEMM without).
enum class Fuse { kNone, kRows, kRowsSwiglu, kSwiglu };
constexpr bool MapsRows(Fuse f) { return f == Fuse::kRows || f == Fuse::kRowsSwiglu; }
constexpr bool Swiglu(Fuse f) { return f == Fuse::kRowsSwiglu || f == Fuse::kSwiglu; }

// All threads; PrepareChunks' barriers publish the table.
__device__ __forceinline__ void LoadRowTable(const Args& a, RowTable& t) {
  for (int r = threadIdx.x; r < a.rows; r += kThreads) {
    const int c = a.choice_of_row[r];
    const bool ok = c >= 0 && c < a.rows;  // a permutation of [0, M) from te_async's routing kernel
    t.src[r] = static_cast<short>(!ok ? -1 : a.gather_div > 0 ? c / a.gather_div : r);
    t.dst[r] = static_cast<short>(!ok ? -1 : a.scatter ? c : r);
    t.scale[r] = ok && a.scatter ? a.choice_weights[c] : 1.f;
  }
}

// Where sorted row `row` is read from (map = RowTable::src) or written to (RowTable::dst): the row
// itself unless fused.
template <Fuse F>
__device__ __forceinline__ int MappedRow(const short* map, int row) {
  if constexpr (!MapsRows(F)) {
    return row;
  } else {
    return map[row];
  }
}

struct ChunkTables {
  int offs[kMaxG + 1];  // clamped group row offsets; offs[G] = clamped total
  int coff[kMaxG + 2];  // chunk offsets; coff[G + 1] = total chunks
};

// All threads of the block; `cnt` is kMaxG + 1 ints of shared scratch (chunks per group, [G] =
// chunks of the zero rows past the total), free again on return. Returns the total row chunks.
__device__ __forceinline__ int PrepareChunks(const Args& a, ChunkTables& t, int* cnt) {
  if (a.sizes == nullptr) {  // dense: one group of all rows, nothing to load
    if (threadIdx.x == 0) {
      t.offs[0] = 0;
      t.offs[1] = a.rows;
      t.coff[0] = 0;
      t.coff[1] = t.coff[2] = (a.rows + kChunkRows - 1) / kChunkRows;
    }
    __syncthreads();
    return t.coff[2];
  }
  LoadGroupOffsets<kThreads>(a.sizes, a.groups, a.rows, t.offs, a.clamped_calls);
  for (int g = threadIdx.x; g <= a.groups; g += kThreads) {
    const int end = g < a.groups ? t.offs[g + 1] : a.rows;
    cnt[g] = (end - t.offs[g] + kChunkRows - 1) / kChunkRows;
  }
  __syncthreads();
  LoadGroupOffsets<kThreads>(cnt, a.groups + 1, INT_MAX, t.coff);
  return t.coff[a.groups + 1];
}

struct Chunk {
  int group;  // == groups: rows past the clamped total (write zeros)
  int row0;
  int rows;   // 1..kChunkRows
};

__device__ __forceinline__ Chunk FindChunk(const Args& a, const ChunkTables& t, int c) {
  int lo = 0, hi = a.groups;  // largest g in [0, G] with coff[g] <= c; then coff[g + 1] > c
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (t.coff[mid] <= c) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  Chunk ch;
  ch.group = lo;
  ch.row0 = t.offs[lo] + (c - t.coff[lo]) * kChunkRows;
  const int end = lo < a.groups ? t.offs[lo + 1] : a.rows;
  ch.rows = min(kChunkRows, end - ch.row0);
  return ch;
}

// Calls fn(std::integral_constant<int, rows>{}) for a chunk of 1..kChunkRows rows, so that each
// row count runs code compiled for exactly that many rows (both kernels dispatch through it).
template <class Fn>
__device__ __forceinline__ void WithRowCount(int rows, Fn&& fn) {
  static_assert(kChunkRows == 8, "one case per row count");
  switch (rows) {
    case 1: fn(std::integral_constant<int, 1>{}); break;
    case 2: fn(std::integral_constant<int, 2>{}); break;
    case 3: fn(std::integral_constant<int, 3>{}); break;
    case 4: fn(std::integral_constant<int, 4>{}); break;
    case 5: fn(std::integral_constant<int, 5>{}); break;
    case 6: fn(std::integral_constant<int, 6>{}); break;
    case 7: fn(std::integral_constant<int, 7>{}); break;
    default: fn(std::integral_constant<int, 8>{}); break;
  }
}

// ---- [G,K,N] kernel ------------------------------------------------------------------------

template <typename T>
struct KnShared {
  ChunkTables tables;
  RowTable rows;
  // Activations of the current chunk as f32 [k - k0][8] for kStageK k-rows; after the K loop, the
  // per-warp partial sums ([warp][flat][cx], at most kWarps * kChunkRows * kVec * kKnCx floats).
  __align__(16) float buf[kStageK * kChunkRows];
  float slice_sums[kChunkRows * kKnCx * Elem<T>::kVec];  // split K: this slice's sums of the item, [row][col]
  static_assert(kStageK * kChunkRows >= kWarps * kChunkRows * Elem<T>::kVec * kKnCx, "buf holds the partial sums");
};

// One activation: lhs[k], or with a swiglu fusion silu(lhs[k]) * lhs[K + k] rounded to T, as
// te_async.mlp.activate computes it (f32, then the input dtype).
template <typename T, Fuse F>
__device__ __forceinline__ float LoadActivation(const T* row, int K, int k) {
  if constexpr (Swiglu(F)) {
    const float g = LoadFloat(row + k), u = LoadFloat(row + K + k);
    return ToFloat(FromFloat<T>(SwigluF32(g, u)));
  } else {
    return LoadFloat(row + k);
  }
}

// Stages the activations of rows row0..row0+RR-1 (read from their MappedRow), k-rows [k0, k0 + kStageK),
// as f32 [k - k0][8]; rows past RR, rows without a source and k-rows past K are 0 (so that they
// contribute exactly 0).
template <typename T, Fuse F, int RR>
__device__ __forceinline__ void StageActivations(const T* __restrict__ lhs, int ld, const RowTable& table, int row0,
                                                 int K, int k0, float* buf) {
  const int kmax = K - k0;
  // A thread stages kStageK / kThreads k-rows. With up to 2 rows, the loads of all of them are
  // issued before the first store: one L2 round trip per stage instead of four. More rows: one
  // k-row at a time, so that few registers are live next to the accumulators.
  constexpr int kBatch = RR <= 2 ? kStageK / kThreads : 1;
#pragma unroll 1
  for (int kl0 = OpaqueTid(); kl0 < kStageK; kl0 += kBatch * kThreads) {
    float v[kBatch][kChunkRows];
#pragma unroll
    for (int p = 0; p < kBatch; ++p) {
      const int kl = kl0 + p * kThreads;
#pragma unroll
      for (int r = 0; r < kChunkRows; ++r) {
        const int src = r < RR ? MappedRow<F>(table.src, row0 + r) : -1;
        v[p][r] = (src >= 0 && kl < kmax)
                      ? LoadActivation<T, F>(lhs + static_cast<long long>(src) * ld + k0, K, kl)
                      : 0.f;
      }
    }
#pragma unroll
    for (int p = 0; p < kBatch; ++p) {
      float4* dst = reinterpret_cast<float4*>(buf + (kl0 + p * kThreads) * kChunkRows);
      dst[0] = make_float4(v[p][0], v[p][1], v[p][2], v[p][3]);
      if (RR > 4) dst[1] = make_float4(v[p][4], v[p][5], v[p][6], v[p][7]);
    }
  }
}

template <typename T, bool kVec, int U>
__device__ __forceinline__ void LoadWeightRows(const T* p, long long row_stride, int k, int K, int valid_cols,
                                               uint4 (&w)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const bool ok = valid_cols > 0 && k + kKnRowsPerLoad * u < K;
    const T* q = p + u * row_stride;
    if constexpr (kVec) {
      w[u] = ok ? LoadStream(q) : make_uint4(0u, 0u, 0u, 0u);
    } else {
      w[u] = ok ? LoadPartial(q, valid_cols) : make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

// One iteration (kStep = kKnRowsPerLoad * U k-rows of the block) of the [G,K,N] reduction, with its weights
// `cur` already requested: restage the activations at each kStageK boundary, then the FMAs.
template <typename T, bool kVec, Fuse F, int RR, int U>
__device__ __forceinline__ void KnStep(int it, const T* lhs, int ld, const RowTable& table, int row0, int K,
                                       int k_begin, int ky, float* buf, const uint4 (&cur)[U],
                                       float (&acc)[RR][Elem<T>::kVec]) {
  constexpr int V = Elem<T>::kVec;
  constexpr int kStep = kKnRowsPerLoad * U;
  const int kb = it * kStep;  // relative to k_begin, the item's first k-row
  const int kl0 = kb % kStageK;
  if (kl0 == 0) {     // block-uniform
    __syncthreads();  // previous pass (or the previous item's reduction) is done with buf
    StageActivations<T, F, RR>(lhs, ld, table, row0, K, k_begin + kb, buf);
    __syncthreads();
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const float* ap = buf + (kl0 + kKnRowsPerLoad * u + ky) * kChunkRows;
    float x[kChunkRows];
    const float4 a0 = *reinterpret_cast<const float4*>(ap);
    x[0] = a0.x, x[1] = a0.y, x[2] = a0.z, x[3] = a0.w;
    if (RR > 4) {
      const float4 a1 = *reinterpret_cast<const float4*>(ap + 4);
      x[4] = a1.x, x[5] = a1.y, x[6] = a1.z, x[7] = a1.w;
    }
    float f[V];
    Unpack<T>(cur[u], f);
#pragma unroll
    for (int r = 0; r < RR; ++r) {
#pragma unroll
      for (int j = 0; j < V; ++j) acc[r][j] = fmaf(x[r], f[j], acc[r][j]);
    }
  }
}

// Split K: out rows row0.. (kCount = rows x kTile values of the item) = the sum over the cluster's
// blocks, in slice order, of their `sums`; each block adds and writes a share of the values. All
// threads of every block of the cluster call it for the same item.
template <typename TO, int kCount, int kTile>
__device__ __forceinline__ void SumClusterSlices(const Args& a, int row0, int n0, float* sums) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every slice's sums are in its shared memory
  const int per = (kCount + a.slices - 1) / a.slices, begin = static_cast<int>(cluster.block_rank()) * per;
  const int end = min(kCount, begin + per);
  for (int o = begin + threadIdx.x; o < end; o += kThreads) {
    float s = 0.f;
    for (int q = 0; q < a.slices; ++q) s += cluster.map_shared_rank(sums, q)[o];
    const int r = o / kTile, c = o % kTile;
    if (n0 + c < a.n) static_cast<TO*>(a.out)[static_cast<long long>(row0 + r) * a.n + n0 + c] = FromFloat<TO>(s);
  }
  cluster.sync();  // no block leaves, or overwrites its sums, while another still reads them
#else
  __trap();  // PlanSmallGroupsSplitK never splits below compute capability 9.0
#endif
}

template <typename T, typename TO, bool kVec, bool kSplit, Fuse F, int RR>
__device__ __forceinline__ void KnItem(const Args& a, const Chunk& ch, int n0, int slice, KnShared<T>& sh) {
  constexpr int V = Elem<T>::kVec;
  constexpr int kTile = kKnCx * V;
  // k-rows (16-byte loads in flight) per thread per iteration; the scalar path needs V loads each.
  constexpr int U = !kVec ? 2 : (RR <= 4 ? 8 : 4);
  constexpr int kStep = kKnRowsPerLoad * U;  // k-rows per block per iteration
  static_assert(kStageK % kStep == 0, "a staged pass must hold whole iterations");
  const int K = Opaque(a.k), N = Opaque(a.n);
  const int tid = OpaqueTid(), lane = tid & 31, warp = tid >> 5;
  const int cx = tid % kKnCx, ky = tid / kKnCx;
  const T* lhs = static_cast<const T*>(a.lhs);
  const int col = n0 + cx * V;
  const int valid_cols = min(V, N - col);  // <= 0: this thread's columns are past N
  const long long row_stride = static_cast<long long>(kKnRowsPerLoad) * N;  // between a thread's consecutive k-rows
  const long long step_stride = static_cast<long long>(kStep) * N;
  // Without a split (a separate instantiation, so that the decode path keeps its registers) an
  // item covers all of K.
  const int k_begin = kSplit ? slice * a.slice_k : 0, k_end = kSplit ? min(K, k_begin + a.slice_k) : K;
  const T* wp = static_cast<const T*>(a.rhs) + static_cast<long long>(ch.group) * K * N +
                static_cast<long long>(k_begin + ky) * N + col;

  float acc[RR][V];
#pragma unroll
  for (int r = 0; r < RR; ++r) {
#pragma unroll
    for (int j = 0; j < V; ++j) acc[r][j] = 0.f;
  }

  const int iters = (k_end - k_begin + kStep - 1) / kStep;  // slice_k is a multiple of kStep
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    uint4 w[U];
    LoadWeightRows<T, kVec, U>(wp + it * step_stride, row_stride, k_begin + it * kStep + ky, k_end, valid_cols, w);
    KnStep<T, kVec, F, RR, U>(it, lhs, a.lhs_ld, sh.rows, ch.row0, K, k_begin, ky, sh.buf, w, acc);
  }

  // Reduce over the 2 k-slices of the warp (lanes 16 apart): a reduce-scatter, after which lane
  // half q = lane >> 4 holds flat entries [q * NV/2, (q + 1) * NV/2).
  constexpr int NV = RR * V;
  float v[NV];
#pragma unroll
  for (int r = 0; r < RR; ++r) {
#pragma unroll
    for (int j = 0; j < V; ++j) v[r * V + j] = acc[r][j];
  }
  const bool upper = (lane & 16) != 0;
  float h[NV / 2];
#pragma unroll
  for (int i = 0; i < NV / 2; ++i) {
    const float keep = upper ? v[NV / 2 + i] : v[i];
    const float send = upper ? v[i] : v[NV / 2 + i];
    h[i] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
  }
  __syncthreads();  // every warp is done reading the staged activations
  const int qg = lane >> 4;
#pragma unroll
  for (int i = 0; i < NV / 2; ++i) sh.buf[((warp * NV) + qg * (NV / 2) + i) * kKnCx + cx] = h[i];
  __syncthreads();

  TO* out = static_cast<TO*>(a.out);
#pragma unroll 1
  for (int o = tid; o < RR * kTile; o += kThreads) {
    const int r = o / kTile, c = o % kTile;
    const int flat = r * V + c % V, ocx = c / V;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += sh.buf[(w * NV + flat) * kKnCx + ocx];
    if constexpr (kSplit) {
      sh.slice_sums[o] = s;
      continue;
    }
    const int dst = MappedRow<F>(sh.rows.dst, ch.row0 + r);
    if (n0 + c >= N || dst < 0) continue;
    const long long at = static_cast<long long>(dst) * N + n0 + c;
    if constexpr (MapsRows(F)) {
      out[at] = FromFloat<TO>(s * sh.rows.scale[ch.row0 + r]);
    } else {
      out[at] = FromFloat<TO>(s);
    }
  }
  if constexpr (kSplit) SumClusterSlices<TO, RR * kTile, kTile>(a, ch.row0, n0, sh.slice_sums);
  // The next item's first write to buf follows a __syncthreads (staging or reduction).
}

template <typename T, typename TO, bool kVec, bool kSplit, Fuse F>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) SmallGroupsKnKernel(Args a) {
  constexpr int kTile = kKnCx * Elem<T>::kVec;
  __shared__ KnShared<T> sh;
  if constexpr (MapsRows(F)) LoadRowTable(a, sh.rows);
  static_assert(sizeof(sh.buf) >= (kMaxG + 1) * sizeof(int), "buf holds PrepareChunks' scratch");
  const int chunks = PrepareChunks(a, sh.tables, reinterpret_cast<int*>(sh.buf));
  const int tiles = (a.n + kTile - 1) / kTile;
  const int items = tiles * chunks;  // < 2^31: checked on the host
  // Split K: a cluster of a.slices blocks (rank = slice) per item, clusters striding together.
  const int slice = kSplit ? static_cast<int>(blockIdx.x) % a.slices : 0;
  const int first = kSplit ? static_cast<int>(blockIdx.x) / a.slices : static_cast<int>(blockIdx.x);
  const int stride = kSplit ? static_cast<int>(gridDim.x) / a.slices : static_cast<int>(gridDim.x);
  // item -> (tile, chunk), chunk fastest: the row chunks of one group share weights.
#pragma unroll 1
  for (int item = first; item < items; item += stride) {
    const int tile = item / chunks;
    const Chunk ch = FindChunk(a, sh.tables, item % chunks);
    const int n0 = tile * kTile;
    if (ch.group == a.groups) {  // rows past the clamped total: zeros (by one slice; the cluster skips alike)
      if (slice != 0) continue;
      for (int o = threadIdx.x; o < ch.rows * kTile; o += kThreads) {
        const int r = o / kTile, c = o % kTile, dst = MappedRow<F>(sh.rows.dst, ch.row0 + r);
        if (n0 + c >= a.n || dst < 0) continue;
        static_cast<TO*>(a.out)[static_cast<long long>(dst) * a.n + n0 + c] = FromFloat<TO>(0.f);
      }
      continue;
    }
    WithRowCount(ch.rows, [&](auto rr) {
      KnItem<T, TO, kVec, kSplit, F, decltype(rr)::value>(a, ch, n0, slice, sh);
    });
  }
}

// ---- [G,N,K] kernel ------------------------------------------------------------------------

struct NkShared {
  ChunkTables tables;
  float red[kWarps][32 * kNkLd];  // per-warp transpose: [lane][flat], padded
};

// 32-bit word -> the floats it holds (2 for 16-bit types, 1 for f32), element order of memory.
template <typename T, int kPerWord>
__device__ __forceinline__ void WordToFloats(unsigned int w, float (&f)[kPerWord]) {
  if constexpr (kPerWord == 1) {
    f[0] = RawToFloat<T>(w);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    f[0] = __uint_as_float(w << 16);
    f[1] = __uint_as_float(w & 0xffff0000u);
  } else {
    f[0] = RawToFloat<T>(w & 0xffffu);
    f[1] = RawToFloat<T>(w >> 16);
  }
}

template <typename T, bool kVec>
struct NkPack;
template <typename T>
struct NkPack<T, true> {  // one 16-byte vector per lane
  static constexpr int kElems = Elem<T>::kVec;
  static constexpr int kWords = 4;
  static constexpr int kPerWord = kElems / kWords;
  using Type = uint4;
  static __device__ __forceinline__ Type Load(const T* p, bool ok, bool stream) {
    if (!ok) return make_uint4(0u, 0u, 0u, 0u);
    return stream ? LoadStream(p) : __ldg(reinterpret_cast<const uint4*>(p));
  }
  static __device__ __forceinline__ unsigned int Word(const Type& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;  // i is a compile-time constant
  }
};
template <typename T>
struct NkPack<T, false> {  // one element per lane
  static constexpr int kElems = 1;
  static constexpr int kWords = 1;
  static constexpr int kPerWord = 1;
  using Type = unsigned int;
  static __device__ __forceinline__ Type Load(const T* p, bool ok, bool) { return ok ? LoadRaw(p) : 0u; }
  static __device__ __forceinline__ unsigned int Word(const Type& v, int) { return v; }
};

template <typename T, typename TO, bool kVec, int RR>
__device__ __forceinline__ void NkItem(const Args& a, const Chunk& ch, int n0, float* red) {
  using P = NkPack<T, kVec>;
  constexpr int E = P::kElems;
  constexpr int U = RR <= 4 ? 2 : 1;  // k-vectors per lane per iteration: 4U weight loads in flight
  constexpr int kStep = 32 * E * U;  // k per warp per iteration
  const int K = Opaque(a.k), N = Opaque(a.n);
  const int lane = OpaqueTid() & 31;
  const T* lhs = static_cast<const T*>(a.lhs) + static_cast<long long>(ch.row0) * K;
  const T* rhs = static_cast<const T*>(a.rhs) + static_cast<long long>(ch.group) * N * K;
  bool col_ok[kNkCols];
  const T* wrow[kNkCols];
#pragma unroll
  for (int c = 0; c < kNkCols; ++c) {
    col_ok[c] = n0 + c < N;
    wrow[c] = rhs + static_cast<long long>(col_ok[c] ? n0 + c : n0) * K;
  }
  float acc[RR][kNkCols];
#pragma unroll
  for (int r = 0; r < RR; ++r) {
#pragma unroll
    for (int c = 0; c < kNkCols; ++c) acc[r][c] = 0.f;
  }

#pragma unroll 1
  for (int kb = 0; kb < K; kb += kStep) {
    typename P::Type w[U][kNkCols];
    typename P::Type x[U][RR];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = kb + (u * 32 + lane) * E;
      const bool ok = k < K;  // vector path: K % E == 0, so the whole vector is in range
#pragma unroll
      for (int c = 0; c < kNkCols; ++c) w[u][c] = P::Load(wrow[c] + k, ok && col_ok[c], true);
#pragma unroll
      for (int r = 0; r < RR; ++r) x[u][r] = P::Load(lhs + static_cast<long long>(r) * K + k, ok, false);
    }
    // Convert one 32-bit word at a time, so that few converted floats are live at once.
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int i = 0; i < P::kWords; ++i) {
        float fw[kNkCols][P::kPerWord];
#pragma unroll
        for (int c = 0; c < kNkCols; ++c) WordToFloats<T, P::kPerWord>(P::Word(w[u][c], i), fw[c]);
#pragma unroll
        for (int r = 0; r < RR; ++r) {
          float fx[P::kPerWord];
          WordToFloats<T, P::kPerWord>(P::Word(x[u][r], i), fx);
#pragma unroll
          for (int c = 0; c < kNkCols; ++c) {
#pragma unroll
            for (int j = 0; j < P::kPerWord; ++j) acc[r][c] = fmaf(fx[j], fw[c][j], acc[r][c]);
          }
        }
      }
    }
  }

  // Sum over the 32 lanes through a padded transpose: lane l writes row l, lane i < RR*4 sums
  // column i.
  constexpr int NV = RR * kNkCols;
#pragma unroll
  for (int r = 0; r < RR; ++r) {
#pragma unroll
    for (int c = 0; c < kNkCols; ++c) red[lane * kNkLd + r * kNkCols + c] = acc[r][c];
  }
  __syncwarp();
  if (lane < NV) {
    float s = 0.f;
#pragma unroll
    for (int l = 0; l < 32; ++l) s += red[l * kNkLd + lane];
    const int r = lane / kNkCols, c = lane % kNkCols;
    if (n0 + c < N) static_cast<TO*>(a.out)[static_cast<long long>(ch.row0 + r) * N + n0 + c] = FromFloat<TO>(s);
  }
  __syncwarp();  // reads done before the warp's next item writes red
}

template <typename T, typename TO, bool kVec>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) SmallGroupsNkKernel(Args a) {
  __shared__ NkShared sh;
  static_assert(sizeof(sh.red) >= (kMaxG + 1) * sizeof(int), "red holds PrepareChunks' scratch");
  const int chunks = PrepareChunks(a, sh.tables, reinterpret_cast<int*>(sh.red));  // ends with a barrier
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int tiles = (a.n + kNkCols - 1) / kNkCols;
  const int items = tiles * chunks;  // < 2^31: checked on the host
  const int stride = gridDim.x * kWarps;
#pragma unroll 1
  for (int item = blockIdx.x * kWarps + warp; item < items; item += stride) {
    const int tile = item / chunks;
    const Chunk ch = FindChunk(a, sh.tables, item % chunks);
    const int n0 = tile * kNkCols;
    if (ch.group == a.groups) {  // rows past the clamped total
      if (lane < ch.rows * kNkCols) {
        const int r = lane / kNkCols, c = lane % kNkCols;
        if (n0 + c < a.n) static_cast<TO*>(a.out)[static_cast<long long>(ch.row0 + r) * a.n + n0 + c] = FromFloat<TO>(0.f);
      }
      continue;
    }
    float* red = sh.red[warp];
    WithRowCount(ch.rows, [&](auto rr) { NkItem<T, TO, kVec, decltype(rr)::value>(a, ch, n0, red); });  // warp-uniform
  }
}

// ---- host side -----------------------------------------------------------------------------

// Upper bound on the row chunks: ranges (G groups + the zero range) with m_i rows give
// sum ceil(m_i / 8) <= (M + 7 * nonempty) / 8, nonempty <= min(G + 1, M).
long long MaxChunks(long long groups, long long rows) {
  const long long nonempty = groups + 1 < rows ? groups + 1 : rows;
  return (rows + (kChunkRows - 1) * nonempty) / kChunkRows;
}

// [G,K,N] column tiles: kKnCx 16-byte vectors, 128 columns of 16-bit types, 64 of f32.
long long KnTiles(const GroupedGemmShape& s) {
  const long long cols = kKnCx * (s.in_type == ffi::DataType::F32 ? 4 : 8);
  return (s.n + cols - 1) / cols;
}

}  // namespace

SmallGroupsSplitK PlanSmallGroupsSplitK(const GroupedGemmShape& s, int compute_capability, int sm_count,
                                        int max_slices) {
  SmallGroupsSplitK split;
  const long long items = KnTiles(s) * MaxChunks(s.groups, s.rows);
  if (compute_capability < 90 || s.transpose_rhs || s.ragged_k || s.rows <= 0 || s.n <= 0 || items >= sm_count) {
    return split;
  }
  const long long want = (static_cast<long long>(kBlocksPerSm) * sm_count + items - 1) / items;
  const long long most = (s.k + kSplitKGranule - 1) / kSplitKGranule;
  const long long slices = std::min<long long>({want, most, kMaxSlices, max_slices});
  if (slices <= 1) return split;
  const long long per = (s.k + slices - 1) / slices;
  const int slice_k = static_cast<int>((per + kSplitKGranule - 1) / kSplitKGranule * kSplitKGranule);
  const int count = static_cast<int>((s.k + slice_k - 1) / slice_k);
  if (count <= 1) return split;
  split.slices = count;
  split.slice_k = slice_k;
  return split;
}

namespace {

// The [G,K,N] kernel for a call: with the row table (never split; LaunchSmallGroups allows its
// swiglu prologue with f32 output only, so it is not instantiated for other outputs), or without
// (split or not, swiglu prologue or not).
template <typename T, typename TO, bool kVec>
void (*KnKernel(bool splits, const SmallGroupsFusion& fusion))(Args) {
  if (fusion.choice_of_row != nullptr) {
    if (!fusion.swiglu) return SmallGroupsKnKernel<T, TO, kVec, false, Fuse::kRows>;
    if constexpr (std::is_same_v<TO, float>) return SmallGroupsKnKernel<T, TO, kVec, false, Fuse::kRowsSwiglu>;
    return nullptr;
  }
  if (fusion.swiglu) {
    return splits ? SmallGroupsKnKernel<T, TO, kVec, true, Fuse::kSwiglu> : SmallGroupsKnKernel<T, TO, kVec, false, Fuse::kSwiglu>;
  }
  return splits ? SmallGroupsKnKernel<T, TO, kVec, true, Fuse::kNone> : SmallGroupsKnKernel<T, TO, kVec, false, Fuse::kNone>;
}

// The split for a call: PlanSmallGroupsSplitK's, with fewer slices while the clusters of the
// items would not all be resident at once (a cluster's blocks share a GPC, so clusters of many
// blocks fit fewer times than the SMs suggest; a second wave costs more than the split saves).
ffi::ErrorOr<SmallGroupsSplitK> ResidentSplit(const DeviceGemm& g, void (*split_kernel)(Args), long long items) {
  SmallGroupsSplitK split = PlanSmallGroupsSplitK(g.s, g.compute_capability, g.sm_count);
  while (split.slices > 1) {
    auto resident = ResidentClusters(split_kernel, kThreads, split.slices);
    if (resident.has_error()) return ffi::Unexpected(resident.error());
    if (items <= *resident) break;
    split = PlanSmallGroupsSplitK(g.s, g.compute_capability, g.sm_count, split.slices - 1);
  }
  return split;
}

template <typename T, typename TO>
ffi::Error Launch(const DeviceGemm& g, const SmallGroupsFusion& fusion, cudaStream_t stream) {
  const GroupedGemmShape& s = g.s;
  constexpr int V = Elem<T>::kVec;
  Args a;
  a.lhs = g.lhs;
  a.rhs = g.rhs;
  a.sizes = g.group_sizes;
  a.clamped_calls = g.clamped_calls;
  a.out = g.out;
  a.groups = static_cast<int>(s.groups);
  a.rows = static_cast<int>(s.rows);
  a.k = static_cast<int>(s.k);
  a.n = static_cast<int>(s.n);
  a.lhs_ld = static_cast<int>(fusion.swiglu ? 2 * s.k : s.k);
  a.choice_of_row = fusion.choice_of_row;
  a.choice_weights = fusion.choice_weights;
  a.gather_div = fusion.gather_div;
  a.scatter = fusion.scatter;
  const long long max_blocks = static_cast<long long>(kBlocksPerSm) * (g.sm_count > 0 ? g.sm_count : 1);
  const long long chunks = MaxChunks(s.groups, s.rows);
  const long long max_tiles = s.transpose_rhs ? (s.n + kNkCols - 1) / kNkCols : KnTiles(s);
  if (max_tiles * chunks > INT_MAX / 2) {  // the kernels count items in int
    return ffi::Error::InvalidArgument("te_async: small_group_gemm: too many work items (N x M too large)");
  }
  if (!s.transpose_rhs) {
    const bool vec = s.n % V == 0 && Aligned16(g.rhs);
    const auto kernel = [&](bool splits) {
      return vec ? KnKernel<T, TO, true>(splits, fusion) : KnKernel<T, TO, false>(splits, fusion);
    };
    SmallGroupsSplitK split;  // the row table is never split
    if (fusion.choice_of_row == nullptr) {
      auto resident = ResidentSplit(g, kernel(true), max_tiles * chunks);
      if (resident.has_error()) return resident.error();
      split = *resident;
    }
    a.slices = split.slices;
    a.slice_k = split.slices > 1 ? split.slice_k : a.k;
    // Whole clusters of split.slices blocks, each cluster on one item at a time.
    long long clusters = max_tiles * chunks;
    if (clusters > max_blocks / split.slices) clusters = max_blocks / split.slices;
    if (clusters < 1) clusters = 1;
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t config = ClusterLaunchConfig(clusters * split.slices, kThreads, split.slices, stream, attr);
    return CudaStatus(cudaLaunchKernelEx(&config, kernel(split.slices > 1), a),
                      "launch of small_group_gemm kernel SmallGroupsKnKernel ([G,K,N] rhs)");
  }
  const long long tiles = (s.n + kNkCols - 1) / kNkCols;
  long long grid = (tiles * chunks + kWarps - 1) / kWarps;
  if (grid > max_blocks) grid = max_blocks;
  if (grid < 1) grid = 1;
  const bool vec = s.k % V == 0 && Aligned16(g.rhs) && Aligned16(g.lhs);
  if (vec) {
    SmallGroupsNkKernel<T, TO, true><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(a);
  } else {
    SmallGroupsNkKernel<T, TO, false><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(a);
  }
  return CudaStatus(cudaGetLastError(), "launch of small_group_gemm kernel SmallGroupsNkKernel ([G,N,K] rhs)");
}

}  // namespace

ffi::Error LaunchSmallGroups(const DeviceGemm& g, cudaStream_t stream, const SmallGroupsFusion& fusion) {
  const GroupedGemmShape& s = g.s;
  const int64_t limit = INT_MAX / 2;
  if (s.rows < 0 || s.k < 0 || s.n < 0 || s.rows > limit || s.k > limit || s.n > limit) {
    return ffi::Error::InvalidArgument("te_async: small_group_gemm: dimensions out of range");
  }
  if (s.rows == 0 || s.n == 0) return ffi::Error::Success();  // empty output
  using ffi::DataType;
  const DataType in = s.in_type, out = s.out_type;
  if (fusion.on() && (s.transpose_rhs || s.ragged_k)) {  // every fusion check, before any kernel is chosen
    return ffi::Error::InvalidArgument("te_async: small_group_gemm: fusion runs ragged m with rhs [G,K,N] only");
  }
  if (fusion.choice_of_row != nullptr) {
    if (s.rows > kFusedMaxRows) {
      return ffi::Error::InvalidArgument("te_async: small_group_gemm: the row table holds at most " +
                                         std::to_string(kFusedMaxRows) + " rows, got " + std::to_string(s.rows));
    }
    if (fusion.swiglu && out != DataType::F32) {
      return ffi::Error::InvalidArgument("te_async: small_group_gemm: the swiglu prologue with the row table writes float32 only");
    }
  } else if (fusion.gather_div != 0 || fusion.scatter) {
    return ffi::Error::InvalidArgument("te_async: small_group_gemm: a gather or scatter needs choice_of_row");
  }
  if (in == DataType::BF16 && out == DataType::BF16) return Launch<__nv_bfloat16, __nv_bfloat16>(g, fusion, stream);
  if (in == DataType::BF16 && out == DataType::F32) return Launch<__nv_bfloat16, float>(g, fusion, stream);
  if (in == DataType::F16 && out == DataType::F16) return Launch<__half, __half>(g, fusion, stream);
  if (in == DataType::F16 && out == DataType::F32) return Launch<__half, float>(g, fusion, stream);
  if (in == DataType::F32 && out == DataType::F32) return Launch<float, float>(g, fusion, stream);
  return ffi::Error::InvalidArgument("te_async: small_group_gemm: unsupported dtypes (inputs bf16, f16 or f32; "
                                     "output the input dtype or f32)");
}

}  // namespace te_async
