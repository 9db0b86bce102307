// Pending UVA accesses per pinned allocation (see host_access_tracker.h).
#include "transfer/host_access_tracker.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace speedtorch {
namespace {

struct PendingAccess {
  cudaEvent_t event;
  int device;
  UvaAccess access;
};

struct Tracker {
  std::mutex mutex;
  std::unordered_map<const void*, std::vector<PendingAccess>> pending;
  std::vector<std::pair<int, cudaEvent_t>> free_events;  // completed events, for reuse on their device
};

Tracker& tracker() {
  static Tracker* t = new Tracker();  // never destroyed: events must outlive static destruction order
  return *t;
}

cudaEvent_t take_event_locked(Tracker& t, int device) {
  for (auto it = t.free_events.begin(); it != t.free_events.end(); ++it) {
    if (it->first == device) {
      cudaEvent_t e = it->second;
      t.free_events.erase(it);
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

}  // namespace

void note_uva_access(const void* key, UvaAccess access, int device, cudaStream_t stream) {
  Tracker& t = tracker();
  std::lock_guard<std::mutex> lock(t.mutex);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  auto& list = t.pending[key];
  // Drop what has completed so the list stays as short as the work in flight.
  for (auto it = list.begin(); it != list.end();) {
    if (completed(it->event)) {
      t.free_events.emplace_back(it->device, it->event);
      it = list.erase(it);
    } else {
      ++it;
    }
  }
  cudaEvent_t e = take_event_locked(t, device);
  C10_CUDA_CHECK(cudaEventRecord(e, stream));
  list.push_back({e, device, access});
}

void wait_for_uva_conflicts(const void* key, UvaAccess host_access) {
  std::vector<cudaEvent_t> to_wait;
  Tracker& t = tracker();
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    auto found = t.pending.find(key);
    if (found == t.pending.end()) return;
    for (const PendingAccess& p : found->second) {
      if (host_access == UvaAccess::kWrite || p.access == UvaAccess::kWrite) to_wait.push_back(p.event);
    }
  }
  // Wait outside the lock so other threads keep launching. The events stay listed until they are seen complete
  // under the lock, so a concurrent caller never skips one still in flight; an event recycled meanwhile only
  // makes this wait longer, never shorter.
  for (cudaEvent_t e : to_wait) C10_CUDA_CHECK(cudaEventSynchronize(e));
}

}  // namespace speedtorch
