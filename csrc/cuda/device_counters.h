// Counters the GPU keeps for what it cannot raise: one set per device, in device memory, bumped by
// kernels with atomicAdd so that a CUDA graph replay counts too, and read by the host after a step
// (te_async.size_errors, te_async.host_size_stats). Reading costs a synchronous 16-byte copy, so
// nobody reads them inside a step.
#pragma once

#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace te_async {

struct DeviceCounters {
  // Device-mode GEMM calls whose group sizes were invalid (a negative size, or a sum past M) and
  // were clamped (group_layout.cuh).
  unsigned long long clamped_calls;
  // Async host-sized GEMM calls whose pinned sizes differed from their operand's device snapshot;
  // each was recomputed on the GPU from the snapshot (host_sizes_guard.h).
  unsigned long long repaired_reads;
};

// The counters' device address on `device`, resolved once per device (no allocation: a __device__
// variable of this module). The planner resolves it at trace time, so a captured call never does.
xla::ffi::ErrorOr<DeviceCounters*> CountersOnDevice(int device);

// A synchronous read of the counters of `device`.
xla::ffi::ErrorOr<DeviceCounters> ReadCounters(int device);

}  // namespace te_async
