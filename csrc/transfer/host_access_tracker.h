// Orders CPU-thread access to a pinned table after the GPU kernels still reading or writing it over UVA.
//
// A UVA kernel runs later, on its stream; the staged path and the CPU operators touch the same host rows at once,
// on the calling thread. Without ordering, a gather could read a row before an earlier scatter's kernel wrote it, or
// a scatter could overwrite a row an earlier gather's kernel has not read yet. Each UVA launch records an event
// against the table's allocation; host access waits for the pending events that conflict (writes before reads;
// reads and writes before writes), and only for those: work on the stream that does not touch the table is not
// waited for.
#pragma once

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
#else
// Without CUDA nothing accesses host memory asynchronously.
inline void wait_for_uva_conflicts(const void*, UvaAccess) {}
#endif

}  // namespace speedtorch
