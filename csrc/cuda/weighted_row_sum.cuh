// The weight-streaming reduction of the one-token decode kernels (token_ffn.cu, mla_token.cu): a
// block multiplies a vector by a slab of a weight matrix read once from HBM, 16 bytes a load, kUnroll
// loads in flight per thread, in a fixed order (deterministic).
#pragma once

#include "cuda/vector_loads.cuh"

namespace te_async {

constexpr int kUnroll = 8;  // loads in flight per thread

// For each 16-byte column vector c < nvec of w (V = 16 / sizeof(W) elements, at element offset
// column(c) in a row): the sum over r < rows of coef[r] * w[r * ld + column(c) + j], j < V, in f32,
// handed to store(c * V + j, sum). Threads own one vector and every G-th row; the G partial sums
// are added in group order. scratch: kBlock * V floats.
template <typename W, int kBlock, typename Column, typename Store>
__device__ __forceinline__ void WeightedRowSum(const W* __restrict__ w, long long ld, int rows,
                                               const float* coef, int nvec, Column column, float* scratch,
                                               Store store) {
  constexpr int V = Elem<W>::kVec;
  const int tid = threadIdx.x;
  for (int base = 0; base < nvec; base += kBlock) {
    const int width = min(kBlock, nvec - base);
    const int groups = kBlock / width;
    const int v = tid % width, g = tid / width;
    if (g < groups) {
      float acc[V] = {};
      const W* p = w + column(base + v);
      for (int r0 = g; r0 < rows; r0 += groups * kUnroll) {
        uint4 q[kUnroll];
#pragma unroll
        for (int i = 0; i < kUnroll; ++i) {
          const int r = r0 + i * groups;
          q[i] = r < rows ? LoadStream(p + r * ld) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int i = 0; i < kUnroll; ++i) {
          const int r = r0 + i * groups;
          if (r < rows) {
            float f[V];
            Unpack<W>(q[i], f);
            const float c = coef[r];
#pragma unroll
            for (int j = 0; j < V; ++j) acc[j] = fmaf(c, f[j], acc[j]);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < V; ++j) scratch[(g * width + v) * V + j] = acc[j];
    }
    __syncthreads();
    for (int c = tid; c < width * V; c += kBlock) {
      float s = 0.f;
      for (int gg = 0; gg < groups; ++gg) s += scratch[gg * width * V + c];
      store(base * V + c, s);
    }
    __syncthreads();
  }
}

}  // namespace te_async
