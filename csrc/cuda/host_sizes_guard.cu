#include "cuda/host_sizes_guard.h"

#include <cstring>

#include "cuda/cuda_check.h"
#include "grouped_gemm_args.h"

namespace te_async {
namespace {

constexpr int kThreads = 256;

// The host's sizes travel by value (4 KB of kernel parameters; CUDA 12.1+ takes up to 32 KB), so
// the comparison reads what the host used even if the pinned slot is refilled later.
struct GuardArgs {
  int32_t host_sizes[kMaxGroups];
  const int32_t* device_sizes;
  int* mismatch;
  DeviceCounters* counters;
  int groups;
};

__global__ void __launch_bounds__(kThreads) HostSizesGuardKernel(const GuardArgs a) {
  int differs = 0;
  for (int g = threadIdx.x; g < a.groups; g += kThreads) differs |= a.host_sizes[g] != a.device_sizes[g];
  differs = __syncthreads_or(differs);
  if (threadIdx.x == 0) {
    *a.mismatch = differs;
    if (differs) atomicAdd(&a.counters->repaired_reads, 1ull);
  }
}

}  // namespace

xla::ffi::Error LaunchHostSizesGuard(const int32_t* host_sizes, int64_t groups, const int32_t* device_sizes,
                                     int* mismatch, DeviceCounters* counters, cudaStream_t stream) {
  GuardArgs a;
  std::memcpy(a.host_sizes, host_sizes, groups * sizeof(int32_t));
  a.device_sizes = device_sizes;
  a.mismatch = mismatch;
  a.counters = counters;
  a.groups = static_cast<int>(groups);
  HostSizesGuardKernel<<<1, kThreads, 0, stream>>>(a);
  return CudaStatus(cudaGetLastError(), "launch of HostSizesGuardKernel");
}

}  // namespace te_async
