// The CUDA extension: a registrations() dict of FFI handler capsules, the host-size counters,
// and release() for interpreter exit.
#include <nanobind/nanobind.h>

#include "ffi_capsule.h"
#include "cuda/handlers.h"
#include "cuda/host_size_slots.h"
#include "cuda/stream_pool.h"

namespace nb = nanobind;

NB_MODULE(_te_async_cuda, m) {
  m.def("registrations", []() {
    nb::dict d;
    d["te_async_copy_group_sizes"] = te_async::EncapsulateFfiHandler(te_async::kCopyGroupSizesCuda);
    d["te_async_grouped_gemm"] = te_async::EncapsulateFfiHandler(te_async::kGroupedGemmCuda);
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
  m.def("release", []() {
    te_async::StreamPool::ReleaseAll();
    te_async::HostSizeSlots::ReleaseAll();
  });
}
