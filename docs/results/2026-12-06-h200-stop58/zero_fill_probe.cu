// Can a weight gradient's zeros be written beside a GEMM that holds every SM? A copy-engine
// memset (or a device-to-device copy from a zero buffer) needs no SM; a kernel fill does.
// busy(): two blocks of 1024 threads per SM, which fills every SM's thread slots as the CUTLASS
// GEMM fills its registers, FMAs with no memory traffic, about as long as the skewed fc1 wgrad's GEMM. Each case: event-timed, median of 15, on a stream and captured in
// a CUDA graph (the FFI call runs inside XLA's graph). nvcc -O3 -arch=sm_90a zero_fill_probe.cu
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  std::printf("%s failed: %s\n", #x, cudaGetErrorString(e)); std::exit(1); } } while (0)

__global__ void busy(float* out, int iters) {
  extern __shared__ float pad[];
  float a = threadIdx.x, b = 1.0001f;
  for (int i = 0; i < iters; ++i) a = a * b + 0.5f;
  if (a == -1.0f) { pad[threadIdx.x] = a; out[0] = pad[threadIdx.x ^ 1]; }
}

__global__ void fill(int4* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = make_int4(0, 0, 0, 0);
}

enum Zero { kNone, kMemset, kCopy, kKernel };
const char* kName[] = {"none", "memset", "d2d copy", "fill kernel"};

struct Setup { cudaStream_t s0, s1; cudaEvent_t fork, join; float* out; void* z; void* src; size_t bytes; int sms, iters; };

// The work of one case on s0 (busy) and s1 (zeros), s1 forked from and joined to s0.
void enqueue(const Setup& s, bool with_busy, Zero zero) {
  CHECK(cudaEventRecord(s.fork, s.s0));
  CHECK(cudaStreamWaitEvent(s.s1, s.fork, 0));
  if (zero == kMemset) CHECK(cudaMemsetAsync(s.z, 0, s.bytes, s.s1));
  if (zero == kCopy) CHECK(cudaMemcpyAsync(s.z, s.src, s.bytes, cudaMemcpyDeviceToDevice, s.s1));
  if (zero == kKernel) { fill<<<s.sms * 4, 512, 0, s.s1>>>(static_cast<int4*>(s.z), s.bytes / 16); CHECK(cudaGetLastError()); }
  if (with_busy) { busy<<<2 * s.sms, 1024, 100 * 1024, s.s0>>>(s.out, s.iters); CHECK(cudaGetLastError()); }
  CHECK(cudaEventRecord(s.join, s.s1));
  CHECK(cudaStreamWaitEvent(s.s0, s.join, 0));
}

float median_us(const Setup& s, bool with_busy, Zero zero, bool graph) {
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s.s0, cudaStreamCaptureModeThreadLocal));
    enqueue(s, with_busy, zero);
    CHECK(cudaStreamEndCapture(s.s0, &g));
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    CHECK(cudaGraphDestroy(g));
  }
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a)); CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < 17; ++r) {
    CHECK(cudaEventRecord(a, s.s0));
    if (graph) CHECK(cudaGraphLaunch(exec, s.s0)); else enqueue(s, with_busy, zero);
    CHECK(cudaEventRecord(b, s.s0));
    CHECK(cudaEventSynchronize(b));
    float ms; CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r >= 2) t.push_back(ms * 1000);
  }
  if (exec) CHECK(cudaGraphExecDestroy(exec));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  Setup s{};
  s.bytes = size_t(argc > 1 ? std::atof(argv[1]) : 162.0) * 1000 * 1000 / 16 * 16;
  s.iters = argc > 2 ? std::atoi(argv[2]) : 200000;
  CHECK(cudaDeviceGetAttribute(&s.sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaFuncSetAttribute(busy, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024));
  CHECK(cudaStreamCreateWithFlags(&s.s0, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&s.s1, cudaStreamNonBlocking));
  CHECK(cudaEventCreateWithFlags(&s.fork, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&s.join, cudaEventDisableTiming));
  CHECK(cudaMalloc(&s.out, 64));
  CHECK(cudaMalloc(&s.z, s.bytes));
  CHECK(cudaMalloc(&s.src, s.bytes));
  CHECK(cudaMemset(s.src, 0, s.bytes));
  std::printf("%d SMs, %.1f MB of zeros, busy kernel %d iterations\n", s.sms, s.bytes / 1e6, s.iters);
  for (bool graph : {false, true}) {
    float alone = median_us(s, true, kNone, graph);
    std::printf("%s: busy kernel alone %.1f us\n", graph ? "graph" : "stream", alone);
    for (Zero z : {kMemset, kCopy, kKernel}) {
      float zero = median_us(s, false, z, graph), both = median_us(s, true, z, graph);
      std::printf("%s: %-11s alone %7.1f us (%.2f TB/s); beside the busy kernel %7.1f us: %+6.1f us over the busy kernel, "
                  "%.0f %% of the zeros' time hidden\n", graph ? "graph" : "stream", kName[z], zero, s.bytes / zero / 1e6,
                  both, both - alone, 100.0 * (alone + zero - both) / zero);
    }
  }
  // Whether the memset's zeros landed (the copy's and the fill's are the same bytes).
  std::vector<int> host(1 << 20, 1);
  CHECK(cudaMemset(s.z, 0xff, s.bytes));
  CHECK(cudaMemsetAsync(s.z, 0, s.bytes, s.s0));
  CHECK(cudaMemcpyAsync(host.data(), static_cast<char*>(s.z) + s.bytes - host.size() * 4, host.size() * 4,
                        cudaMemcpyDeviceToHost, s.s0));
  CHECK(cudaStreamSynchronize(s.s0));
  std::printf("memset check: %s\n", std::all_of(host.begin(), host.end(), [](int v) { return v == 0; }) ? "zeros" : "WRONG");
  return 0;
}
