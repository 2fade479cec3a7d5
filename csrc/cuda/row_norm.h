// The row-norm kernels' plan (row_norm.cu), which te_async/row_norm.py asks through the module:
// where they apply and how many blocks walk the rows.
#pragma once

#include <cstddef>
#include <cstdint>

namespace te_async {

// One thread per 16 bytes of a row, at most one block of threads per row.
inline constexpr int kRowNormMaxThreads = 1024;

inline bool RowNormApplies(int64_t h, size_t elem_bytes) {
  const int64_t vec = static_cast<int64_t>(16 / elem_bytes);
  return h > 0 && h % vec == 0 && h / vec <= kRowNormMaxThreads;
}

// Threads of a block: one per 16-byte chunk of a row, rounded up to whole warps.
inline int RowNormThreads(int64_t h, size_t elem_bytes) {
  const int64_t chunks = h / static_cast<int64_t>(16 / elem_bytes);
  return static_cast<int>((chunks + 31) / 32 * 32);
}

// Blocks: as many as are resident at once (2048 threads an SM, at most 8 blocks), at most one per
// row and at least one (the backward's partial column sums have a row per block).
inline int64_t RowNormBlocks(int64_t rows, int64_t h, size_t elem_bytes, int sm_count) {
  int64_t per_sm = 2048 / RowNormThreads(h, elem_bytes);
  per_sm = per_sm < 1 ? 1 : (per_sm > 8 ? 8 : per_sm);
  const int64_t resident = per_sm * (sm_count > 0 ? sm_count : 1);
  const int64_t blocks = rows < resident ? rows : resident;
  return blocks < 1 ? 1 : blocks;
}

}  // namespace te_async
