// Does a bulk L2 prefetch of a layer's shared experts (34.6 MB) survive other traffic until the
// experts' kernel reads them? Times the read (token_ffn's pattern: fc1 column slices, fc2 rows)
// cold and after the prefetch with Y MB of other reads in between.
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s line %d\n", cudaGetErrorString(e), __LINE__); return 1; } } while (0)
constexpr int H = 2048, FS = 2816, kThreads = 256, kU = 8, kUnits = 16;
constexpr size_t kW1 = (size_t)H * 2 * FS, kW2 = (size_t)FS * H, kLayer = kW1 + kW2;  // elements
__device__ __forceinline__ uint4 LoadStream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
template <bool kLast>
__global__ void Prefetch(const char* p, size_t bytes) {  // 64 KB pieces, one a thread
  const size_t piece = 65536, n = (bytes + piece - 1) / piece;
  uint64_t pol;
  if (kLast) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const unsigned sz = (unsigned)min(piece, bytes - i * piece);
    if (kLast) asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" :: "l"(p + i * piece), "r"(sz), "l"(pol) : "memory");
    else asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(p + i * piece), "r"(sz) : "memory");
  }
}
__global__ void Stream(const uint4* p, size_t n, float* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) { uint4 q = LoadStream(p + i); acc ^= q.x ^ q.w; }
  if (acc == 0x1234567u) sink[0] = 1;
}
__global__ void __launch_bounds__(kThreads, 2) Consume(const uint16_t* w, float* sink) {  // block b: units [16b, 16b+16)
  const int s = blockIdx.x, tid = threadIdx.x;
  const int nvec = 2 * kUnits / 8, groups = kThreads / nvec, v = tid % nvec, g = tid / nvec;
  const int col = v < kUnits / 8 ? s * kUnits + 8 * v : FS + s * kUnits + 8 * (v - kUnits / 8);
  unsigned acc = 0;
  for (int r0 = g; r0 < H; r0 += groups * kU) {
    uint4 q[kU];
#pragma unroll
    for (int i = 0; i < kU; ++i) { int r = r0 + i * groups; q[i] = r < H ? LoadStream(w + (long long)r * 2 * FS + col) : make_uint4(0,0,0,0); }
#pragma unroll
    for (int i = 0; i < kU; ++i) acc ^= q[i].x ^ q[i].w;
  }
  __syncthreads();
  const uint4* w2 = reinterpret_cast<const uint4*>(w + kW1 + (size_t)s * kUnits * H);
  const int n2 = kUnits * H / 8;
  for (int i0 = tid; i0 < n2; i0 += kThreads * kU) {
    uint4 q[kU];
#pragma unroll
    for (int i = 0; i < kU; ++i) q[i] = i0 + i * kThreads < n2 ? LoadStream(w2 + i0 + i * kThreads) : make_uint4(0,0,0,0);
#pragma unroll
    for (int i = 0; i < kU; ++i) acc ^= q[i].x ^ q[i].w;
  }
  if (acc == 0x1234567u) sink[1] = 1;
}
int main() {
  const int layers = 16;
  const size_t other = 64ull << 20;  // bytes of other traffic per layer available
  uint16_t* w; char* o; float* sink;
  CK(cudaMalloc(&w, layers * kLayer * 2)); CK(cudaMalloc(&o, layers * other)); CK(cudaMalloc(&sink, 64));
  CK(cudaMemset(w, 1, layers * kLayer * 2)); CK(cudaMemset(o, 2, layers * other));
  int l2; CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0)); printf("L2 %d MB, layer %.1f MB\n", l2 >> 20, kLayer * 2 / 1e6);
  cudaEvent_t a, b, c; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b)); CK(cudaEventCreate(&c));
  const char* names[] = {"cold", "prefetch", "prefetch evict_last"};
  for (int mode = 0; mode < 3; ++mode) for (int ymb : {0, 8, 16, 24, 32}) {
    std::vector<float> tc, tp;
    for (int rep = 0; rep < 12; ++rep) for (int l = 0; l < layers; ++l) {
      const uint16_t* wl = w + l * kLayer;
      CK(cudaEventRecord(a));
      if (mode == 1) Prefetch<false><<<16, 128>>>(reinterpret_cast<const char*>(wl), kLayer * 2);
      if (mode == 2) Prefetch<true><<<16, 128>>>(reinterpret_cast<const char*>(wl), kLayer * 2);
      if (ymb) Stream<<<264, 256>>>(reinterpret_cast<const uint4*>(o + l * other), (size_t)ymb * (1 << 20) / 16, sink);
      CK(cudaEventRecord(b));
      Consume<<<FS / kUnits, kThreads>>>(wl, sink);
      CK(cudaEventRecord(c)); CK(cudaEventSynchronize(c)); CK(cudaGetLastError());
      float m1, m2; CK(cudaEventElapsedTime(&m1, a, b)); CK(cudaEventElapsedTime(&m2, b, c));
      if (rep > 1) tp.push_back(m1 * 1e3f), tc.push_back(m2 * 1e3f);
    }
    std::sort(tc.begin(), tc.end()); std::sort(tp.begin(), tp.end());
    printf("%-20s other %2d MB: before %.2f us, consume median %.2f us (p10 %.2f) -> %.2f TB/s\n", names[mode], ymb, tp[tp.size() / 2],
           tc[tc.size() / 2], tc[tc.size() / 10], kLayer * 2 / tc[tc.size() / 2] / 1e6);
  }
  return 0;
}
