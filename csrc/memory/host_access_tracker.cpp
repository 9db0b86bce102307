// Pending UVA accesses per pinned allocation (see host_access_tracker.h).
#include "memory/host_access_tracker.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace speedtorch {
namespace {

struct PendingAccess {
  cudaEvent_t event;
  int device;
  UvaAccess access;
};

// A shard records the allocations whose keys hash to it. Ordered by key so that releasing a memory range finds
// every allocation inside it.
struct Shard {
  std::mutex mutex;
  std::map<const void*, std::vector<PendingAccess>> pending;
  std::vector<std::pair<int, cudaEvent_t>> free_events;  // completed events, for reuse on their device
  std::size_t sweep_at = 0;                              // sweep every allocation once `pending` reaches this size
};

constexpr std::size_t kShards = 16;
// The first sweep of a shard comes at this many allocations; later ones when the count has doubled since the last,
// so sweeping costs O(1) per launch, amortized.
constexpr std::size_t kFirstSweepAt = 8;

std::array<Shard, kShards>& shards() {
  static auto* s = new std::array<Shard, kShards>();  // never destroyed: events must outlive static destruction
  return *s;
}

Shard& shard_of(const void* key) {
  // Tables start on page boundaries, so the low bits of their addresses are all zero (std::hash is the identity
  // here): take the top bits of a multiplicative (Fibonacci) hash instead.
  const uint64_t mixed = static_cast<uint64_t>(reinterpret_cast<std::uintptr_t>(key)) * 0x9E3779B97F4A7C15ull;
  static_assert(kShards == 16, "the shift below takes 4 bits");
  return shards()[mixed >> 60];
}

cudaEvent_t take_event_locked(Shard& s, int device) {
  for (auto it = s.free_events.begin(); it != s.free_events.end(); ++it) {
    if (it->first == device) {
      cudaEvent_t e = it->second;
      s.free_events.erase(it);
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

bool completed(cudaEvent_t e) {
  const cudaError_t status = cudaEventQuery(e);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();  // cudaEventQuery leaves NotReady as the last error
    return false;
  }
  C10_CUDA_CHECK(status);
  return true;
}

// Drops the completed accesses of one allocation, keeping their events for reuse.
void drop_completed_locked(Shard& s, std::vector<PendingAccess>& list) {
  for (auto it = list.begin(); it != list.end();) {
    if (completed(it->event)) {
      s.free_events.emplace_back(it->device, it->event);
      it = list.erase(it);
    } else {
      ++it;
    }
  }
}

// Drops the completed accesses of every allocation, and the allocations left with none.
void sweep_locked(Shard& s) {
  for (auto it = s.pending.begin(); it != s.pending.end();) {
    drop_completed_locked(s, it->second);
    it = it->second.empty() ? s.pending.erase(it) : std::next(it);
  }
  s.sweep_at = std::max(kFirstSweepAt, 2 * s.pending.size());
}

}  // namespace

void note_uva_access(const void* key, UvaAccess access, int device, cudaStream_t stream) {
  Shard& s = shard_of(key);
  std::lock_guard<std::mutex> lock(s.mutex);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  // Tables no longer used, and PyTorch's pinned blocks (freed without telling us), leave entries behind: sweep them
  // out once they could make the shard large.
  if (s.pending.size() >= std::max(s.sweep_at, kFirstSweepAt)) sweep_locked(s);
  auto& list = s.pending[key];
  // Drop what has completed so the list stays as short as the work in flight.
  drop_completed_locked(s, list);
  cudaEvent_t e = take_event_locked(s, device);
  C10_CUDA_CHECK(cudaEventRecord(e, stream));
  list.push_back({e, device, access});
}

void wait_for_uva_conflicts(const void* key, UvaAccess host_access) {
  std::vector<cudaEvent_t> to_wait;
  Shard& s = shard_of(key);
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    auto found = s.pending.find(key);
    if (found == s.pending.end()) return;
    for (const PendingAccess& p : found->second) {
      if (host_access == UvaAccess::kWrite || p.access == UvaAccess::kWrite) to_wait.push_back(p.event);
    }
  }
  // Wait outside the lock so other threads keep launching. The events stay listed until they are seen complete
  // under the lock, so a concurrent caller never skips one still in flight; an event recycled meanwhile only
  // makes this wait longer, never shorter.
  for (cudaEvent_t e : to_wait) C10_CUDA_CHECK(cudaEventSynchronize(e));
}

void release_uva_accesses_in(const void* begin, std::size_t bytes) noexcept {
  const auto* first = static_cast<const char*>(begin);
  const char* last = first + bytes;
  for (Shard& s : shards()) {
    std::lock_guard<std::mutex> lock(s.mutex);
    // Nothing may launch on the memory any more (its last owner is releasing it): wait under the lock, which
    // keeps the events from being recycled before they are waited for.
    auto it = s.pending.lower_bound(first);
    while (it != s.pending.end() && static_cast<const char*>(it->first) < last) {
      for (const PendingAccess& p : it->second) {
        const cudaError_t err = cudaEventSynchronize(p.event);
        if (err != cudaSuccess) {
          (void)cudaGetLastError();
          // At process exit the runtime may be gone before the last tables: nothing runs any more, say nothing.
          if (err == cudaErrorCudartUnloading) continue;
          std::fprintf(stderr, "speedtorch: waiting for GPU work on host memory being released failed: %s\n",
                       cudaGetErrorString(err));
        }
        s.free_events.emplace_back(p.device, p.event);
      }
      it = s.pending.erase(it);
    }
  }
}

std::size_t tracked_allocation_count() {
  std::size_t count = 0;
  for (Shard& s : shards()) {
    std::lock_guard<std::mutex> lock(s.mutex);
    count += s.pending.size();
  }
  return count;
}

}  // namespace speedtorch
