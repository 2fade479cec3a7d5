// RMSNorm and LayerNorm over the rows of x [M, H], forward and backward, one pass over the rows
// each (te_async/row_norm.py). XLA ran grouped_mlp's norm as three kernels each way, reading x
// twice forward and three times backward (H200, DeepSeek-V2-Lite's 24576 routed rows: 94 us
// forward, 223 us backward, docs/benchmarks.md table T).
//
// A block of H/V threads (V elements of 16 bytes each) walks rows blockIdx.x, + gridDim.x, ...;
// each thread keeps the same V columns for every row, so the scale and bias are loaded once and
// the backward's column sums (d scale, d bias) stay in registers until the block writes its
// partial row [blocks, H] (float32; te_async sums the blocks' rows, in order: deterministic).
// The next row's loads are issued before the current row's block reduction.
//
//   RMSNorm:   r = rsqrt(mean(x^2) + eps), xhat = x r, y = xhat s
//              dx = r (g - xhat mean(g xhat)),  g = dy s
//   LayerNorm: m = mean(x), r = rsqrt(mean((x - m)^2) + eps), xhat = (x - m) r, y = xhat s + b
//              dx = r (g - mean(g) - xhat mean(g xhat))
//   d s = sum over rows of dy xhat, d b = sum over rows of dy; y and dx rounded to x's dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/float_convert.cuh"
#include "cuda/handlers.h"
#include "cuda/row_norm.h"
#include "cuda/vector_loads.cuh"
#include "debug_flags.h"
#include "xla/ffi/api/ffi.h"

namespace te_async {
namespace {

namespace ffi = xla::ffi;

constexpr int kMaxWarps = kRowNormMaxThreads / 32;
constexpr int kMaxSums = 3;  // values one block reduction sums at most (LayerNorm's backward)

// Sums up to kMaxSums values over the block; every thread gets the totals. Two shared buffers
// alternate between calls, so one barrier a call suffices: a warp writes a buffer again only
// after the next call's barrier, which every warp reaches only once it has read this call's sums.
struct BlockSum {
  float (*slots)[kMaxWarps][kMaxSums];  // [2][warps][kMaxSums] in shared memory
  int round = 0;

  template <int N>
  __device__ __forceinline__ void operator()(float (&v)[N]) {
    static_assert(N <= kMaxSums, "too many sums for one round");
#pragma unroll
    for (int i = 0; i < N; ++i) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
    }
    float(*buf)[kMaxSums] = slots[round & 1];
    ++round;
    const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
    if (threadIdx.x % 32 == 0) {
#pragma unroll
      for (int i = 0; i < N; ++i) buf[warp][i] = v[i];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = 0.f;
    for (int w = 0; w < warps; ++w) {
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] += buf[w][i];
    }
  }
};

template <typename T>
__device__ __forceinline__ uint4 LoadRow(const T* base, int64_t row, int h, int col, bool active) {
  return active ? *reinterpret_cast<const uint4*>(base + row * h + col) : make_uint4(0, 0, 0, 0);
}

template <typename T>
__device__ __forceinline__ void StoreRow(T* base, int64_t row, int h, int col, const float (&f)[Elem<T>::kVec]) {
  if constexpr (sizeof(T) == 4) {
    *reinterpret_cast<float4*>(base + row * h + col) = make_float4(f[0], f[1], f[2], f[3]);
  } else {
    uint4 out;
    unsigned int* w = &out.x;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const T lo = FromFloat<T>(f[2 * i]), hi = FromFloat<T>(f[2 * i + 1]);
      w[i] = static_cast<unsigned int>(reinterpret_cast<const unsigned short&>(lo)) |
             (static_cast<unsigned int>(reinterpret_cast<const unsigned short&>(hi)) << 16);
    }
    *reinterpret_cast<uint4*>(base + row * h + col) = out;
  }
}

