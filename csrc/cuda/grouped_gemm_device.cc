// Device mode: a grouped GEMM whose group sizes never leave the GPU. The plan (kernel, CUTLASS
// config, workspace) was made at trace time from static shapes (PlanDeviceGemm, called by
// te_async/plan.py) and arrives as attributes and an extra result; the handler checks that it fits
// this device and enqueues the kernel, which reads group_sizes on the device. Nothing waits for
// the host, nothing is allocated and nothing is decided here, so XLA may capture the call into a
// command buffer (CUDA graph) together with the rest of the step.
#include <array>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/cutlass_grouped_gemm.h"
#include "cuda/device_counters.h"
#include "cuda/device_gemm.h"
#include "cuda/handlers.h"
#include "cuda/poison.h"
#include "debug_flags.h"
#include "device_kernel_choice.h"
#include "grouped_gemm_args.h"

namespace te_async {

ffi::ErrorOr<DeviceInfo> QueryDevice(int device) {
  int major = 0, minor = 0;
  DeviceInfo info;
  for (auto [attr, value] : {std::pair{cudaDevAttrComputeCapabilityMajor, &major},
                             {cudaDevAttrComputeCapabilityMinor, &minor},
                             {cudaDevAttrMultiProcessorCount, &info.sm_count}}) {
    if (ffi::Error e = CudaStatus(cudaDeviceGetAttribute(value, attr, device), "cudaDeviceGetAttribute"); e.failure()) {
      return ffi::Unexpected(e);
    }
  }
  info.compute_capability = major * 10 + minor;
  return info;
}

ffi::ErrorOr<DeviceInfo> QueryCurrentDevice() {
  int device = 0;
  if (ffi::Error e = CudaStatus(cudaGetDevice(&device), "cudaGetDevice"); e.failure()) return ffi::Unexpected(e);
  return QueryDevice(device);
}

DeviceGemm DeviceGemmOf(const GroupedGemmShape& s, ffi::AnyBuffer lhs, ffi::AnyBuffer rhs, const int32_t* group_sizes,
                        void* out, const DeviceInfo& info, unsigned long long* clamped_calls) {
  DeviceGemm g;
  g.s = s;
  g.lhs = lhs.untyped_data();
  g.rhs = rhs.untyped_data();
  g.group_sizes = group_sizes;
  g.out = out;
  g.sm_count = info.sm_count;
  g.compute_capability = info.compute_capability;
  g.clamped_calls = clamped_calls;
  return g;
}

ffi::ErrorOr<DevicePlan> PlanDeviceGemm(const GroupedGemmShape& s, const DeviceInfo& info,
                                        const PlanSettings& settings) {
  DevicePlan plan;
  plan.kernel = ChooseDeviceKernel(s, info.compute_capability, CutlassBuilt(), settings.small_groups_max_rows);
#ifdef TE_ASYNC_HAVE_CUTLASS
  if (plan.kernel == DeviceKernel::kCutlassSm90) {
    auto config = CutlassSm90Config(s, settings.cutlass_config);
    if (config.has_error()) return ffi::Unexpected(config.error());
    plan.cutlass_config = *config;
    plan.workspace_bytes = CutlassSm90WorkspaceBytes(s, info.sm_count);
  }
#endif
  return plan;
}

ffi::Error CheckPlanFits(const GroupedGemmShape& s, const DeviceInfo& info, DeviceKernel kernel,
                         std::string_view cutlass_config, size_t workspace_bytes) {
  auto unfit = [&](const std::string& why) {
    return ffi::Error::InvalidArgument("te_async: the device-mode plan (" + std::string(DeviceKernelName(kernel)) +
                                       (cutlass_config.empty() ? "" : " " + std::string(cutlass_config)) +
                                       ") does not fit this call: " + why +
                                       "; plans are made at trace time for the local GPUs (te_async/plan.py)");
  };
  size_t need = 0;
  switch (kernel) {
    case DeviceKernel::kSmallGroups:
      if (s.ragged_k) return unfit("small_groups runs ragged m only");
      break;
    case DeviceKernel::kCutlassSm90:
#ifdef TE_ASYNC_HAVE_CUTLASS
      if (info.compute_capability != 90) return unfit("CUTLASS sm_90a needs compute capability 9.0");
      if (!CutlassSm90Supports(s)) return unfit("CUTLASS does not run this shape or dtype");
      need = CutlassSm90WorkspaceBytes(s, info.sm_count);
      break;
#else
      return unfit("te_async was built without the CUTLASS kernels");
#endif
    default:
      break;
  }
  if (workspace_bytes < need) {
    return unfit("a workspace of " + std::to_string(workspace_bytes) + " bytes, this device needs " +
                 std::to_string(need));
  }
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

ffi::Error Launch(DeviceKernel kernel, std::string_view cutlass_config, const DeviceGemm& g, cudaStream_t stream) {
  switch (kernel) {
    case DeviceKernel::kSmallGroups:
      return LaunchSmallGroups(g, stream);
#ifdef TE_ASYNC_HAVE_CUTLASS
    case DeviceKernel::kCutlassSm90:
      return LaunchCutlassSm90(g, cutlass_config, stream);
#endif
    default:
      return LaunchPortable(g, stream);
  }
}

ffi::Error GroupedGemmDevice(cudaStream_t stream, int32_t device, ffi::AnyBuffer lhs, ffi::AnyBuffer rhs,
                             ffi::AnyBuffer group_sizes, ffi::Result<ffi::AnyBuffer> out,
                             ffi::Result<ffi::AnyBuffer> workspace, bool ragged_k, bool transpose_rhs,
                             std::string_view kernel_name, std::string_view cutlass_config) {
  auto shape = CheckGroupedGemm(lhs, rhs, group_sizes, *out, ragged_k, transpose_rhs);
  if (shape.has_error()) return shape.error();
  const GroupedGemmShape& s = *shape;
  if (s.rows >= (int64_t{1} << 31)) {
    return ffi::Error::InvalidArgument("te_async: device mode supports fewer than 2^31 rows, got " +
                                       std::to_string(s.rows));
  }
  const std::optional<DeviceKernel> kernel = DeviceKernelFromName(kernel_name);
  if (!kernel) return ffi::Error::InvalidArgument("te_async: unknown device-mode kernel " + std::string(kernel_name));
  auto info = QueryDevice(device);
  if (info.has_error()) return info.error();
  TE_ASYNC_RETURN_IF_ERROR(CheckPlanFits(s, *info, *kernel, cutlass_config, workspace->size_bytes()));
  auto counters = CountersOnDevice(device);
  if (counters.has_error()) return counters.error();

  if (CheckDeviceSizes()) TE_ASYNC_RETURN_IF_ERROR(CheckSizesSynchronously(s, group_sizes.untyped_data(), stream));
  TE_ASYNC_RETURN_IF_ERROR(PoisonOutputBuffers(stream, *out));
  if (out->element_count() == 0) return ffi::Error::Success();

  DeviceGemm g = DeviceGemmOf(s, lhs, rhs, static_cast<const int32_t*>(group_sizes.untyped_data()), out->untyped_data(),
                              *info, &(*counters)->clamped_calls);
  g.workspace = workspace->untyped_data();
  g.workspace_bytes = workspace->size_bytes();
  return Launch(*kernel, cutlass_config, g, stream);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kGroupedGemmDeviceCuda, GroupedGemmDevice,
                              BindDeviceGemm(ffi::Ffi::Bind()
                                                 .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                                 .Ctx<ffi::DeviceOrdinal>()),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace te_async
