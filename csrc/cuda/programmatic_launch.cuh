// Programmatic dependent launch (compute capability 9.0 and up). A kernel launched by
// LaunchDependent(..., after_previous = true) behind another in the same stream may start as soon as
// every block of that one has called StartDependents() (or ended), so its blocks are scheduled, and
// may load what does not depend on the previous kernel, while that one still runs;
// WaitForPrevious() then waits for the previous kernel to end with its writes visible. Kernels
// chained this way inside one FFI call are captured by XLA into one graph node, where the
// programmatic edges hold.
#pragma once

#include <cuda_runtime.h>

#include "cuda/cluster_launch.h"
#include "cuda/cuda_check.h"

namespace te_async {

__device__ __forceinline__ void StartDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

// Returns at once where the launch has no programmatic dependency.
__device__ __forceinline__ void WaitForPrevious() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...) in thread-block clusters of `cluster`
// blocks (1: no cluster attribute), a programmatic dependent of the stream's previous kernel where
// after_previous.
template <typename... Params, typename... Args>
cudaError_t LaunchDependentClusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                                    cudaStream_t stream, bool after_previous, int cluster, const Args&... args) {
  cudaLaunchAttribute attrs[2] = {};
  int count = 0;
  if (after_previous) {
    attrs[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) attrs[count++] = ClusterDimension(cluster);
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = count;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

// The same without clusters.
template <typename... Params, typename... Args>
cudaError_t LaunchDependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                            bool after_previous, const Args&... args) {
  return LaunchDependentClusters(kernel, grid, block, shared_bytes, stream, after_previous, 1, args...);
}

// kernel<<<grid, threads, 0, stream>>>(args), a programmatic dependent of the stream's previous kernel
// where after_previous; a failed launch is an FFI error naming `what` (the token calls' chains).
template <typename Args>
xla::ffi::Error LaunchChained(void (*kernel)(Args), dim3 grid, int threads, const Args& args, cudaStream_t stream,
                              bool after_previous, const char* what) {
  return CudaStatus(LaunchDependent(kernel, grid, dim3(threads), 0, stream, after_previous, args), what);
}

}  // namespace te_async
