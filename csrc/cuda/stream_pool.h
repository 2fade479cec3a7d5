// Side streams, cuBLAS handles and workspaces for the host-sized grouped GEMM, one set per
// device, created once. The per-group GEMMs are spread over the side streams, which fork from
// and join back to XLA's stream with events, as TE's multi-stream cuBLAS does.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <mutex>

#include "cuda/cublas_loader.h"
#include "xla/ffi/api/ffi.h"

namespace te_async {

template <typename T>
class PerDevice;

// What the host-sized grouped GEMMs launched: the host's cost grows with the first.
struct CublasLaunchStats {
  uint64_t per_group_gemms = 0;  // cublasGemmEx calls, one per non-empty group
  uint64_t grouped_calls = 0;    // cublasGemmGroupedBatchedEx calls, each all of a GEMM's groups
};

class StreamPool {
 public:
  static constexpr int kStreams = 4;
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS' advice for Hopper

  static xla::ffi::ErrorOr<StreamPool*> ForDevice(int device);
  static void ReleaseAll();
  static CublasLaunchStats Stats(int device);

  // Serialises users of this device's handles (one XLA host thread per device in practice).
  std::mutex& mutex() { return mu_; }
  const CublasApi& cublas() const { return *cublas_; }
  CublasLaunchStats& stats() { return stats_; }  // under mutex()

  // The handle bound to XLA's own stream, for work that needs no fork.
  xla::ffi::ErrorOr<cublasHandle_t> MainHandle(cudaStream_t stream);
  cublasHandle_t SideHandle(int i) const { return side_handles_[i]; }

  // Makes the first `n` side streams wait for the work queued so far on `stream`.
  xla::ffi::Error Fork(cudaStream_t stream, int n);
  // Makes `stream` wait for the first `n` side streams.
  xla::ffi::Error Join(cudaStream_t stream, int n);

 private:
  template <typename T>
  friend class PerDevice;

  xla::ffi::Error Init();
  void Release();

  std::mutex mu_;
  CublasLaunchStats stats_;
  const CublasApi* cublas_ = nullptr;
  cublasHandle_t main_handle_ = nullptr;
  void* main_workspace_ = nullptr;
  cudaEvent_t fork_ = nullptr;
  std::array<cudaStream_t, kStreams> streams_{};
  std::array<cudaEvent_t, kStreams> joins_{};
  std::array<cublasHandle_t, kStreams> side_handles_{};
  std::array<void*, kStreams> workspaces_{};
};

}  // namespace te_async
