// 16-byte weight loads and their unpacking to f32, shared by the decode kernels that stream
// weights (small_group_gemm.cu, token_ffn.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace te_async {

template <typename T>
struct Elem;
template <>
struct Elem<__nv_bfloat16> {
  using Raw = unsigned short;
  static constexpr int kVec = 8;  // elements per 16-byte vector
};
template <>
struct Elem<__half> {
  using Raw = unsigned short;
  static constexpr int kVec = 8;
};
template <>
struct Elem<float> {
  using Raw = unsigned int;
  static constexpr int kVec = 4;
};

template <typename T>
__device__ __forceinline__ float RawToFloat(unsigned int r);
template <>
__device__ __forceinline__ float RawToFloat<__nv_bfloat16>(unsigned int r) {
  return __uint_as_float(r << 16);
}
template <>
__device__ __forceinline__ float RawToFloat<__half>(unsigned int r) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(r)));
}
template <>
__device__ __forceinline__ float RawToFloat<float>(unsigned int r) {
  return __uint_as_float(r);
}

// 16-byte vector -> kVec floats, element j of memory -> f[j].
template <typename T>
__device__ __forceinline__ void Unpack(const uint4& v, float (&f)[Elem<T>::kVec]) {
  const unsigned int w[4] = {v.x, v.y, v.z, v.w};
  if constexpr (sizeof(T) == 2) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
      } else {
        f[2 * i] = RawToFloat<T>(w[i] & 0xffffu);
        f[2 * i + 1] = RawToFloat<T>(w[i] >> 16);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = __uint_as_float(w[i]);
  }
}

// Whether p can be read with 16-byte vector loads (host side: a launcher's choice of path).
inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Weights are streamed: read once from HBM, no L1 allocation (L2 keeps them for any other block
// that reads the same lines at about the same time).
__device__ __forceinline__ uint4 LoadStream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// LoadStream for weights that a programmatic dependent kernel loads before WaitForPrevious, so that
// they arrive while the previous kernel runs. ptxas moves .nc loads (read-only for the whole kernel,
// so legal anywhere) after griddepcontrol.wait: mla_token.cu's weight loads all waited for the
// previous kernel (its SASS at 2ce7354). A plain load stays where it is written.
__device__ __forceinline__ uint4 LoadStreamBeforeWait(const void* p) {
  uint4 v;
  asm("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

}  // namespace te_async
