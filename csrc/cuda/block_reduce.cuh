// One value reduced over a few lanes, a warp or a whole block, in a fixed order whatever the timing
// (deterministic), for the decode attention, the MLA call's kernels and the routing.
#pragma once

namespace te_async {

// op over each aligned group of `width` lanes (a power of two, at most 32), on every lane of the
// group (an xor butterfly; the whole warp calls it).
template <typename V, typename Op>
__device__ __forceinline__ V LaneGroupReduce(V x, int width, Op op) {
#pragma unroll
  for (int d = width / 2; d > 0; d >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, d));
  return x;
}

// P for items served by P consecutive threads each in a block of `block` threads (items <= block):
// the largest power of two, at most 32, with P * items <= block.
__device__ __forceinline__ int LanesPerItem(int items, int block) {
  int lanes = 1;
  while (lanes < 32 && 2 * lanes * items <= block) lanes *= 2;
  return lanes;
}

// op over the warp's 32 lanes, on every lane.
template <typename Op>
__device__ __forceinline__ float WarpReduce(float x, Op op) {
  return LaneGroupReduce(x, 32, op);
}

// op over the warp's 32 lanes for each of N values at once (WarpReduce's order), their chains of
// dependent shuffles interleaved; on every lane.
template <int N, typename Op>
__device__ __forceinline__ void WarpReduceEach(float (&x)[N], Op op) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
#pragma unroll
    for (int n = 0; n < N; ++n) x[n] = op(x[n], __shfl_xor_sync(0xffffffffu, x[n], d));
  }
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
