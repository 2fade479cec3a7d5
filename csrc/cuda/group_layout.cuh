// Group offsets computed on the GPU from group_sizes, with the clamping every device kernel
// shares (device_gemm.h): negative sizes count as 0, and no group runs past row `rows`. A call that
// needed clamping is counted (device_counters.h), since inside a CUDA graph it cannot raise.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace te_async {

// All threads of the block call this. Writes offsets[0..groups] (shared memory, groups + 1 ints):
// group g covers rows [offsets[g], offsets[g+1]). Ends with __syncthreads().
// kThreads must be the block size, a multiple of 32, at most 1024.
// With `clamped_calls` given, block (0,0,0) adds 1 to it when the sizes needed clamping; every
// launch has that block, so a call counts once per kernel that is given the counter (one per call).
template <int kThreads>
__device__ inline void LoadGroupOffsets(const int32_t* __restrict__ sizes, int groups, int rows,
                                        int* offsets, unsigned long long* clamped_calls = nullptr) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block size");
  __shared__ long long warp_sums[kThreads / 32];
  __shared__ long long carry_in;
  __shared__ int negative;
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  if (t == 0) {
    offsets[0] = 0;
    carry_in = 0;
    negative = 0;
  }
  __syncthreads();
  for (int base = 0; base < groups; base += kThreads) {
    const int g = base + t;
    const int size = g < groups ? sizes[g] : 0;
    if (size < 0) negative = 1;  // the same value from every writer
    long long v = max(size, 0);
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
  if (clamped_calls != nullptr && t == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 &&
      (negative || carry_in > rows)) {
    atomicAdd(clamped_calls, 1ull);
  }
}

}  // namespace te_async
