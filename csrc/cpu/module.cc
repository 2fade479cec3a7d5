// The CPU extension: a registrations() dict of FFI handler capsules, as jax's examples/ffi does.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "ffi_capsule.h"
#include "cpu/handlers.h"
#include "device_kernel_choice.h"
#include "grouped_gemm_args.h"

namespace nb = nanobind;

NB_MODULE(_te_async_cpu, m) {
  m.def("registrations", []() {
    nb::dict d;
    d["te_async_copy_group_sizes"] = te_async::EncapsulateFfiHandler(te_async::kCopyGroupSizesCpu);
    d["te_async_grouped_gemm"] = te_async::EncapsulateFfiHandler(te_async::kGroupedGemmCpu);
    d["te_async_grouped_gemm_device"] = te_async::EncapsulateFfiHandler(te_async::kGroupedGemmDeviceCpu);
    return d;
  });
  m.attr("MAX_GROUPS") = te_async::kMaxGroups;
  // The device-mode kernel rule, for tests and for saying which kernel a GPU call will run.
  m.def("device_kernel_choice", &te_async::DeviceKernelChoice, nb::arg("groups"), nb::arg("rows"), nb::arg("k"),
        nb::arg("n"), nb::arg("ragged_k"), nb::arg("transpose_rhs"), nb::arg("in_dtype"), nb::arg("out_dtype"),
        nb::arg("compute_capability"), nb::arg("cutlass_built"));
}