// A thread's V floats of an [H] float32 vector (scale or bias), or `fill` where there is none.
template <int V>
__device__ __forceinline__ void LoadColumns(const float* p, int col, bool active, float fill, float (&f)[V]) {
#pragma unroll
  for (int i = 0; i < V; ++i) f[i] = (p != nullptr && active) ? p[col + i] : fill;
}

struct NormArgs {
  const void* x;
  const void* dy;      // backward only
  const float* scale;  // [H] or null (ones)
  const float* bias;   // [H] or null (zeros); forward only
  void* out;           // y, or dx
  float* dscale;       // [blocks, H] or null; backward only
  float* dbias;        // [blocks, H] or null; backward only
  int64_t rows;
  int h;
  float eps;
};

// LayerNorm's row mean (a block reduction of its own, before the centred sums), 0 for RMSNorm.
template <bool kLayerNorm, int V>
__device__ __forceinline__ float RowMean(const float (&x)[V], float inv_h, BlockSum& sum) {
  if constexpr (!kLayerNorm) return 0.f;
  float t[1] = {0.f};
#pragma unroll
  for (int i = 0; i < V; ++i) t[0] += x[i];
  sum(t);
  return t[0] * inv_h;
}

template <typename T, bool kLayerNorm>
__global__ void __launch_bounds__(kRowNormMaxThreads) RowNormForward(NormArgs a) {
  constexpr int V = Elem<T>::kVec;
  __shared__ float slots[2][kMaxWarps][kMaxSums];
  BlockSum sum{slots};
  const int col = threadIdx.x * V;
  const bool active = col < a.h;
  const float inv_h = 1.f / static_cast<float>(a.h);
  float s[V], b[V];
  LoadColumns(a.scale, col, active, 1.f, s);
  LoadColumns(a.bias, col, active, 0.f, b);
  const T* x = static_cast<const T*>(a.x);
  uint4 next = blockIdx.x < a.rows ? LoadRow(x, blockIdx.x, a.h, col, active) : make_uint4(0, 0, 0, 0);
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    float v[V];
    Unpack<T>(next, v);
    if (row + gridDim.x < a.rows) next = LoadRow(x, row + gridDim.x, a.h, col, active);
    const float mean = RowMean<kLayerNorm>(v, inv_h, sum);
    float q[1] = {0.f};
#pragma unroll
    for (int i = 0; i < V; ++i) q[0] += (v[i] - mean) * (v[i] - mean);
    sum(q);
    const float r = rsqrtf(q[0] * inv_h + a.eps);
    if (active) {
      float y[V];
#pragma unroll
      for (int i = 0; i < V; ++i) y[i] = (v[i] - mean) * r * s[i] + b[i];
      StoreRow(static_cast<T*>(a.out), row, a.h, col, y);
    }
  }
}

template <typename T, bool kLayerNorm>
__global__ void __launch_bounds__(kRowNormMaxThreads) RowNormBackward(NormArgs a) {
  constexpr int V = Elem<T>::kVec;
  __shared__ float slots[2][kMaxWarps][kMaxSums];
  BlockSum sum{slots};
  const int col = threadIdx.x * V;
  const bool active = col < a.h;
  const float inv_h = 1.f / static_cast<float>(a.h);
  float s[V], ds[V] = {}, db[V] = {};
  LoadColumns(a.scale, col, active, 1.f, s);
  const T* x = static_cast<const T*>(a.x);
  const T* dy = static_cast<const T*>(a.dy);
  uint4 next_x = make_uint4(0, 0, 0, 0), next_dy = next_x;
  if (blockIdx.x < a.rows) {
    next_x = LoadRow(x, blockIdx.x, a.h, col, active);
    next_dy = LoadRow(dy, blockIdx.x, a.h, col, active);
  }
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    float v[V], d[V];
    Unpack<T>(next_x, v);
    Unpack<T>(next_dy, d);
    if (row + gridDim.x < a.rows) {
      next_x = LoadRow(x, row + gridDim.x, a.h, col, active);
      next_dy = LoadRow(dy, row + gridDim.x, a.h, col, active);
    }
    const float mean = RowMean<kLayerNorm>(v, inv_h, sum);
    // sums: (x - m)^2, g (x - m), and g for LayerNorm (g = dy s)
    float t[kLayerNorm ? 3 : 2] = {};
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float c = v[i] - mean, g = d[i] * s[i];
      t[0] += c * c;
      t[1] += g * c;
      if constexpr (kLayerNorm) t[2] += g;
    }
    sum(t);
    const float r = rsqrtf(t[0] * inv_h + a.eps);
    const float gx = t[1] * r * inv_h;                   // mean(g xhat)
    float gm = 0.f;  // mean(g)
    if constexpr (kLayerNorm) gm = t[2] * inv_h;
    if (active) {
      float dx[V];
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float xhat = (v[i] - mean) * r;
        dx[i] = r * (d[i] * s[i] - gm - xhat * gx);
        ds[i] += d[i] * xhat;
        db[i] += d[i];
      }
      StoreRow(static_cast<T*>(a.out), row, a.h, col, dx);
    }
  }
  if (!active) return;
  const int64_t at = static_cast<int64_t>(blockIdx.x) * a.h + col;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    if (a.dscale != nullptr) a.dscale[at + i] = ds[i];
    if (a.dbias != nullptr) a.dbias[at + i] = db[i];
  }
}

