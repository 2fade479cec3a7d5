// transformers' RMSNorm and rotate_half rope as te_async.models computes them (norm.py, rope.py),
// for the token kernels that fuse them (mla_token.cu, gqa_token.cu): each rounds where the unfused
// path writes bf16.
#pragma once

#include <cuda_bf16.h>

#include "cuda/block_reduce.cuh"
#include "cuda/float_convert.cuh"

namespace te_async {

// 1 / rms of n values over a block of kBlockWarps warps, from each thread's sum of its squares.
// scratch: kBlockWarps floats.
template <int kBlockWarps>
__device__ __forceinline__ float InverseRms(float squares, int n, float eps, float* scratch) {
  return rsqrtf(BlockReduce<kBlockWarps>(squares, scratch, [](float u, float v) { return u + v; }) / n + eps);
}

// One value x normalised with it (rounded), times its weight (rounded).
__device__ __forceinline__ float Normalized(float x, float inverse_rms, __nv_bfloat16 weight) {
  return Rounded<__nv_bfloat16>(__bfloat162float(weight) * Rounded<__nv_bfloat16>(x * inverse_rms));
}

// Element i of a head rotated by rotate_half: x cos - partner sin in the first half (partner =
// element i + half), x cos + partner sin in the second (partner = element i - half); cos and sin
// the position's, duplicated over the halves.
__device__ __forceinline__ __nv_bfloat16 RotatedHalf(float x, float partner, float cos, float sin, bool first_half) {
  return __float2bfloat16(x * cos + (first_half ? -partner : partner) * sin);
}

}  // namespace te_async
