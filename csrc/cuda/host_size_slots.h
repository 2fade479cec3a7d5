// Pinned host slots for group sizes, one ring per device.
//
// copy_group_sizes enqueues a D2H copy of the sizes into the next slot of the ring and records
// the slot's CUDA event. It also writes a device snapshot of the sizes, the handle that the
// consuming GEMMs take as an operand: that data dependency orders the copy before them, and the
// snapshot's buffer address is filed under the slot. A consumer looks its operand's address up,
// waits on that slot's event alone and reads the pinned sizes.
//
// What the address proves, and what it does not: XLA runs a device's thunks in program order on
// one host thread, and a slot is only refilled by the kSlots-th later copy, whose generation the
// filing then no longer matches (that consumer falls back to a synchronous read of its operand,
// counted). But an address names a buffer, not its contents: when XLA copies a handle (a scan
// carry, a slice of stacked residuals, a rematerialised or donated buffer) into an address that a
// recent copy was filed under, the lookup finds that copy's slot, and the host cannot tell without
// the synchronous read that async mode exists to avoid. So the lookup is only a fast guess: the
// GEMM that used pinned sizes has the GPU compare them with its operand in stream order and redo
// the GEMM from the operand when they differ (host_sizes_guard.h). A stale slot costs time and is
// counted (DeviceCounters::repaired_reads); it never gives a wrong result.
//
// A backward pass reuses its forward's copy (Reuse): the forward's handle, kept as a residual,
// is looked up like a consumer's operand, and the backward's own handle buffer is filed under the
// same slot, so no copy is issued and the backward's GEMMs wait on an event that fired long ago.
// Each filing serves one reuse: under scan the backward's slices of stacked handles may land on
// one address again and again, and only the first of them can be the copy filed there.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace te_async {

template <typename T>
class PerDevice;

struct HostSizeStats {
  uint64_t copies = 0;          // copy_group_sizes calls
  uint64_t event_waits = 0;     // consumers served from a pinned slot
  uint64_t sync_reads = 0;      // consumers in sync mode (D2H + cudaStreamSynchronize)
  uint64_t fallback_reads = 0;  // async consumers whose slot could not be used
  uint64_t reused = 0;          // Reuse calls served by the forward's slot
  uint64_t reuse_misses = 0;    // Reuse calls that issued a fresh copy (also counted in copies)
};

class HostSizeSlots {
 public:
  static constexpr int kSlots = 64;

  // The ring of `device`, created on first use.
  static xla::ffi::ErrorOr<HostSizeSlots*> ForDevice(int device);
  // Frees every device's pinned slots and events; called at interpreter exit.
  static void ReleaseAll();
  static HostSizeStats Stats(int device);

  // Enqueues the D2H copy of `device_sizes` on `stream`, filed under the `handle` buffer.
  xla::ffi::Error Issue(const int32_t* device_sizes, const void* handle, int64_t groups,
                        cudaStream_t stream);

  // Files `handle` (the backward's copy of `snapshot`) under the slot that `snapshot` is filed
  // under, if that slot still holds its copy and no earlier Reuse took that filing; else issues
  // a fresh copy of `snapshot` filed under `handle`. Either way `handle` is then readable.
  xla::ffi::Error Reuse(const int32_t* snapshot, const void* handle, int64_t groups, cudaStream_t stream);

  // Host copy of the sizes behind `handle`: from its pinned slot after waiting on the slot's
  // event when `async`, else (or when the slot is gone) by a synchronous D2H of `handle` itself.
  // True when the sizes came from a pinned slot, which the caller must then have the GPU check
  // (host_sizes_guard.h).
  xla::ffi::ErrorOr<bool> Read(const int32_t* handle, int64_t groups, cudaStream_t stream, bool async,
                               int32_t* out);

 private:
  template <typename T>
  friend class PerDevice;

  struct Slot {
    int32_t* pinned = nullptr;
    cudaEvent_t ready = nullptr;
    uint64_t generation = 0;
    int64_t groups = 0;
    std::vector<const void*> handles;  // the addresses filed under this generation
  };
  struct Filed {
    int slot;
    uint64_t generation;
    bool spent;  // no Reuse may take it: one did already, or it is a backward's own
  };

  xla::ffi::Error Init();
  void Release();
  bool TryPinned(const void* handle, int64_t groups, int32_t* out);
  // Issue with mu_ held; a handle that is no forward's (a backward's fresh copy) is not reusable.
  xla::ffi::Error IssueLocked(const int32_t* device_sizes, const void* handle, int64_t groups, cudaStream_t stream,
                              bool reusable);
  xla::ffi::Error ReadSync(const int32_t* handle, int64_t groups, cudaStream_t stream, int32_t* out);

  std::mutex mu_;
  std::vector<Slot> slots_;
  std::unordered_map<const void*, Filed> filed_;
  uint64_t issued_ = 0;
  HostSizeStats stats_;
};

}  // namespace te_async
