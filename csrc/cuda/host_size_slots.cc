#include "cuda/host_size_slots.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "cuda/cuda_check.h"
#include "debug_flags.h"
#include "cuda/per_device.h"
#include "grouped_gemm_args.h"

namespace te_async {
namespace {

namespace ffi = xla::ffi;

}  // namespace

ffi::ErrorOr<HostSizeSlots*> HostSizeSlots::ForDevice(int device) { return PerDevice<HostSizeSlots>::Instance().Get(device); }

void HostSizeSlots::ReleaseAll() { PerDevice<HostSizeSlots>::Instance().ReleaseAll(); }

HostSizeStats HostSizeSlots::Stats(int device) {
  HostSizeSlots* slots = PerDevice<HostSizeSlots>::Instance().Find(device);
  if (!slots) return {};
  std::lock_guard<std::mutex> lock(slots->mu_);
  return slots->stats_;
}

ffi::Error HostSizeSlots::Init() {
  slots_.resize(kSlots);
  for (Slot& s : slots_) {
    TE_ASYNC_CUDA(cudaMallocHost(reinterpret_cast<void**>(&s.pinned), kMaxGroups * sizeof(int32_t)));
    TE_ASYNC_CUDA(cudaEventCreateWithFlags(&s.ready, cudaEventDisableTiming));
  }
  return ffi::Error::Success();
}

void HostSizeSlots::Release() {
  for (Slot& s : slots_) {
    if (s.ready) cudaEventDestroy(s.ready);
    if (s.pinned) cudaFreeHost(s.pinned);
  }
  slots_.clear();
  filed_.clear();
  unclaimed_.clear();
}

ffi::Error HostSizeSlots::Issue(const int32_t* device_sizes, const void* handle, int64_t groups,
                                cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  return IssueLocked(device_sizes, handle, groups, stream);
}

ffi::Error HostSizeSlots::IssueLocked(const int32_t* device_sizes, const void* handle, int64_t groups,
                                      cudaStream_t stream) {
  const int index = static_cast<int>(issued_ % kSlots);
  Slot& slot = slots_[index];
  for (const void* old_handle : slot.handles) {
    auto old = filed_.find(old_handle);
    if (old != filed_.end() && old->second.slot == index && old->second.generation == slot.generation) filed_.erase(old);
  }
  TE_ASYNC_CUDA(cudaMemcpyAsync(slot.pinned, device_sizes, groups * sizeof(int32_t),
                                cudaMemcpyDeviceToHost, stream));
  TE_ASYNC_CUDA(cudaEventRecord(slot.ready, stream));
  slot.generation = ++issued_;
  slot.groups = groups;
  slot.handles.assign(1, handle);
  filed_[handle] = Filed{index, slot.generation, /*spent=*/true};
  ++stats_.copies;
  return ffi::Error::Success();
}

bool HostSizeSlots::Live(const Filed& filed, int64_t groups) const {
  const Slot& slot = slots_[filed.slot];
  return slot.generation == filed.generation && slot.groups == groups;
}

void HostSizeSlots::Keep(const int32_t* snapshot, const void* handle, int64_t groups, int64_t run) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = filed_.find(snapshot);
  if (it == filed_.end() || !Live(it->second, groups)) return;
  const Filed kept{it->second.slot, it->second.generation, /*spent=*/false};
  slots_[kept.slot].handles.push_back(handle);
  filed_[handle] = kept;
  // At most kSlots unclaimed: a copy kept that long ago has had its slot reissued, unless many
  // layers share it; the oldest's backward then copies afresh.
  if (unclaimed_.size() == kSlots) unclaimed_.erase(unclaimed_.begin());
  unclaimed_.push_back(Kept{handle, kept, run});
}

ffi::Error HostSizeSlots::Reuse(const int32_t* snapshot, const void* handle, int64_t groups, cudaStream_t stream,
                                int64_t run) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = filed_.find(snapshot);
  const bool by_address = it != filed_.end() && !it->second.spent && Live(it->second, groups);
  auto claimed = unclaimed_.rend();
  for (auto k = unclaimed_.rbegin(); k != unclaimed_.rend(); ++k) {
    const bool match = by_address ? k->handle == snapshot && k->filed.generation == it->second.generation
                                  : !NoReuseByOrder() && k->run == run && Live(k->filed, groups);
    if (match) {
      claimed = k;
      break;
    }
  }
  if (!by_address && claimed == unclaimed_.rend()) {
    ++stats_.reuse_misses;
    return IssueLocked(snapshot, handle, groups, stream);
  }
  const Filed source = by_address ? it->second : claimed->filed;
  if (claimed != unclaimed_.rend()) {
    auto kept = filed_.find(claimed->handle);
    if (kept != filed_.end() && kept->second.generation == source.generation) kept->second.spent = true;
    unclaimed_.erase(std::next(claimed).base());
  }
  if (by_address) {
    it->second.spent = true;
  } else {
    ++stats_.reused_by_order;
  }
  slots_[source.slot].handles.push_back(handle);
  filed_[handle] = Filed{source.slot, source.generation, /*spent=*/true};
  ++stats_.reused;
  return ffi::Error::Success();
}

bool HostSizeSlots::TryPinned(const void* handle, int64_t groups, int32_t* out) {
  Filed filed;
  cudaEvent_t ready;
  const int32_t* pinned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = filed_.find(handle);
    if (it == filed_.end()) return false;
    filed = it->second;
    const Slot& slot = slots_[filed.slot];
    if (slot.generation != filed.generation || slot.groups != groups) return false;
    ready = slot.ready;
    pinned = slot.pinned;
  }
  if (cudaEventSynchronize(ready) != cudaSuccess) return false;
  std::memcpy(out, pinned, groups * sizeof(int32_t));
  std::lock_guard<std::mutex> lock(mu_);
  // A copy issued meanwhile (another host thread) may have reused the slot.
  if (slots_[filed.slot].generation != filed.generation) return false;
  ++stats_.event_waits;
  return true;
}

ffi::Error HostSizeSlots::ReadSync(const int32_t* handle, int64_t groups, cudaStream_t stream,
                                   int32_t* out) {
  TE_ASYNC_CUDA(cudaMemcpyAsync(out, handle, groups * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  TE_ASYNC_CUDA(cudaStreamSynchronize(stream));
  return ffi::Error::Success();
}

ffi::ErrorOr<bool> HostSizeSlots::Read(const int32_t* handle, int64_t groups, cudaStream_t stream, bool async,
                                       int32_t* out) {
  if (async && TryPinned(handle, groups, out)) {
    if (DebugRotatePinnedSizes()) std::rotate(out, out + 1, out + groups);
    if (!VerifyHostSizes()) return true;
    std::vector<int32_t> check(groups);
    if (ffi::Error e = ReadSync(handle, groups, stream, check.data()); e.failure()) return ffi::Unexpected(e);
    if (std::memcmp(check.data(), out, groups * sizeof(int32_t)) != 0) {
      return ffi::Unexpected(ffi::Error::Internal("te_async: pinned group sizes differ from the device snapshot"));
    }
    return true;
  }
  if (ffi::Error e = ReadSync(handle, groups, stream, out); e.failure()) return ffi::Unexpected(e);
  std::lock_guard<std::mutex> lock(mu_);
  ++(async ? stats_.fallback_reads : stats_.sync_reads);
  return false;
}

}  // namespace te_async
