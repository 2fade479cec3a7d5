// copy_group_sizes on the CPU: the sizes are already in host memory, so the handle is a plain copy.
#include <cstring>

#include "cpu/handlers.h"
#include "grouped_gemm_args.h"

namespace te_async {

static ffi::Error CopyGroupSizesCpu(ffi::Buffer<ffi::S32> sizes, ffi::ResultBuffer<ffi::S32> handle) {
  const int64_t groups = static_cast<int64_t>(sizes.element_count());
  if (ffi::Error e = CheckGroupCount(groups); e.failure()) return e;
  std::memcpy(handle->typed_data(), sizes.typed_data(), groups * sizeof(int32_t));
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kCopyGroupSizesCpu, CopyGroupSizesCpu,
                              ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::S32>>().Ret<ffi::Buffer<ffi::S32>>());

// keep_group_sizes: a copy; the forward's input and `id` only keep JAX and XLA from hoisting or
// merging keeps (te_async/group_sizes.py).
XLA_FFI_DEFINE_HANDLER_SYMBOL(kKeepGroupSizesCpu,
                              [](ffi::Buffer<ffi::S32> sizes, ffi::AnyBuffer, ffi::ResultBuffer<ffi::S32> handle,
                                 int64_t) { return CopyGroupSizesCpu(sizes, handle); },
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<int64_t>("id"));

}  // namespace te_async