template <typename T>
ffi::Error Launch(bool backward, bool layernorm, int blocks, const NormArgs& a, cudaStream_t stream) {
  const int threads = RowNormThreads(a.h, sizeof(T));
  if (backward) {
    if (layernorm) {
      RowNormBackward<T, true><<<blocks, threads, 0, stream>>>(a);
    } else {
      RowNormBackward<T, false><<<blocks, threads, 0, stream>>>(a);
    }
  } else if (layernorm) {
    RowNormForward<T, true><<<blocks, threads, 0, stream>>>(a);
  } else {
    RowNormForward<T, false><<<blocks, threads, 0, stream>>>(a);
  }
  return CudaStatus(cudaGetLastError(), backward ? "launch of RowNormBackward" : "launch of RowNormForward");
}

ffi::Error Dispatch(ffi::DataType dtype, bool backward, bool layernorm, int blocks, const NormArgs& a,
                    cudaStream_t stream) {
  switch (dtype) {
    case ffi::DataType::BF16:
      return Launch<__nv_bfloat16>(backward, layernorm, blocks, a, stream);
    case ffi::DataType::F16:
      return Launch<__half>(backward, layernorm, blocks, a, stream);
    case ffi::DataType::F32:
      return Launch<float>(backward, layernorm, blocks, a, stream);
    default:
      return ffi::Error::InvalidArgument("te_async row norm: x must be bfloat16, float16 or float32");
  }
}

ffi::Error Bad(const std::string& why) { return ffi::Error::InvalidArgument("te_async row norm: " + why); }

// x [M, H] and the optional [H] or [0] (none) float32 vectors; the rows and H, or an error.
ffi::Error CheckRows(const ffi::AnyBuffer& x, std::initializer_list<const ffi::Buffer<ffi::F32>*> vectors,
                     int64_t& rows, int& h) {
  const auto d = x.dimensions();
  if (d.size() != 2) return Bad("x must be [rows, H]");
  rows = d[0];
  h = static_cast<int>(d[1]);
  const size_t elem = ffi::ByteWidth(x.element_type());
  if (!RowNormApplies(h, elem)) {
    return Bad("H = " + std::to_string(d[1]) + " is not a multiple of " + std::to_string(16 / elem) +
               " up to " + std::to_string(kRowNormMaxThreads * 16 / elem));
  }
  for (const auto* v : vectors) {
    const auto vd = v->dimensions();
    if (vd.size() != 1 || (vd[0] != 0 && vd[0] != d[1])) return Bad("scale and bias must be [H] or [0] (none)");
  }
  return ffi::Error::Success();
}

const float* OrNull(const ffi::Buffer<ffi::F32>& v) { return v.element_count() == 0 ? nullptr : v.typed_data(); }

