// Pinned host slots for group sizes, one ring per device.
//
// copy_group_sizes enqueues a D2H copy of the sizes into the next slot of the ring and records
// the slot's CUDA event. It also writes a device snapshot of the sizes, the handle that the
// consuming GEMMs take as an operand: that data dependency orders the copy before them, and the
// snapshot's buffer address names the slot. A consumer waits on that slot's event alone.
//
// Why a ring is safe: XLA runs a device's thunks in program order on one host thread, and a
// consumer reads its slot synchronously inside its own handler. A slot is therefore only
// overwritten by the kSlots-th later copy; each slot carries a generation, and a consumer whose
// slot was reissued (more than kSlots copies in flight, or a handle XLA copied to a new buffer)
// does not read stale sizes: it falls back to a synchronous read of the snapshot, which always
// holds the right values, and the fallback is counted in Stats.
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

  // Host copy of the sizes behind `handle`: from its pinned slot after waiting on the slot's
  // event when `async`, else (or when the slot is gone) by a synchronous D2H of `handle` itself.
  xla::ffi::Error Read(const int32_t* handle, int64_t groups, cudaStream_t stream, bool async,
                       int32_t* out);

 private:
  template <typename T>
  friend class PerDevice;

  struct Slot {
    int32_t* pinned = nullptr;
    cudaEvent_t ready = nullptr;
    uint64_t generation = 0;
    int64_t groups = 0;
    const void* handle = nullptr;
  };
  struct Filed {
    int slot;
    uint64_t generation;
  };

  xla::ffi::Error Init();
  void Release();
  bool TryPinned(const void* handle, int64_t groups, int32_t* out);
  xla::ffi::Error ReadSync(const int32_t* handle, int64_t groups, cudaStream_t stream, int32_t* out);

  std::mutex mu_;
  std::vector<Slot> slots_;
  std::unordered_map<const void*, Filed> filed_;
  uint64_t issued_ = 0;
  HostSizeStats stats_;
};

}  // namespace te_async
