// Harness of route_phases.py (see there). The router's shape from -DPROBE_E, -DPROBE_K, -DPROBE_SLOTS (the top-k
// form's slots, E <= 32 slots), -DPROBE_RENORM; H 2048, bf16. Defaults: DeepSeek-V2-Lite's (E 64, top-6, no
// renormalisation); Qwen3-30B-A3B: -DPROBE_E=128 -DPROBE_K=8 -DPROBE_SLOTS=4 -DPROBE_RENORM=true.
#ifndef PROBE_E
#define PROBE_E 64
#define PROBE_K 6
#define PROBE_SLOTS 2
#define PROBE_RENORM false
#endif
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cooperative_groups.h>
#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <vector>
#include "cuda/float_convert.cuh"
#include "cuda/programmatic_launch.cuh"
#include "cuda/route_top_k.cuh"
#include "cuda/vector_loads.cuh"
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s line %d\n", cudaGetErrorString(e_), __LINE__); return 1; } } while (0)
__device__ unsigned long long* g_ns;   // [block][16]
__device__ long long* g_clk;           // [block][16]
__device__ __forceinline__ unsigned long long GlobalNs() { unsigned long long t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }
#define STAMP(k) do { if (threadIdx.x == 0) { g_ns[blockIdx.x * 16 + (k)] = GlobalNs(); g_clk[blockIdx.x * 16 + (k)] = clock64(); } } while (0)
namespace te_async {
namespace {
//@BODY
}  // namespace
}  // namespace te_async
using namespace te_async;
__global__ void Flush(uint4* p, size_t n, unsigned long long* end) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = make_uint4(i, 1, 2, 3);
  __syncthreads();
  if (threadIdx.x == 0) end[blockIdx.x] = GlobalNs();
}
__global__ void ReadFlush(const uint4* p, size_t n, int evict_first, unsigned long long* end, int* sink) {
  unsigned acc = 0; uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint4 v;
    if (evict_first) asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p + i), "l"(pol));
    else asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p + i));
    acc ^= v.x ^ v.w;
  }
  if (acc == 0x1234567u) sink[0] = 1;
  __syncthreads();
  if (threadIdx.x == 0) end[blockIdx.x] = GlobalNs();
}
__global__ void Rewrite(__nv_bfloat16* dst, const __nv_bfloat16* src, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}
__global__ void Dependent(const int* experts, unsigned long long* entry, unsigned long long* waited, int* sink) {
  if (threadIdx.x == 0) entry[blockIdx.x] = GlobalNs();
  WaitForPrevious();
  if (threadIdx.x == 0) { waited[blockIdx.x] = GlobalNs(); sink[blockIdx.x] = experts[blockIdx.x % PROBE_K]; }
}
int main(int argc, char** argv) {
  const int mode = argc > 1 ? atoi(argv[1]) : 0;  // 0 write flush, 1 read flush, 2 read flush evict_first, 3 read flush + code warmed
  const int H = 2048, E = PROBE_E, K = PROBE_K, kDep = 239, kFlushBlocks = 264, kIters = 40;
  std::vector<__nv_bfloat16> hx(H), hs(H), hr((size_t)H * E);
  uint32_t s = 12345; auto rnd = [&] { s = s * 1664525u + 1013904223u; return ((s >> 8) & 0xffff) / 65536.f - 0.5f; };
  for (auto& v : hx) v = __float2bfloat16(rnd() * 4); for (auto& v : hs) v = __float2bfloat16(1 + rnd() * 0.2f);
  for (auto& v : hr) v = __float2bfloat16(rnd() * 0.1f);
  __nv_bfloat16 *x, *sc, *router; float* w; int *ex, *sink; uint4* flush; unsigned long long *ns, *fend, *dent, *dwait; long long* clk;
  const size_t flush_n = (size_t)192 << 20 >> 4;
  CK(cudaMalloc(&x, H * 2)); CK(cudaMalloc(&sc, H * 2)); CK(cudaMalloc(&router, (size_t)H * E * 2));
  CK(cudaMalloc(&w, 64)); CK(cudaMalloc(&ex, 64)); CK(cudaMalloc(&sink, 4 * kDep)); CK(cudaMalloc(&flush, flush_n * 16));
  CK(cudaMalloc(&ns, 8 * 16 * 8)); CK(cudaMalloc(&clk, 8 * 16 * 8)); CK(cudaMalloc(&fend, 8 * kFlushBlocks));
  CK(cudaMalloc(&dent, 8 * kDep)); CK(cudaMalloc(&dwait, 8 * kDep));
  CK(cudaMemcpy(x, hx.data(), H * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(sc, hs.data(), H * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(router, hr.data(), (size_t)H * E * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpyToSymbol(g_ns, &ns, 8)); CK(cudaMemcpyToSymbol(g_clk, &clk, 8));
  RouteTokenArgs r{};
  r.x = x; r.norm = TokenNorm{sc, false, true, 1e-6f}; r.router_reads_normed = true; r.router = router;
  r.top = TopKOptions{E, K, 1, 1, PROBE_RENORM, 1.f}; r.hidden = H; r.weights = w; r.experts = ex;
  const size_t smem = RouteSharedBytes(H, E);
  __nv_bfloat16 *x2, *router2; float* w2; int* ex2;  // the code-warming launch's own operands
  CK(cudaMalloc(&x2, H * 2)); CK(cudaMalloc(&router2, (size_t)H * E * 2)); CK(cudaMalloc(&w2, 64)); CK(cudaMalloc(&ex2, 64));
  CK(cudaMemcpy(x2, hx.data(), H * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(router2, hr.data(), (size_t)H * E * 2, cudaMemcpyHostToDevice));
  RouteTokenArgs r2 = r; r2.x = x2; r2.router = router2; r2.weights = w2; r2.experts = ex2;
  cudaStream_t st; CK(cudaStreamCreate(&st));
  std::vector<std::vector<double>> ph(16 + 16 + 8);  // rank0 phases, max of other ranks, extra
  for (int it = 0; it < kIters; ++it) {
    CK(cudaMemset(ns, 0, 8 * 16 * 8));
    if (mode == 0) Flush<<<kFlushBlocks, 512, 0, st>>>(flush, flush_n, fend);
    else ReadFlush<<<kFlushBlocks, 512, 0, st>>>(flush, flush_n, mode == 2, fend, sink);
    if (mode == 3) {
      cudaLaunchConfig_t c = {}; c.gridDim = dim3(8); c.blockDim = dim3(256); c.dynamicSmemBytes = smem; c.stream = st;
      cudaLaunchAttribute a; a.id = cudaLaunchAttributeClusterDimension; a.val.clusterDim.x = 8; a.val.clusterDim.y = 1; a.val.clusterDim.z = 1;
      c.attrs = &a; c.numAttrs = 1;
      CK(cudaLaunchKernelEx(&c, RouteTokenKernel<__nv_bfloat16, __nv_bfloat16, TopKForm<PROBE_SLOTS, false, false>>, r2));
    }
    Rewrite<<<8, 256, 0, st>>>(x, x2, H);
    cudaLaunchConfig_t c = {}; c.gridDim = dim3(8); c.blockDim = dim3(256); c.dynamicSmemBytes = smem; c.stream = st;
    cudaLaunchAttribute a; a.id = cudaLaunchAttributeClusterDimension; a.val.clusterDim.x = 8; a.val.clusterDim.y = 1; a.val.clusterDim.z = 1;
    c.attrs = &a; c.numAttrs = 1;
    CK(cudaLaunchKernelEx(&c, RouteTokenKernel<__nv_bfloat16, __nv_bfloat16, TopKForm<PROBE_SLOTS, false, false>>, r));
    CK(LaunchDependent(Dependent, dim3(kDep), dim3(256), 0, st, true, (const int*)ex, dent, dwait, sink));
    CK(cudaStreamSynchronize(st));
    std::vector<unsigned long long> hns(128), hf(kFlushBlocks), he(kDep), hw(kDep); std::vector<long long> hc(128);
    CK(cudaMemcpy(hns.data(), ns, 1024, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hc.data(), clk, 1024, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hf.data(), fend, 8 * kFlushBlocks, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(he.data(), dent, 8 * kDep, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hw.data(), dwait, 8 * kDep, cudaMemcpyDeviceToHost));
    if (it < 5) continue;  // warm-up
    unsigned long long t0 = ~0ull; for (int b = 0; b < 8; ++b) t0 = std::min(t0, hns[b * 16]);
    for (int k = 0; k < 16; ++k) {
      if (hns[k]) ph[k].push_back((double)(hns[k] - t0) / 1000);
      double mx = -1; for (int b = 1; b < 8; ++b) if (hns[b * 16 + k]) mx = std::max(mx, (double)(hns[b * 16 + k] - t0) / 1000);
      if (mx >= 0) ph[16 + k].push_back(mx);
    }
    const unsigned long long fe = *std::max_element(hf.begin(), hf.end());
    ph[32].push_back(((double)t0 - (double)fe) / 1000);
    ph[33].push_back(((double)*std::min_element(he.begin(), he.end()) - t0) / 1000);
    ph[34].push_back(((double)*std::min_element(hw.begin(), hw.end()) - t0) / 1000);
    ph[35].push_back(((double)*std::max_element(hw.begin(), hw.end()) - t0) / 1000);
    ph[36].push_back((double)(hc[9] - hc[0]) / ((double)(hns[9] - hns[0]) + 1e-9));  // rank 0's SM clock, GHz
  }
  auto med = [](std::vector<double> v) { if (v.empty()) return -1.0; std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  const char* names[10] = {"entry", "preloads issued", "x loaded, normed", "GEMV done", "groups in scratch", "cluster wait 1",
                           "slice summed", "rank 0 wait 2", "slices summed", "top-k written"};
  printf("mode %d (0 write flush, 1 read flush, 2 read flush evict_first, 3 read flush + code warmed; x rewritten after it)\n", mode);
  printf("us after the route's first block entry, median of %d (rank 0 | latest other rank)\n", kIters - 5);
  for (int k = 0; k < 10; ++k) printf("  S%d %-20s %7.2f | %7.2f\n", k, names[k], med(ph[k]), med(ph[16 + k]));
  printf("  flush end -> route entry %.2f; dependent first entry %.2f, first wake %.2f, last wake %.2f; rank 0 SM clock %.2f GHz\n",
         med(ph[32]), med(ph[33]), med(ph[34]), med(ph[35]), med(ph[36]));
  std::vector<float> hwt(K); std::vector<int> het(K);
  CK(cudaMemcpy(hwt.data(), w, 4 * K, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(het.data(), ex, 4 * K, cudaMemcpyDeviceToHost));
  printf("  experts"); for (int j = 0; j < K; ++j) printf(" %d:%.5f", het[j], hwt[j]); printf("\n");
  return 0;
}
