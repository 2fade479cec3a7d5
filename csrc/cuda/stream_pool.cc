#include "cuda/stream_pool.h"

#include "cuda/cuda_check.h"
#include "cuda/per_device.h"

namespace te_async {
namespace {

namespace ffi = xla::ffi;

ffi::Error NewHandle(const CublasApi& api, cudaStream_t stream, cublasHandle_t* handle, void** workspace) {
  TE_ASYNC_CUBLAS(api, Create(handle));
  TE_ASYNC_CUDA(cudaMalloc(workspace, StreamPool::kWorkspaceBytes));
  TE_ASYNC_CUBLAS(api, SetStream(*handle, stream));
  TE_ASYNC_CUBLAS(api, SetWorkspace(*handle, *workspace, StreamPool::kWorkspaceBytes));
  return ffi::Error::Success();
}

}  // namespace

ffi::ErrorOr<StreamPool*> StreamPool::ForDevice(int device) { return PerDevice<StreamPool>::Instance().Get(device); }

void StreamPool::ReleaseAll() { PerDevice<StreamPool>::Instance().ReleaseAll(); }

CublasLaunchStats StreamPool::Stats(int device) {
  StreamPool* pool = PerDevice<StreamPool>::Instance().Find(device);
  if (!pool) return {};
  std::lock_guard<std::mutex> lock(pool->mu_);
  return pool->stats_;
}

ffi::Error StreamPool::Init() {
  auto api = Cublas();
  if (api.has_error()) return api.error();
  cublas_ = *api;
  TE_ASYNC_RETURN_IF_ERROR(NewHandle(*cublas_, nullptr, &main_handle_, &main_workspace_));
  TE_ASYNC_CUDA(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  for (int i = 0; i < kStreams; ++i) {
    TE_ASYNC_CUDA(cudaStreamCreateWithFlags(&streams_[i], cudaStreamNonBlocking));
    TE_ASYNC_CUDA(cudaEventCreateWithFlags(&joins_[i], cudaEventDisableTiming));
    TE_ASYNC_RETURN_IF_ERROR(NewHandle(*cublas_, streams_[i], &side_handles_[i], &workspaces_[i]));
  }
  return ffi::Error::Success();
}

void StreamPool::Release() {
  if (cublas_) {
    if (main_handle_) cublas_->Destroy(main_handle_);
    for (cublasHandle_t h : side_handles_) {
      if (h) cublas_->Destroy(h);
    }
  }
  if (main_workspace_) cudaFree(main_workspace_);
  for (void* w : workspaces_) {
    if (w) cudaFree(w);
  }
  for (cudaEvent_t e : joins_) {
    if (e) cudaEventDestroy(e);
  }
  for (cudaStream_t s : streams_) {
    if (s) cudaStreamDestroy(s);
  }
  if (fork_) cudaEventDestroy(fork_);
}

ffi::ErrorOr<cublasHandle_t> StreamPool::MainHandle(cudaStream_t stream) {
  if (ffi::Error e = CublasStatus(*cublas_, cublas_->SetStream(main_handle_, stream), "cublasSetStream");
      e.failure()) {
    return ffi::Unexpected(e);
  }
  return main_handle_;
}

ffi::Error StreamPool::Fork(cudaStream_t stream, int n) {
  TE_ASYNC_CUDA(cudaEventRecord(fork_, stream));
  for (int i = 0; i < n; ++i) TE_ASYNC_CUDA(cudaStreamWaitEvent(streams_[i], fork_, 0));
  return ffi::Error::Success();
}

ffi::Error StreamPool::Join(cudaStream_t stream, int n) {
  for (int i = 0; i < n; ++i) {
    TE_ASYNC_CUDA(cudaEventRecord(joins_[i], streams_[i]));
    TE_ASYNC_CUDA(cudaStreamWaitEvent(stream, joins_[i], 0));
  }
  return ffi::Error::Success();
}

}  // namespace te_async
