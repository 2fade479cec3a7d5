// How the read rate of small_groups' [G,K,N] decode kernel (SmallGroupsKnKernel) depends on the
// width of the contiguous piece each k-row of a tile is read in. The kernel's threads read a tile
// as 8 threads x 16 bytes = 128 bytes per k-row (bf16: 64 columns); the fc1 swiglu-epilogue trial
// read each k-row as two 64-byte pieces N/2 apart and lost 40 % of fc1's rate. This probe streams
// the same bytes with the kernel's loop shape (256 threads, 2 blocks an SM, U = 8 loads of 16 bytes
// in flight a thread, items = (tile, expert) with the expert fastest, a grid-stride loop) and one
// of four piece layouts, without the GEMM's arithmetic:
//   paired64: 4 threads x 16 B at column c and 4 at c + N/2 (the trial's fc1)
//   w128:     8 threads x 16 B (main's kernel)
//   w256:     16 threads x 16 B
//   w512:     32 threads x 16 B
// Build: nvcc -O3 -std=c++17 -arch=sm_90a stripe_read_probe.cu -o stripe_read_probe
// Output: one line a layout, GB/s of the active experts' bytes (median of 20 timed launches).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

constexpr int kThreads = 256, kU = 8;

// kCx threads a k-row, each 16 bytes (8 bf16); kPaired: the first half of them at column c, the
// second half N/2 further on (a tile then covers kCx * 4 columns of each half).
template <int kCx, bool kPaired>
__global__ void __launch_bounds__(kThreads, 2) StripeRead(const __nv_bfloat16* w, const int* experts, int n_experts,
                                                          int K, int N, float* sink) {
  constexpr int kRows = kThreads / kCx;               // k-rows a block covers per load
  constexpr int kTileCols = kCx * 8;                  // product columns a tile covers
  const int tid = threadIdx.x, cx = tid % kCx, ky = tid / kCx;
  const int tiles = N / kTileCols, items = tiles * n_experts;
  float acc = 0.f;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int tile = item / n_experts, e = experts[item % n_experts];
    int col;
    if constexpr (kPaired) {
      constexpr int kHalf = kCx / 2;
      col = tile * (kTileCols / 2) + (cx % kHalf) * 8 + (cx / kHalf) * (N / 2);
    } else {
      col = tile * kTileCols + cx * 8;
    }
    const __nv_bfloat16* p = w + static_cast<long long>(e) * K * N + static_cast<long long>(ky) * N + col;
    for (int k0 = 0; k0 < K; k0 += kRows * kU) {
      uint4 v[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int k = k0 + u * kRows + ky;
        v[u] = k < K ? __ldg(reinterpret_cast<const uint4*>(p + static_cast<long long>(k0 + u * kRows) * N))
                     : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) acc += __uint_as_float(v[u].x ^ v[u].y ^ v[u].z ^ v[u].w);
    }
  }
  if (acc == 1.2345f) sink[blockIdx.x] = acc;  // keeps the loads; never true for the data below
}

template <int kCx, bool kPaired>
float Measure(const __nv_bfloat16* w, const int* experts, int n_experts, int K, int N, float* sink, int grid) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int rep = 0; rep < 25; ++rep) {
    CHECK(cudaEventRecord(a));
    StripeRead<kCx, kPaired><<<grid, kThreads>>>(w, experts, n_experts, K, N, sink);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float t;
    CHECK(cudaEventElapsedTime(&t, a, b));
    if (rep >= 5) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int main(int argc, char** argv) {
  const int E = 64, K = 2048, N = 2816;                      // DeepSeek-V2-Lite's fc1: [64, 2048, 2 x 1408]
  const int n_active = argc > 1 ? std::atoi(argv[1]) : 34;   // distinct experts at T = 8, top-6 (expected)
  const size_t per = static_cast<size_t>(K) * N;
  __nv_bfloat16* w;
  CHECK(cudaMalloc(&w, E * per * sizeof(__nv_bfloat16)));
  CHECK(cudaMemset(w, 0x11, E * per * sizeof(__nv_bfloat16)));
  std::vector<int> host(n_active);
  for (int i = 0; i < n_active; ++i) host[i] = (i * 37 + 5) % E;  // distinct for n_active <= 64
  int* experts;
  CHECK(cudaMalloc(&experts, n_active * sizeof(int)));
  CHECK(cudaMemcpy(experts, host.data(), n_active * sizeof(int), cudaMemcpyHostToDevice));
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float* sink;
  CHECK(cudaMalloc(&sink, 4 * sms * sizeof(float)));
  const double bytes = static_cast<double>(n_active) * per * sizeof(__nv_bfloat16);
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs, %d active experts of [%d, %d] bf16 (%.1f MB), grid 2 x SMs\n", prop.name, sms, n_active, K,
              N, bytes / 1e6);
  auto report = [&](const char* name, float ms) {
    std::printf("%-9s %8.1f us  %7.0f GB/s\n", name, ms * 1e3, bytes / (ms * 1e-3) / 1e9);
  };
  for (int pass = 0; pass < 2; ++pass) {
    report("paired64", Measure<8, true>(w, experts, n_active, K, N, sink, 2 * sms));
    report("w128", Measure<8, false>(w, experts, n_active, K, N, sink, 2 * sms));
    report("w256", Measure<16, false>(w, experts, n_active, K, N, sink, 2 * sms));
    report("w512", Measure<32, false>(w, experts, n_active, K, N, sink, 2 * sms));
  }
  return 0;
}
