// A lazily built, process-wide object per CUDA device, shared by the handlers that need
// long-lived resources (pinned slots, streams, cuBLAS handles). Built under the device's
// context; released explicitly at interpreter exit, while the CUDA context is still alive.
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "cuda/cuda_check.h"
#include "cuda/device_guard.h"

namespace te_async {

template <typename T>
class PerDevice {
 public:
  // The process-wide registry for T; leaked on purpose, so that it outlives static teardown.
  static PerDevice& Instance() {
    static auto* registry = new PerDevice();
    return *registry;
  }

  // T must provide `xla::ffi::Error Init()` and `void Release()`.
  xla::ffi::ErrorOr<T*> Get(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(device);
    if (it != objects_.end()) return it->second.get();
    DeviceGuard guard(device);
    if (xla::ffi::Error e = CudaStatus(guard.status(), "cudaSetDevice"); e.failure()) {
      return xla::ffi::Unexpected(e);
    }
    auto object = std::make_unique<T>();
    if (xla::ffi::Error e = object->Init(); e.failure()) {
      object->Release();
      return xla::ffi::Unexpected(e);
    }
    return (objects_[device] = std::move(object)).get();
  }

  T* Find(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(device);
    return it == objects_.end() ? nullptr : it->second.get();
  }

  void ReleaseAll() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [device, object] : objects_) {
      DeviceGuard guard(device);
      object->Release();
    }
    objects_.clear();
  }

 private:
  std::mutex mu_;
  std::map<int, std::unique_ptr<T>> objects_;
};

}  // namespace te_async
