// token_ffn's fc1 loop (column slices of [H, 2F], f32 FMAs with x from shared memory) under three
// load schemes: 8 loads then their FMAs (main), the next 8 loaded before this 8's FMAs (registers),
// a cp.async ring of S stages of 8 vectors a thread (shared memory). One wave, 26 layers' weights.
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s line %d\n", cudaGetErrorString(e), __LINE__); return 1; } } while (0)
constexpr int H = 2048, F = 1408, E = 6, kThreads = 256, kU = 8;
__device__ __forceinline__ uint4 LoadStream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ void Fma(const uint4& q, float c, float* acc) {
  const unsigned w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    acc[2 * j] = fmaf(c, __uint_as_float(w[j] << 16), acc[2 * j]);
    acc[2 * j + 1] = fmaf(c, __uint_as_float(w[j] & 0xffff0000u), acc[2 * j + 1]);
  }
}
template <int kMode, int kStages>
__global__ void __launch_bounds__(kThreads, 2) Probe(const uint16_t* w, int u, float* sink) {
  extern __shared__ float smem[];
  float* xs = smem;  // [H]
  const int bpe = F / u, e = blockIdx.x / bpe, s = blockIdx.x % bpe, tid = threadIdx.x;
  for (int i = tid; i < H; i += kThreads) xs[i] = 1.f + i * 1e-3f;
  __syncthreads();
  const uint16_t* m = w + (long long)e * H * 2 * F;
  const int nvec = 2 * u / 8, groups = kThreads / nvec, v = tid % nvec, g = tid / nvec;
  float acc[8] = {};
  if (g < groups) {
    const int col = v < u / 8 ? s * u + 8 * v : F + s * u + 8 * (v - u / 8);
    const uint16_t* p = m + col;
    const int steps = (H - g + groups * kU - 1) / (groups * kU);  // batches of kU rows r = g + groups * (b * kU + i)
    auto row = [&](int b, int i) { return g + groups * (b * kU + i); };
    if (kMode == 0) {
      for (int b = 0; b < steps; ++b) {
        uint4 q[kU];
#pragma unroll
        for (int i = 0; i < kU; ++i) { int r = row(b, i); q[i] = r < H ? LoadStream(p + (long long)r * 2 * F) : make_uint4(0,0,0,0); }
#pragma unroll
        for (int i = 0; i < kU; ++i) { int r = row(b, i); if (r < H) Fma(q[i], xs[r], acc); }
      }
    } else if (kMode == 1) {
      uint4 q[kU], n[kU];
#pragma unroll
      for (int i = 0; i < kU; ++i) { int r = row(0, i); q[i] = r < H ? LoadStream(p + (long long)r * 2 * F) : make_uint4(0,0,0,0); }
      for (int b = 0; b < steps; ++b) {
#pragma unroll
        for (int i = 0; i < kU; ++i) { int r = row(b + 1, i); n[i] = r < H ? LoadStream(p + (long long)r * 2 * F) : make_uint4(0,0,0,0); }
#pragma unroll
        for (int i = 0; i < kU; ++i) { int r = row(b, i); if (r < H) Fma(q[i], xs[r], acc); }
#pragma unroll
        for (int i = 0; i < kU; ++i) q[i] = n[i];
      }
    } else {
      uint4* ring = reinterpret_cast<uint4*>(xs + H);  // [kStages][kU][kThreads]
      auto issue = [&](int b) {
#pragma unroll
        for (int i = 0; i < kU; ++i) {
          int r = row(b, i);
          unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(ring + ((b % kStages) * kU + i) * kThreads + tid));
          if (r < H) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(p + (long long)r * 2 * F));
        }
        asm volatile("cp.async.commit_group;");
      };
#pragma unroll
      for (int b = 0; b < kStages - 1; ++b) issue(b);
      for (int b = 0; b < steps; ++b) {
        issue(b + kStages - 1);
        asm volatile("cp.async.wait_group %0;" :: "n"(kStages - 1));
#pragma unroll
        for (int i = 0; i < kU; ++i) { int r = row(b, i); if (r < H) Fma(ring[((b % kStages) * kU + i) * kThreads + tid], xs[r], acc); }
      }
    }
  }
  float t = 0; for (int j = 0; j < 8; ++j) t += acc[j];
  if (t == 12345.f) sink[blockIdx.x] = t;
}
template <int kMode, int kStages>
int Run(const char* name, uint16_t* w, size_t layer_elems, int layers, float* sink, cudaEvent_t* ev) {
  for (int u : {32, 48}) {
    const int grid = E * (F / u);
    const size_t sm = sizeof(float) * H + (kMode == 2 ? size_t(kStages) * kU * kThreads * 16 : 0);
    CK(cudaFuncSetAttribute(Probe<kMode, kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    std::vector<float> times;
    for (int rep = 0; rep < 20; ++rep) {
      for (int l = 0; l < layers; ++l) { CK(cudaEventRecord(ev[l])); Probe<kMode, kStages><<<grid, kThreads, sm>>>(w + l * layer_elems, u, sink); }
      CK(cudaEventRecord(ev[layers])); CK(cudaEventSynchronize(ev[layers])); CK(cudaGetLastError());
      for (int l = 0; l < layers; ++l) { float ms; CK(cudaEventElapsedTime(&ms, ev[l], ev[l + 1])); if (rep > 2) times.push_back(ms * 1e3f); }
    }
    std::sort(times.begin(), times.end());
    const double bytes = (double)grid * H * 2 * u * 2;
    int blocks; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, Probe<kMode, kStages>, kThreads, sm));
    printf("%-22s units %2d grid %3d smem %6zu blocks/SM %d: median %.2f us p10 %.2f -> %.2f TB/s\n", name, u, grid, sm, blocks,
           times[times.size() / 2], times[times.size() / 10], bytes / times[times.size() / 2] / 1e6);
  }
  return 0;
}
int main() {
  const int layers = 24;
  const size_t layer_elems = (size_t)E * H * 2 * F;
  uint16_t* w; float* sink;
  CK(cudaMalloc(&w, layers * layer_elems * 2)); CK(cudaMalloc(&sink, 4096 * 4));
  CK(cudaMemset(w, 1, layers * layer_elems * 2));
  cudaEvent_t ev[layers + 1];
  for (auto& x : ev) CK(cudaEventCreate(&x));
  for (int k = 0; k < 2; ++k) {
    Run<0, 1>("8 loads then FMAs", w, layer_elems, layers, sink, ev);
    Run<1, 1>("registers, 2 batches", w, layer_elems, layers, sink, ev);
    Run<2, 2>("cp.async 2 stages", w, layer_elems, layers, sink, ev);
    Run<2, 3>("cp.async 3 stages", w, layer_elems, layers, sink, ev);
    Run<2, 4>("cp.async 4 stages", w, layer_elems, layers, sink, ev);
  }
  return 0;
}
