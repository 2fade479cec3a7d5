#include "cuda/device_counters.h"

#include <map>
#include <mutex>

#include "cuda/cuda_check.h"
#include "cuda/device_guard.h"

namespace te_async {
namespace {

__device__ DeviceCounters g_counters = {0, 0};

}  // namespace

xla::ffi::ErrorOr<DeviceCounters*> CountersOnDevice(int device) {
  static std::mutex mu;
  static std::map<int, DeviceCounters*> resolved;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = resolved.find(device); it != resolved.end()) return it->second;
  DeviceGuard guard(device);
  if (xla::ffi::Error e = CudaStatus(guard.status(), "cudaSetDevice"); e.failure()) return xla::ffi::Unexpected(e);
  void* address = nullptr;
  if (xla::ffi::Error e = CudaStatus(cudaGetSymbolAddress(&address, g_counters), "cudaGetSymbolAddress(counters)");
      e.failure()) {
    return xla::ffi::Unexpected(e);
  }
  return resolved[device] = static_cast<DeviceCounters*>(address);
}

xla::ffi::ErrorOr<DeviceCounters> ReadCounters(int device) {
  auto counters = CountersOnDevice(device);
  if (counters.has_error()) return xla::ffi::Unexpected(counters.error());
  DeviceGuard guard(device);
  DeviceCounters host{};
  if (xla::ffi::Error e = CudaStatus(cudaMemcpy(&host, *counters, sizeof host, cudaMemcpyDeviceToHost),
                                     "cudaMemcpy(counters)");
      e.failure()) {
    return xla::ffi::Unexpected(e);
  }
  return host;
}

}  // namespace te_async
