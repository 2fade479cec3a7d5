"""Phase stamps of moe_routing.cu's RouteKernel (bench decode's routing from T=2 up): writes
route_kernel_phases.cu, the kernel's file with %globaltimer stamps by thread 0 after each of its
barriers (and one barrier more at the end, so that the last stamp sees every warp done), plus a
harness that runs it on random logits at T = 1, 8, 64 with DeepSeek-V2-Lite's routing (64
experts, top-6, softmax, no renormalisation) and prints the median of each phase and the
event-timed launch. Usage: route_kernel_phases.py csrc/cuda/moe_routing.cu; then
nvcc -O3 -std=c++17 -arch=sm_90a -I csrc -I <jaxlib>/include route_kernel_phases.cu."""
import sys

text = open(sys.argv[1]).read()
stamp = ('__device__ unsigned long long g_stamps[8];\n'
         '#define STAMP(k) do { if (threadIdx.x == 0) { unsigned long long t_; '
         'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_)); g_stamps[k] = t_; } } while (0)\n')
kernel = text.index("__global__ void __launch_bounds__(kRouteThreads, 1) RouteKernel(RouteArgs a) {")
end = text.index("// bias: sigmoid's correction bias")
body = text[kernel:end]
body = body.replace("RouteKernel(RouteArgs a) {\n", "RouteKernel(RouteArgs a) {\n  STAMP(0);\n", 1)
parts = body.split("  __syncthreads();\n")
assert len(parts) == 4, len(parts)  # three barriers: counts zeroed, tokens routed, counts scanned
body = "".join(p + f"  __syncthreads();\n  STAMP({i + 1});\n" for i, p in enumerate(parts[:-1])) + parts[-1]
closing = body.rindex("}\n")
body = body[:closing] + "  __syncthreads();\n  STAMP(4);\n" + body[closing:]
harness = r'''
#include <cstdio>
#include <random>
#include <vector>
int main() {
  using namespace te_async;
  const char* phase[] = {"counts zeroed", "tokens routed (softmax, top-k)", "counts scanned", "order written"};
  for (int tokens : {1, 8, 64}) {
    const int experts = 64, k = 6, n = tokens * k;
    std::vector<float> logits(tokens * experts);
    std::mt19937 gen(tokens);
    std::normal_distribution<float> normal;
    for (float& v : logits) v = normal(gen);
    float *d_logits, *w; int *e, *sizes, *cor, *roc;
    cudaMalloc(&d_logits, logits.size() * 4); cudaMalloc(&w, n * 4); cudaMalloc(&e, n * 4);
    cudaMalloc(&sizes, experts * 4); cudaMalloc(&cor, n * 4); cudaMalloc(&roc, n * 4);
    cudaMemcpy(d_logits, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice);
    RouteArgs a{d_logits, tokens, TopKOptions{experts, k, 1, 1, false, 1.0f}, w, e, sizes, cor, roc};
    cudaEvent_t t0, t1; cudaEventCreate(&t0); cudaEventCreate(&t1);
    std::vector<std::vector<double>> d(5);
    for (int r = 0; r < 60; ++r) {
      cudaEventRecord(t0);
      RouteKernel<<<1, kRouteThreads>>>(a);
      cudaEventRecord(t1);
      cudaEventSynchronize(t1);
      float ms; cudaEventElapsedTime(&ms, t0, t1);
      unsigned long long s[8];
      cudaMemcpyFromSymbol(s, g_stamps, sizeof(s));
      if (r < 10) continue;
      for (int i = 0; i < 4; ++i) d[i].push_back((s[i + 1] - s[i]) / 1e3);
      d[4].push_back(ms * 1e3);
    }
    auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
    std::printf("T=%d (%d choices): launch %.2f us (events)", tokens, n, med(d[4]));
    for (int i = 0; i < 4; ++i) std::printf("; %s %.2f", phase[i], med(d[i]));
    std::printf(" us\n");
    std::printf("  check: error %s\n", cudaGetErrorString(cudaGetLastError()));
  }
  return 0;
}
'''
head = text[:kernel]
head = head.replace("namespace ffi = xla::ffi;\n", "namespace ffi = xla::ffi;\n" + stamp, 1)
open("route_kernel_phases.cu", "w").write(head + body + "}  // namespace\n}  // namespace te_async\n"
                                          + "#include <algorithm>\n" + harness)