ffi::Error Poison(std::initializer_list<std::pair<void*, size_t>> outputs, cudaStream_t stream) {
  if (!PoisonOutputs()) return ffi::Error::Success();  // every element is written: poison shows one that is not
  for (auto [p, bytes] : outputs) TE_ASYNC_CUDA(cudaMemsetAsync(p, 0xff, bytes, stream));
  return ffi::Error::Success();
}

ffi::Error RowNormForwardFfi(cudaStream_t stream, ffi::AnyBuffer x, ffi::Buffer<ffi::F32> scale,
                             ffi::Buffer<ffi::F32> bias, ffi::Result<ffi::AnyBuffer> y, bool layernorm, float eps,
                             int64_t blocks) {
  int64_t rows = 0;
  int h = 0;
  TE_ASYNC_RETURN_IF_ERROR(CheckRows(x, {&scale, &bias}, rows, h));
  if (y->element_type() != x.element_type() || y->dimensions().size() != 2 || y->dimensions()[0] != rows ||
      y->dimensions()[1] != h) {
    return Bad("y must be x's shape and dtype");
  }
  if (blocks < 1) return Bad("blocks must be positive");
  TE_ASYNC_RETURN_IF_ERROR(Poison({{y->untyped_data(), y->size_bytes()}}, stream));
  if (rows == 0) return ffi::Error::Success();
  NormArgs a{x.untyped_data(), nullptr, OrNull(scale), OrNull(bias), y->untyped_data(), nullptr, nullptr,
             rows, h, eps};
  return Dispatch(x.element_type(), false, layernorm, static_cast<int>(blocks), a, stream);
}

ffi::Error RowNormBackwardFfi(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer dy, ffi::Buffer<ffi::F32> scale,
                              ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::Buffer<ffi::F32>> dscale,
                              ffi::Result<ffi::Buffer<ffi::F32>> dbias, bool layernorm, float eps) {
  int64_t rows = 0;
  int h = 0;
  TE_ASYNC_RETURN_IF_ERROR(CheckRows(x, {&scale}, rows, h));
  const auto same = [&](const auto& b) {
    return b.element_type() == x.element_type() && b.dimensions().size() == 2 && b.dimensions()[0] == rows &&
           b.dimensions()[1] == h;
  };
  if (!same(dy) || !same(*dx)) return Bad("dy and dx must be x's shape and dtype");
  // The blocks' partial column sums: [blocks, H], or [0, H] where the caller needs none.
  const auto ds = dscale->dimensions(), db = dbias->dimensions();
  if (ds.size() != 2 || db.size() != 2 || ds[1] != h || db[1] != h) return Bad("dscale and dbias must be [blocks, H]");
  const int64_t blocks = ds[0] > db[0] ? ds[0] : db[0];
  if (blocks < 1 || (ds[0] != 0 && ds[0] != blocks) || (db[0] != 0 && db[0] != blocks)) {
    return Bad("dscale and dbias must have the same number of blocks (or 0), at least one");
  }
  TE_ASYNC_RETURN_IF_ERROR(Poison({{dx->untyped_data(), dx->size_bytes()},
                                   {dscale->untyped_data(), dscale->size_bytes()},
                                   {dbias->untyped_data(), dbias->size_bytes()}},
                                  stream));
  NormArgs a{x.untyped_data(), dy.untyped_data(), OrNull(scale), nullptr, dx->untyped_data(),
             ds[0] != 0 ? dscale->typed_data() : nullptr, db[0] != 0 ? dbias->typed_data() : nullptr, rows, h, eps};
  return Dispatch(x.element_type(), true, layernorm, static_cast<int>(blocks), a, stream);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kRowNormForwardCuda, RowNormForwardFfi,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("layernorm")
                                  .Attr<float>("eps")
                                  .Attr<int64_t>("blocks"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(kRowNormBackwardCuda, RowNormBackwardFfi,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("layernorm")
                                  .Attr<float>("eps"),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace te_async
