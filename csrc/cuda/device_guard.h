// Makes `device` current for a scope and restores the caller's device after, for one-time setup
// (streams, handles, pinned slots) that must land on the device XLA runs the call on.
#pragma once

#include <cuda_runtime.h>

namespace te_async {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    status_ = cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

}  // namespace te_async
