// The CPU extension: a registrations() dict of FFI handler capsules, as jax's examples/ffi does,
// and the device-mode kernel rule for any target (tests and docs ask it without a GPU).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "ffi_capsule.h"
#include "cpu/handlers.h"
#include "device_kernel_choice.h"
#include "grouped_gemm_args.h"

namespace nb = nanobind;

NB_MODULE(_te_async_cpu, m) {
  m.def("registrations", []() {
    nb::dict d;
    d["te_async_copy_group_sizes"] = te_async::EncapsulateFfiHandler(te_async::kCopyGroupSizesCpu);
    // The sizes are host memory already: a kept and a backward's handle are plain copies too.
    d["te_async_keep_group_sizes"] = te_async::EncapsulateFfiHandler(te_async::kKeepGroupSizesCpu);
    d["te_async_reuse_group_sizes"] = te_async::EncapsulateFfiHandler(te_async::kCopyGroupSizesCpu);
    d["te_async_grouped_gemm"] = te_async::EncapsulateFfiHandler(te_async::kGroupedGemmCpu);
    d["te_async_grouped_gemm_device"] = te_async::EncapsulateFfiHandler(te_async::kGroupedGemmDeviceCpu);
    return d;
  });
  m.attr("MAX_GROUPS") = te_async::kMaxGroups;
  m.attr("SMALL_GROUPS_MAX_ROWS") = te_async::kSmallGroupsMaxRows;
  m.attr("DENSE_MMA_MAX_ROWS") = te_async::kDenseMmaMaxRows;
  m.def(
      "kernel_rule",
      [](int64_t groups, int64_t rows, int64_t k, int64_t n, bool ragged_k, bool transpose_rhs,
         const std::string& in_dtype, const std::string& out_dtype, int compute_capability, bool cutlass_built,
         int64_t small_groups_max_rows) {
        const te_async::GroupedGemmShape s =
            te_async::ShapeFromStatic(groups, rows, k, n, ragged_k, transpose_rhs, in_dtype, out_dtype);
        return std::string(te_async::DeviceKernelName(
            te_async::ChooseDeviceKernel(s, compute_capability, cutlass_built, small_groups_max_rows)));
      },
      nb::arg("groups"), nb::arg("rows"), nb::arg("k"), nb::arg("n"), nb::arg("ragged_k"), nb::arg("transpose_rhs"),
      nb::arg("in_dtype"), nb::arg("out_dtype"), nb::arg("compute_capability"), nb::arg("cutlass_built"),
      nb::arg("small_groups_max_rows"));
}
