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
// A backward pass reuses its forward's copy. The forward keeps its handle for it (Keep): a copy
// of the handle, filed under the same slot, which the backward gets as a residual. The backward
// (Reuse) looks that residual up like a consumer's operand and files its own handle under the
// same slot, so no copy is issued and its GEMMs wait on an event that fired long ago. Each kept
// filing serves one reuse: under scan the backward's slices of stacked residuals may land on one
// address again and again, and only the first of them can be the handle kept there.
// Where the address finds no kept handle (under lax.scan the residuals are stacked and reach the
// backward at new addresses), Reuse takes the newest live kept copy of the same execution (XLA's
// run id) that no reuse has claimed: a backward pass runs its layers last to first, so in an
// unrolled or scanned stack, with or without jax.checkpoint, that is the layer's own copy. Other
// orders (a 1F1B pipeline's backward after a later microbatch's forward) can make it another
// layer's; the GPU check above then redoes the GEMMs from the operand, so a wrong guess costs
// time (the repair's portable kernel: much more than a fresh copy's wait at training sizes),
// never results. TE_ASYNC_NO_REUSE_BY_ORDER=1 turns the guess off for such schedules (a fresh
// copy instead). A backward run in another execution than its forward copies afresh.
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
  uint64_t reused = 0;          // Reuse calls served by a forward's slot
  uint64_t reused_by_order = 0; // of those, found as the newest unclaimed kept copy, not by address
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

  // Files `handle` (a forward's copy of `snapshot`, kept for its backward) under the slot that
  // `snapshot` is filed under, for one Reuse in execution `run`; nothing where that slot is gone.
  void Keep(const int32_t* snapshot, const void* handle, int64_t groups, int64_t run);

  // Files `handle` (the backward's copy of `snapshot`) under the slot of the kept handle that
  // `snapshot` is, if that slot still holds its copy and no earlier Reuse took that filing; else
  // under the newest live kept copy of execution `run` that no Reuse took; else issues a fresh
  // copy of `snapshot` filed under `handle`. Either way `handle` is then readable.
  xla::ffi::Error Reuse(const int32_t* snapshot, const void* handle, int64_t groups, cudaStream_t stream,
                        int64_t run);

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
    bool spent;  // no Reuse may take it: it is no kept handle, or one took it already
  };
  struct Kept {
    const void* handle;
    Filed filed;
    int64_t run;
  };

  xla::ffi::Error Init();
  void Release();
  bool TryPinned(const void* handle, int64_t groups, int32_t* out);
  // Whether `filed`'s slot still holds that copy, of `groups` sizes.
  bool Live(const Filed& filed, int64_t groups) const;
  // Issue with mu_ held.
  xla::ffi::Error IssueLocked(const int32_t* device_sizes, const void* handle, int64_t groups, cudaStream_t stream);
  xla::ffi::Error ReadSync(const int32_t* handle, int64_t groups, cudaStream_t stream, int32_t* out);

  std::mutex mu_;
  std::vector<Slot> slots_;
  std::unordered_map<const void*, Filed> filed_;
  std::vector<Kept> unclaimed_;  // kept handles no Reuse has taken, oldest first (at most kSlots)
  uint64_t issued_ = 0;
  HostSizeStats stats_;
};

}  // namespace te_async
