// Device mode: a grouped GEMM whose group sizes never leave the GPU. The handler picks a kernel
// from static shapes (device_kernel_choice.h) and enqueues it; the kernels read group_sizes on
// the device. Nothing waits for the host and nothing is allocated, so XLA may capture the call
// into a command buffer (CUDA graph) together with the rest of the step.
#include <array>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/device_gemm.h"
#include "cuda/handlers.h"
#include "debug_flags.h"
#include "device_kernel_choice.h"
#include "grouped_gemm_args.h"

namespace te_async {

size_t DeviceWorkspaceBytes(const GroupedGemmShape& s, DeviceKernel kernel, int sm_count) {
#ifdef TE_ASYNC_HAVE_CUTLASS
  if (kernel == DeviceKernel::kCutlassSm90) return CutlassSm90WorkspaceBytes(s, sm_count);
#endif
  return 0;
}

namespace {

ffi::Error QueryDevice(int device, DeviceInfo* info) {
  int major = 0, minor = 0;
  TE_ASYNC_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  TE_ASYNC_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  TE_ASYNC_CUDA(cudaDeviceGetAttribute(&info->sm_count, cudaDevAttrMultiProcessorCount, device));
  info->compute_capability = major * 10 + minor;
  return ffi::Error::Success();
}

}  // namespace

ffi::Error PlanDeviceGemm(const GroupedGemmShape& s, int device, DevicePlan* plan) {
  TE_ASYNC_RETURN_IF_ERROR(QueryDevice(device, &plan->info));
  plan->kernel = ChooseDeviceKernel(s, plan->info.compute_capability, CutlassBuilt());
  plan->workspace_bytes = DeviceWorkspaceBytes(s, plan->kernel, plan->info.sm_count);
  return ffi::Error::Success();
}

namespace {

// TE_ASYNC_CHECK_DEVICE_SIZES=1: the host-sized modes' checks, at the cost of a synchronous read.
ffi::Error CheckSizesSynchronously(const GroupedGemmShape& s, const void* sizes, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TE_ASYNC_CUDA(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    return ffi::Error::InvalidArgument(
        "te_async: TE_ASYNC_CHECK_DEVICE_SIZES=1 reads the group sizes synchronously, which a CUDA graph "
        "cannot hold; run with XLA_FLAGS=--xla_gpu_enable_command_buffer= to check them");
  }
  std::array<int32_t, kMaxGroups> host;
  TE_ASYNC_CUDA(cudaMemcpyAsync(host.data(), sizes, s.groups * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  TE_ASYNC_CUDA(cudaStreamSynchronize(stream));
  return CheckGroupSizeValues(host.data(), s.groups, s.rows);
}

ffi::Error Launch(DeviceKernel kernel, const DeviceGemm& g, cudaStream_t stream) {
  switch (kernel) {
    case DeviceKernel::kSmallGroups:
      return LaunchSmallGroups(g, stream);
#ifdef TE_ASYNC_HAVE_CUTLASS
    case DeviceKernel::kCutlassSm90:
      return LaunchCutlassSm90(g, stream);
#endif
    default:
      return LaunchPortable(g, stream);
  }
}

ffi::Error GroupedGemmDevice(cudaStream_t stream, int32_t device, ffi::AnyBuffer lhs, ffi::AnyBuffer rhs,
                             ffi::AnyBuffer group_sizes, ffi::Result<ffi::AnyBuffer> out,
                             ffi::Result<ffi::AnyBuffer> workspace, bool ragged_k, bool transpose_rhs) {
  auto shape = CheckGroupedGemm(lhs, rhs, group_sizes, *out, ragged_k, transpose_rhs);
  if (shape.has_error()) return shape.error();
  const GroupedGemmShape& s = *shape;
  if (s.rows >= (int64_t{1} << 31)) {
    return ffi::Error::InvalidArgument("te_async: device mode supports fewer than 2^31 rows, got " +
                                       std::to_string(s.rows));
  }
  DevicePlan plan;
  TE_ASYNC_RETURN_IF_ERROR(PlanDeviceGemm(s, device, &plan));
  if (workspace->size_bytes() < plan.workspace_bytes) {
    return ffi::Error::InvalidArgument(
        "te_async: device-mode workspace of " + std::to_string(workspace->size_bytes()) + " bytes, " +
        DeviceKernelName(plan.kernel) + " on device " + std::to_string(device) + " needs " +
        std::to_string(plan.workspace_bytes) + " (it was sized at trace time for device 0; are the GPUs of different kinds?)");
  }
  if (CheckDeviceSizes()) TE_ASYNC_RETURN_IF_ERROR(CheckSizesSynchronously(s, group_sizes.untyped_data(), stream));
  if (PoisonOutputs()) TE_ASYNC_CUDA(cudaMemsetAsync(out->untyped_data(), 0xff, out->size_bytes(), stream));
  if (out->element_count() == 0) return ffi::Error::Success();

  DeviceGemm g;
  g.s = s;
  g.lhs = lhs.untyped_data();
  g.rhs = rhs.untyped_data();
  g.group_sizes = static_cast<const int32_t*>(group_sizes.untyped_data());
  g.out = out->untyped_data();
  g.workspace = workspace->untyped_data();
  g.workspace_bytes = workspace->size_bytes();
  g.sm_count = plan.info.sm_count;
  return Launch(plan.kernel, g, stream);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kGroupedGemmDeviceCuda, GroupedGemmDevice,
                              BindGemmForm(BindGroupedGemm(ffi::Ffi::Bind()
                                                               .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                                               .Ctx<ffi::DeviceOrdinal>())
                                               .Ret<ffi::AnyBuffer>()),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace te_async
