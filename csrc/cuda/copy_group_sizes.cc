// copy_group_sizes on CUDA: a device snapshot of the sizes (the handle) plus an early D2H copy
// into a pinned slot, all enqueued on XLA's stream; the host does not wait here. keep_group_sizes
// copies a forward's handle into the residual its backward gets, filed under the same slot;
// reuse_group_sizes makes a backward's handle from that residual, filed under the forward's slot
// where it still holds the copy (host_size_slots.h), else with a fresh copy.
#include "cuda/cuda_check.h"
#include "cuda/handlers.h"
#include "cuda/host_size_slots.h"
#include "grouped_gemm_args.h"

namespace te_async {
namespace {

namespace ffi = xla::ffi;

// Both handlers: checks the group count, finds the device's ring and enqueues handle := sizes on
// the device. Returns the ring, on which the caller files the handle.
ffi::ErrorOr<HostSizeSlots*> Snapshot(cudaStream_t stream, int32_t device, ffi::Buffer<ffi::S32> sizes,
                                      ffi::ResultBuffer<ffi::S32> handle) {
  const int64_t groups = static_cast<int64_t>(sizes.element_count());
  if (ffi::Error e = CheckGroupCount(groups); e.failure()) return ffi::Unexpected(e);
  auto slots = HostSizeSlots::ForDevice(device);
  if (slots.has_error()) return slots;
  if (ffi::Error e = CudaStatus(cudaMemcpyAsync(handle->typed_data(), sizes.typed_data(), groups * sizeof(int32_t),
                                                cudaMemcpyDeviceToDevice, stream),
                                "cudaMemcpyAsync (the group sizes' device snapshot)");
      e.failure()) {
    return ffi::Unexpected(e);
  }
  return slots;
}

ffi::Error CopyGroupSizesCuda(cudaStream_t stream, int32_t device, ffi::Buffer<ffi::S32> sizes,
                              ffi::ResultBuffer<ffi::S32> handle) {
  auto slots = Snapshot(stream, device, sizes, handle);
  if (slots.has_error()) return slots.error();
  return (*slots)->Issue(sizes.typed_data(), handle->typed_data(), sizes.element_count(), stream);
}

// The forward's input and `id` are not read: they keep JAX and XLA from hoisting or merging keeps,
// each of which serves one backward (te_async/group_sizes.py, keep_group_sizes).
ffi::Error KeepGroupSizesCuda(cudaStream_t stream, int32_t device, ffi::RunId run, ffi::Buffer<ffi::S32> snapshot,
                              ffi::AnyBuffer /*forward_input*/, ffi::ResultBuffer<ffi::S32> handle, int64_t /*id*/) {
  auto slots = Snapshot(stream, device, snapshot, handle);
  if (slots.has_error()) return slots.error();
  (*slots)->Keep(snapshot.typed_data(), handle->typed_data(), snapshot.element_count(), run.run_id);
  return ffi::Error::Success();
}

ffi::Error ReuseGroupSizesCuda(cudaStream_t stream, int32_t device, ffi::RunId run, ffi::Buffer<ffi::S32> snapshot,
                               ffi::ResultBuffer<ffi::S32> handle) {
  auto slots = Snapshot(stream, device, snapshot, handle);
  if (slots.has_error()) return slots.error();
  return (*slots)->Reuse(snapshot.typed_data(), handle->typed_data(), snapshot.element_count(), stream, run.run_id);
}

}  // namespace

// Neither is command-buffer compatible, on purpose: choosing the slot is host work that a graph replay
// would skip.
XLA_FFI_DEFINE_HANDLER_SYMBOL(kCopyGroupSizesCuda, CopyGroupSizesCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(kKeepGroupSizesCuda, KeepGroupSizesCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Ctx<ffi::RunId>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<int64_t>("id"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(kReuseGroupSizesCuda, ReuseGroupSizesCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Ctx<ffi::RunId>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

}  // namespace te_async
