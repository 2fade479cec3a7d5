// Why SlicedProductKernel lost on gqa_token_block's kernel 0 (docs/results/2026-12-07-h100-gqa-block-products):
// the block's two products alone at Qwen3-30B-A3B's shapes, B=1, each by ProductKernel and by
// SlicedProductKernel at 1 to 8 slices (needs token_product.cuh with oproj_streamed.patch applied):
//   kernel 0: RMSNorm(x [2048]) . w_in [2048, 5120]      o_proj: heads [4096] . wo [4096, 2048] + x
// Per form: GPU time of one launch (cudaEvents around it, each after a 256 MB write that evicts the
// L2; median of 50), the clusters of that size resident at once (cudaOccupancyMaxActiveClusters) against
// the clusters the grid has, and the largest difference from ProductKernel's output.
// Build: nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -Icsrc -I<jax.ffi.include_dir()> <this> -o probe
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/token_product.cuh"

namespace tp = te_async::token_product;
using bf16 = __nv_bfloat16;

#define CHECK(x)                                                                    \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

bf16* Random(size_t n, float scale, unsigned seed) {
  std::vector<bf16> h(n);
  srand(seed);
  for (auto& v : h) v = __float2bfloat16(scale * (2.f * rand() / RAND_MAX - 1.f));
  bf16* d = nullptr;
  CHECK(cudaMalloc(&d, n * sizeof(bf16)));
  CHECK(cudaMemcpy(d, h.data(), n * sizeof(bf16), cudaMemcpyHostToDevice));
  return d;
}

std::vector<float> Read(const bf16* d, size_t n) {
  std::vector<bf16> h(n);
  CHECK(cudaMemcpy(h.data(), d, n * sizeof(bf16), cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = __bfloat162float(h[i]);
  return f;
}

// Median GPU microseconds of `launch` over 50 runs, each after the L2 is evicted.
template <typename Launch>
float Time(Launch&& launch, char* flush, size_t flush_bytes) {
  cudaEvent_t start, end;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&end));
  std::vector<float> us;
  for (int i = 0; i < 53; ++i) {
    CHECK(cudaMemsetAsync(flush, i, flush_bytes));
    CHECK(cudaEventRecord(start));
    launch();
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(end));
    CHECK(cudaEventSynchronize(end));
    float ms = 0.f;
    CHECK(cudaEventElapsedTime(&ms, start, end));
    if (i >= 3) us.push_back(1000.f * ms);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

template <int kMaxHidden>
void Probe(const char* name, const tp::ProductArgs& args, void (*product)(tp::ProductArgs), int columns, int threads,
           char* flush, size_t flush_bytes, int sms) {
  const size_t outputs = static_cast<size_t>(args.batch) * args.cols;
  const float base = Time([&] { product<<<dim3(args.cols / columns, 1), threads>>>(args); }, flush, flush_bytes);
  const std::vector<float> reference = Read(args.out, outputs);
  std::printf("%s ProductKernel<%d>: %.1f us (%d blocks)\n", name, columns, base, args.cols / columns);
  const int tiles = args.cols / tp::kSliceColumns;
  for (int want = 1; want <= tp::kMaxSlices; ++want) {
    const int slice_rows = (args.rows + want * tp::kSliceGroups - 1) / (want * tp::kSliceGroups) * tp::kSliceGroups;
    const int slices = (args.rows + slice_rows - 1) / slice_rows;
    if (slices != want) continue;
    const auto kernel = tp::SlicedProductKernel<kMaxHidden, 1>;
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t config = te_async::ClusterLaunchConfig(slices, tp::kSliceThreads, slices, nullptr, attr);
    config.numAttrs = 1;
    int resident = 0;
    CHECK(cudaOccupancyMaxActiveClusters(&resident, kernel, &config));
    const float us = Time(
        [&] {
          CHECK(te_async::LaunchDependentClusters(kernel, dim3(slices, tiles, 1), dim3(tp::kSliceThreads), 0, nullptr,
                                                  false, slices, args, slice_rows));
        },
        flush, flush_bytes);
    const std::vector<float> got = Read(args.out, outputs);
    float diff = 0.f;
    for (size_t i = 0; i < outputs; ++i) diff = std::max(diff, std::fabs(got[i] - reference[i]));
    std::printf("%s SlicedProductKernel, %d slices of %d rows: %.1f us (%d clusters, %d resident, %d SMs), "
                "max |diff| %.3g\n",
                name, slices, slice_rows, us, tiles, resident, sms, diff);
  }
}

int main() {
  constexpr int kHidden = 2048, kWidth = 5120, kHeads = 4096;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t flush_bytes = size_t{256} << 20;
  char* flush = nullptr;
  CHECK(cudaMalloc(&flush, flush_bytes));
  bf16* x = Random(kHidden, 1.f, 1);
  bf16* norm = Random(kHidden, 0.2f, 2);
  bf16* w_in = Random(size_t{kHidden} * kWidth, 0.05f, 3);
  bf16* heads = Random(kHeads, 1.f, 4);
  bf16* wo = Random(size_t{kHeads} * kHidden, 0.02f, 5);
  bf16 *projected = nullptr, *out = nullptr;
  CHECK(cudaMalloc(&projected, kWidth * sizeof(bf16)));
  CHECK(cudaMalloc(&out, kHidden * sizeof(bf16)));
  const tp::ProductArgs input{x, nullptr, norm, w_in, nullptr, projected, 1, kHidden, kWidth, 1e-6f};
  const tp::ProductArgs output{heads, nullptr, nullptr, wo, x, out, 1, kHeads, kHidden, 0.f};
  Probe<kHidden>("kernel 0 (w_in, 21 MB)", input, tp::ProductKernel<32, 512, kHidden, 1>, 32, 512, flush, flush_bytes,
                 sms);
  Probe<kHeads>("o_proj (16.8 MB)", output, tp::ProductKernel<16, 256, kHeads, 1>, 16, 256, flush, flush_bytes, sms);
  return 0;
}
