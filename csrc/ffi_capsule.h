// Wraps an FFI handler symbol in the capsule that jax.ffi.register_ffi_target expects.
#pragma once

#include <nanobind/nanobind.h>

namespace te_async {

template <typename T>
nanobind::capsule EncapsulateFfiHandler(T* fn) {
  return nanobind::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace te_async
