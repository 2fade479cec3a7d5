// The GPU's check of a pinned group-sizes read, which makes async mode correct by construction.
//
// An async GEMM launches one cuBLAS GEMM per group from sizes it read out of a pinned slot, and it
// finds the slot by its operand's address (host_size_slots.h). The slot is the operand's own copy
// unless XLA has meanwhile put a different snapshot at an address a recent copy was filed under
// (a copied scan carry, a sliced stacked residual, a reused buffer): the host cannot tell without
// a synchronous read, which is what async mode exists to avoid. The GPU can: before the GEMMs the
// guard kernel compares the sizes the host used with the operand's device snapshot, in stream
// order, and writes a flag; after them, the portable device-mode kernel, gated on that flag,
// recomputes the whole output from the device snapshot (every block exits at once when the flag
// is clear). A stale slot therefore costs time, never a wrong result, and is counted in
// DeviceCounters::repaired_reads. A clean call costs two small launches.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/device_counters.h"
#include "xla/ffi/api/ffi.h"

namespace te_async {

// Enqueues the comparison of host_sizes[0..groups) with device_sizes; *mismatch (device memory)
// becomes 1 if they differ, else 0, and a mismatch adds 1 to counters->repaired_reads.
xla::ffi::Error LaunchHostSizesGuard(const int32_t* host_sizes, int64_t groups, const int32_t* device_sizes,
                                     int* mismatch, DeviceCounters* counters, cudaStream_t stream);

}  // namespace te_async
