// Thread-block cluster launches of the decode kernels whose blocks share partial results through
// distributed shared memory (the split-K GEMMs of small_group_gemm.cu and dense_mma.cu, the fused
// MLA attention of mla_decode.cu, token_ffn.cu's routing and expert kernels), so a launch must
// know how many such clusters fit on the GPU at once.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <tuple>

#include "cuda/cuda_check.h"

namespace te_async {

// The most blocks a thread-block cluster may have without opting in to a non-portable size.
constexpr int kPortableClusterSize = 8;

// The launch attribute for thread-block clusters of `cluster` blocks along x.
inline cudaLaunchAttribute ClusterDimension(int cluster) {
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(cluster);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  return attr;
}

// A launch of `grid` blocks of `threads` with `smem` bytes of dynamic shared memory in clusters of
// `cluster` blocks (no cluster attribute for 1); attr is the storage the config points at.
inline cudaLaunchConfig_t ClusterLaunchConfig(long long grid, int threads, int cluster, cudaStream_t stream,
                                              cudaLaunchAttribute& attr, size_t smem = 0) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  attr = ClusterDimension(cluster);
  config.attrs = &attr;
  config.numAttrs = cluster > 1 ? 1 : 0;
  return config;
}

// How many clusters of `slices` blocks of `kernel` can be resident at once on the current device
// (a cluster's blocks share a GPC, so clusters of many blocks fit fewer times than the SMs
// suggest), asked once per (device, kernel, slices): a call may be re-captured every scan trip. A
// kernel launched with dynamic shared memory is asked with it (`smem`, always the same for a kernel).
template <typename... Params>
xla::ffi::ErrorOr<int> ResidentClusters(void (*kernel)(Params...), int threads, int slices, size_t smem = 0) {
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int>, int> known;
  int device = 0;
  if (auto e = CudaStatus(cudaGetDevice(&device), "cudaGetDevice"); e.failure()) return xla::ffi::Unexpected(e);
  const auto key = std::make_tuple(device, reinterpret_cast<const void*>(kernel), slices);
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = known.find(key); it != known.end()) return it->second;
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t config = ClusterLaunchConfig(slices, threads, slices, nullptr, attr, smem);
  config.numAttrs = 1;  // the occupancy query takes a cluster of 1 as well
  int resident = 0;
  if (auto e = CudaStatus(cudaOccupancyMaxActiveClusters(&resident, kernel, &config), "cudaOccupancyMaxActiveClusters");
      e.failure()) {
    return xla::ffi::Unexpected(e);
  }
  known[key] = resident;
  return resident;
}

}  // namespace te_async
