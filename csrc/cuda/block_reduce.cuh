// One float reduced over a warp or a whole block, in a fixed order whatever the timing
// (deterministic), for the decode attention's merge and the MLA call's kernels.
#pragma once

namespace te_async {

// op over the warp's 32 lanes, on every lane (an xor butterfly).
template <typename Op>
__device__ __forceinline__ float WarpReduce(float x, Op op) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, d));
  return x;
}

// op over a block of kBlockWarps warps, on every thread: each warp's result, then the warps' in
// warp order. scratch: kBlockWarps floats, free again on return.
template <int kBlockWarps, typename Op>
__device__ __forceinline__ float BlockReduce(float x, float* scratch, Op op) {
  x = WarpReduce(x, op);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  x = scratch[0];
  for (int w = 1; w < kBlockWarps; ++w) x = op(x, scratch[w]);
  __syncthreads();
  return x;
}

}  // namespace te_async
