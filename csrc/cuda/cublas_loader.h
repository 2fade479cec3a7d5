// cuBLAS, resolved at run time. The extension then imports on machines without cuBLAS (CI, CPU
// users), and on a GPU it shares the copy of libcublas that XLA has already loaded.
#pragma once

#include <cublas_v2.h>

#include "xla/ffi/api/ffi.h"

namespace te_async {

struct CublasApi {
  decltype(&cublasCreate_v2) Create;
  decltype(&cublasDestroy_v2) Destroy;
  decltype(&cublasSetStream_v2) SetStream;
  decltype(&cublasSetWorkspace_v2) SetWorkspace;
  decltype(&cublasGemmEx_64) GemmEx;  // the 64-bit-index form: not overloaded in C++
  decltype(&cublasGetStatusString) StatusString;
  // cuBLAS 12.5 and later; null in older ones, whose callers launch one GEMM per group instead.
  decltype(&cublasGemmGroupedBatchedEx_64) GemmGroupedBatchedEx;
};

// The loaded API, or an error saying which libraries were tried. Loads once per process.
xla::ffi::ErrorOr<const CublasApi*> Cublas();

xla::ffi::Error CublasStatus(const CublasApi& api, cublasStatus_t status, const char* expr);

}  // namespace te_async

#define TE_ASYNC_CUBLAS(api, expr) \
  TE_ASYNC_RETURN_IF_ERROR(::te_async::CublasStatus((api), (api).expr, #expr))
