// CUDA and cuBLAS return codes turned into FFI errors that name the failing call.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "xla/ffi/api/ffi.h"

namespace te_async {

inline xla::ffi::Error CudaStatus(cudaError_t status, const char* expr) {
  if (status == cudaSuccess) return xla::ffi::Error::Success();
  return xla::ffi::Error::Internal(std::string("te_async: ") + expr + " failed: " +
                                   cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
}

}  // namespace te_async

#define TE_ASYNC_RETURN_IF_ERROR(expr)                   \
  do {                                                   \
    if (::xla::ffi::Error te_err_ = (expr); te_err_.failure()) return te_err_; \
  } while (0)

#define TE_ASYNC_CUDA(expr) TE_ASYNC_RETURN_IF_ERROR(::te_async::CudaStatus((expr), #expr))
