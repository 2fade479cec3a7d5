// Switches read once from the environment: for tests, for finding bad inputs, for A/B
// measurements, and one for a training schedule whose order async mode's reuse guesses wrong.
#pragma once

#include <cstdlib>
#include <cstring>

namespace te_async {

inline bool EnvFlagIsOne(const char* name) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, "1") == 0;
}

// TE_ASYNC_POISON_OUTPUTS=1: fill every output with NaN before computing it, so that an element
// no kernel writes shows up in the tests instead of passing as stale memory.
inline bool PoisonOutputs() {
  static const bool on = EnvFlagIsOne("TE_ASYNC_POISON_OUTPUTS");
  return on;
}

// TE_ASYNC_VERIFY_HOST_SIZES=1: check every pinned-slot read against a synchronous read of the
// device snapshot, and fail the call on a mismatch. Slow; for tests.
inline bool VerifyHostSizes() {
  static const bool on = EnvFlagIsOne("TE_ASYNC_VERIFY_HOST_SIZES");
  return on;
}

// TE_ASYNC_DEBUG_ROTATE_PINNED_SIZES=1: every read from a pinned slot is rotated by one group, as
// a stale slot would read, so that tests can show the GPU's check repairs it (host_sizes_guard.h).
inline bool DebugRotatePinnedSizes() {
  static const bool on = EnvFlagIsOne("TE_ASYNC_DEBUG_ROTATE_PINNED_SIZES");
  return on;
}

// TE_ASYNC_NO_REUSE_BY_ORDER=1: a backward whose kept handle is not found by its address issues a
// fresh copy instead of taking the newest unclaimed kept copy (host_size_slots.h). For schedules
// that run a backward after a later forward of other sizes (1F1B pipelines), where that guess is
// the later forward's copy and the GPU redoes each of those GEMMs (repaired_reads).
inline bool NoReuseByOrder() {
  static const bool on = EnvFlagIsOne("TE_ASYNC_NO_REUSE_BY_ORDER");
  return on;
}

// TE_ASYNC_PER_GROUP_GEMMS=1: async mode's host-sized GEMMs launch one cuBLAS GEMM per group, as
// sync mode's do, instead of one grouped call (grouped_gemm_cublas.cc, OneLaunch): for measuring
// what hiding the copy gains apart from what the single launch gains.
inline bool PerGroupGemms() {
  static const bool on = EnvFlagIsOne("TE_ASYNC_PER_GROUP_GEMMS");
  return on;
}

// TE_ASYNC_CHECK_DEVICE_SIZES=1: device mode on the GPU reads the group sizes synchronously and
// rejects a negative size or a sum past M, as the host-sized modes do, instead of clamping them
// (on the CPU every mode always checks). The read
// cannot be captured into a CUDA graph, so this needs XLA's command buffers off.
inline bool CheckDeviceSizes() {
  static const bool on = EnvFlagIsOne("TE_ASYNC_CHECK_DEVICE_SIZES");
  return on;
}

// TE_ASYNC_DEBUG_CUTLASS=1: the CUTLASS grouped GEMM synchronises after its setup kernel and
// after the GEMM, and prints the per-group shapes, pointers and strides it set. Not capturable.
inline bool DebugCutlass() {
  static const bool on = EnvFlagIsOne("TE_ASYNC_DEBUG_CUTLASS");
  return on;
}

}  // namespace te_async
