// Element <-> f32 conversions shared by the device-mode kernels (f32 accumulation; outputs
// rounded to nearest even).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace te_async {

template <typename T>
__device__ __forceinline__ float ToFloat(T v);
template <>
__device__ __forceinline__ float ToFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float ToFloat<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// v rounded to T's precision (nearest even), back in f32: where an unfused path writes T.
template <typename T>
__device__ __forceinline__ float Rounded(float v) {
  return ToFloat<T>(FromFloat<T>(v));
}

// SwiGLU's activation of one (gate, up) pair in f32, as te_async.mlp.activate computes it before
// rounding to the input dtype: silu(gate) * up.
__device__ __forceinline__ float SwigluF32(float gate, float up) { return gate / (1.f + expf(-gate)) * up; }

}  // namespace te_async
