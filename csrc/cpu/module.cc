// The CPU extension: a registrations() dict of FFI handler capsules, as jax's examples/ffi does.
#include <nanobind/nanobind.h>

#include "ffi_capsule.h"
#include "cpu/handlers.h"
#include "grouped_gemm_args.h"

namespace nb = nanobind;

NB_MODULE(_te_async_cpu, m) {
  m.def("registrations", []() {
    nb::dict d;
    d["te_async_copy_group_sizes"] = te_async::EncapsulateFfiHandler(te_async::kCopyGroupSizesCpu);
    d["te_async_grouped_gemm"] = te_async::EncapsulateFfiHandler(te_async::kGroupedGemmCpu);
    return d;
  });
  m.attr("MAX_GROUPS") = te_async::kMaxGroups;
}
