#include "cuda/cublas_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

namespace te_async {
namespace {

namespace ffi = xla::ffi;

// Sonames tried in order; TE_ASYNC_CUBLAS names an explicit path that goes first.
constexpr const char* kSonames[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};

void* OpenCublas(std::string& tried) {
  if (const char* path = std::getenv("TE_ASYNC_CUBLAS")) {
    tried += std::string(path) + " ";
    if (void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) return h;
  }
  for (const char* name : kSonames) {  // prefer the copy XLA has loaded already
    if (void* h = dlopen(name, RTLD_NOW | RTLD_NOLOAD)) return h;
  }
  for (const char* name : kSonames) {
    tried += std::string(name) + " ";
    if (void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return h;
  }
  return nullptr;
}

template <typename Fn>
bool Resolve(void* lib, const char* symbol, Fn& fn, std::string& missing) {
  fn = reinterpret_cast<Fn>(dlsym(lib, symbol));
  if (!fn) missing += std::string(symbol) + " ";
  return fn != nullptr;
}

}  // namespace

ffi::ErrorOr<const CublasApi*> Cublas() {
  static CublasApi api;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string tried;
    void* lib = OpenCublas(tried);
    if (!lib) {
      error = "te_async: cannot load cuBLAS (tried " + tried + "); set TE_ASYNC_CUBLAS to its path";
      return;
    }
    std::string missing;
    Resolve(lib, "cublasCreate_v2", api.Create, missing);
    Resolve(lib, "cublasDestroy_v2", api.Destroy, missing);
    Resolve(lib, "cublasSetStream_v2", api.SetStream, missing);
    Resolve(lib, "cublasSetWorkspace_v2", api.SetWorkspace, missing);
    Resolve(lib, "cublasGemmEx_64", api.GemmEx, missing);
    Resolve(lib, "cublasGetStatusString", api.StatusString, missing);
    if (!missing.empty()) error = "te_async: cuBLAS lacks symbols: " + missing;
    std::string absent_before_12_5;  // then GemmGroupedBatchedEx stays null: not an error
    Resolve(lib, "cublasGemmGroupedBatchedEx_64", api.GemmGroupedBatchedEx, absent_before_12_5);
  });
  if (!error.empty()) return ffi::Unexpected(ffi::Error::Internal(error));
  return &api;
}

ffi::Error CublasStatus(const CublasApi& api, cublasStatus_t status, const char* expr) {
  if (status == CUBLAS_STATUS_SUCCESS) return ffi::Error::Success();
  return ffi::Error::Internal(std::string("te_async: ") + expr + " failed: " + api.StatusString(status));
}

}  // namespace te_async
