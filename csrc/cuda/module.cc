// The CUDA extension: a registrations() dict of FFI handler capsules, the host-size counters,
// and release() for interpreter exit.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "ffi_capsule.h"
#include "cuda/cutlass_grouped_gemm.h"
#include "cuda/device_gemm.h"
#include "cuda/handlers.h"
#include "cuda/host_size_slots.h"
#include "cuda/stream_pool.h"

namespace nb = nanobind;

NB_MODULE(_te_async_cuda, m) {
  m.def("registrations", []() {
    nb::dict d;
    d["te_async_copy_group_sizes"] = te_async::EncapsulateFfiHandler(te_async::kCopyGroupSizesCuda);
    d["te_async_grouped_gemm"] = te_async::EncapsulateFfiHandler(te_async::kGroupedGemmCuda);
    d["te_async_grouped_gemm_device"] = te_async::EncapsulateFfiHandler(te_async::kGroupedGemmDeviceCuda);
    return d;
  });
  m.def("host_size_stats", [](int device) {
    const te_async::HostSizeStats s = te_async::HostSizeSlots::Stats(device);
    nb::dict d;
    d["copies"] = s.copies;
    d["event_waits"] = s.event_waits;
    d["sync_reads"] = s.sync_reads;
    d["fallback_reads"] = s.fallback_reads;
    return d;
  });
  // What a device-mode call of this static shape will run on `device` (the kernel, or for
  // CUTLASS its config, e.g. "cutlass_sm90_coop_128x256x64_c1x2"), and the workspace it needs.
  m.def(
      "device_plan",
      [](int64_t groups, int64_t rows, int64_t k, int64_t n, bool ragged_k, bool transpose_rhs,
         const std::string& in_dtype, const std::string& out_dtype, int device) {
        const te_async::GroupedGemmShape s =
            te_async::ShapeFromStatic(groups, rows, k, n, ragged_k, transpose_rhs, in_dtype, out_dtype);
        te_async::DevicePlan plan;
        if (xla::ffi::Error e = te_async::PlanDeviceGemm(s, device, &plan); e.failure()) {
          throw std::runtime_error(e.message());
        }
        std::string name = te_async::DeviceKernelName(plan.kernel);
#ifdef TE_ASYNC_HAVE_CUTLASS
        if (plan.kernel == te_async::DeviceKernel::kCutlassSm90) {
          if (xla::ffi::Error e = te_async::CheckCutlassConfigOverride(); e.failure()) {
            throw std::invalid_argument(e.message());
          }
          name = te_async::CutlassSm90ConfigName(s);
        }
#endif
        return std::make_tuple(name, plan.workspace_bytes);
      },
      nb::arg("groups"), nb::arg("rows"), nb::arg("k"), nb::arg("n"), nb::arg("ragged_k"), nb::arg("transpose_rhs"),
      nb::arg("in_dtype"), nb::arg("out_dtype"), nb::arg("device"));
  m.attr("CUTLASS_BUILT") = te_async::CutlassBuilt();
  // The configs each form can run, by form ("m", "mt", "k"), for TE_ASYNC_CUTLASS_CONFIG; empty
  // when CUTLASS is not built.
  nb::dict configs;
  if (te_async::CutlassBuilt()) {
    using te_async::cutlass_sm90::Form;
    for (auto [key, form] : {std::pair{"m", Form::kRaggedM}, {"mt", Form::kRaggedMT}, {"k", Form::kRaggedK}}) {
      nb::list names;
      for (int i = 0; i < te_async::cutlass_sm90::kNumTiles; ++i) {
        const auto tile = static_cast<te_async::cutlass_sm90::Tile>(i);
        if (te_async::cutlass_sm90::FormHasTile(form, tile)) names.append(te_async::cutlass_sm90::TileName(tile));
      }
      configs[key] = names;
    }
  }
  m.attr("CUTLASS_CONFIGS") = configs;
  m.def("release", []() {
    te_async::StreamPool::ReleaseAll();
    te_async::HostSizeSlots::ReleaseAll();
  });
}
