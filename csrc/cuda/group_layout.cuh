// Group offsets computed on the GPU from group_sizes, with the clamping every device kernel
// shares (device_gemm.h): negative sizes count as 0, and no group runs past row `rows`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace te_async {

// All threads of the block call this. Writes offsets[0..groups] (shared memory, groups + 1 ints):
// group g covers rows [offsets[g], offsets[g+1]). Ends with __syncthreads().
// kThreads must be the block size, a multiple of 32, at most 1024.
template <int kThreads>
__device__ inline void LoadGroupOffsets(const int32_t* __restrict__ sizes, int groups, int rows,
                                        int* offsets) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block size");
  __shared__ long long warp_sums[kThreads / 32];
  __shared__ long long carry_in;
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  if (t == 0) {
    offsets[0] = 0;
    carry_in = 0;
  }
  __syncthreads();
  for (int base = 0; base < groups; base += kThreads) {
    const int g = base + t;
    long long v = g < groups ? max(sizes[g], 0) : 0;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {  // inclusive warp scan
      const long long u = __shfl_up_sync(0xffffffffu, v, d);
      if (lane >= d) v += u;
    }
    if (lane == 31) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
      long long w = lane < kThreads / 32 ? warp_sums[lane] : 0;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const long long u = __shfl_up_sync(0xffffffffu, w, d);
        if (lane >= d) w += u;
      }
      if (lane < kThreads / 32) warp_sums[lane] = w;  // inclusive scan of warp totals
    }
    __syncthreads();
    const long long prefix = carry_in + v + (warp > 0 ? warp_sums[warp - 1] : 0);
    if (g < groups) offsets[g + 1] = static_cast<int>(prefix < rows ? prefix : rows);
    __syncthreads();
    if (t == kThreads - 1) carry_in = prefix;
    __syncthreads();
  }
}

}  // namespace te_async
