// Orders CPU-thread access to a pinned table after the GPU kernels still reading or writing it over UVA.
//
// A UVA kernel runs later, on its stream; the staged path and the CPU operators touch the same host rows at once,
// on the calling thread. Without ordering, a gather could read a row before an earlier scatter's kernel wrote it, or
// a scatter could overwrite a row an earlier gather's kernel has not read yet. Each UVA launch records an event
// against the table's allocation; host access waits for the pending events that conflict (writes before reads;
// reads and writes before writes), and only for those: work on the stream that does not touch the table is not
// waited for. Releasing host memory (PinnedHostBuffer) waits for every pending access inside it: a queued kernel
// must never touch unmapped memory.
//
// Entries whose accesses have all completed are dropped (at the next launch on the same allocation, by a sweep when
// the number of allocations tracked has doubled, or when the memory is released), so the record stays as large as
// the work in flight. The record is split into shards, each with its own lock, so launches on different tables
// rarely wait for one another.
//
// Nothing is recorded for work captured into a CUDA graph (device_access.h, note_uva_use): its kernels run at each
// replay, which no event recorded at capture could stand for, and events may not be queried while a capture runs.
#pragma once

#include <cstddef>

#ifdef SPEEDTORCH_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace speedtorch {

enum class UvaAccess { kRead, kWrite };

#ifdef SPEEDTORCH_WITH_CUDA

// Records that work just enqueued on `stream` (of `device`) accesses the allocation starting at `key`.
void note_uva_access(const void* key, UvaAccess access, int device, cudaStream_t stream);

// Blocks the calling thread until the pending UVA accesses to `key` that conflict with a host access of the given
// kind have completed.
void wait_for_uva_conflicts(const void* key, UvaAccess host_access);

// Blocks until every pending UVA access to an allocation whose key lies in [begin, begin + bytes) has completed,
// and forgets those allocations: the memory is about to be unregistered or unmapped. Never throws (destructors
// call it); a failed wait (a broken CUDA context) is reported on stderr.
void release_uva_accesses_in(const void* begin, std::size_t bytes) noexcept;

// How many allocations have pending (or not yet dropped) accesses recorded; for tests.
std::size_t tracked_allocation_count();
#else
// Without CUDA nothing accesses host memory asynchronously.
inline void wait_for_uva_conflicts(const void*, UvaAccess) {}
inline void release_uva_accesses_in(const void*, std::size_t) noexcept {}
inline std::size_t tracked_allocation_count() { return 0; }
#endif

}  // namespace speedtorch
