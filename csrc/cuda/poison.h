// TE_ASYNC_POISON_OUTPUTS=1 (debug_flags.h): a call's outputs filled with 0xff bytes (NaN as floats, -1
// as integers) before its kernels run, so that an element no kernel writes shows up in the tests.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "cuda/cuda_check.h"
#include "debug_flags.h"

namespace te_async {

// Each of `buffers` (FFI buffers: untyped_data(), size_bytes()) poisoned on `stream` where the flag is on.
template <typename... Buffers>
xla::ffi::Error PoisonOutputBuffers(cudaStream_t stream, const Buffers&... buffers) {
  if (!PoisonOutputs()) return xla::ffi::Error::Success();
  for (auto [p, bytes] : {std::pair<void*, size_t>{buffers.untyped_data(), buffers.size_bytes()}...}) {
    TE_ASYNC_CUDA(cudaMemsetAsync(p, 0xff, bytes, stream));
  }
  return xla::ffi::Error::Success();
}

}  // namespace te_async
