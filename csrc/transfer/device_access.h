// What every GPU route over a table needs: grid sizes, the GPU address of pinned host rows, indices brought to a
// device, and index validation before anything is launched. Shared by the transfer engine and the fused optimizer.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <optional>

#include "cpu/index_range_check.h"
#include "cuda/index_summary_kernel.h"
#include "cuda/row_kernels.h"
#include "memory/host_access_tracker.h"
#include "transfer/transfer_policy.h"

namespace speedtorch {

int sm_count(int device);
// A full machine of resident 256-thread blocks: the grid for helper kernels over device memory (sorts, masks).
int full_grid(int device);
// How the row kernels are launched over pinned host memory (transfer_policy.h: uva_blocks_per_sm blocks on each of
// at most max_sms SMs, uva_rows_in_flight rows in flight) and over device memory (a full machine of blocks on at
// most max_sms SMs, one row in flight: HBM's latency needs no more).
RowLaunch uva_launch(int device, const TransferConfig& config);
RowLaunch device_table_launch(int device, const TransferConfig& config);

// Whether `stream` is being captured into a CUDA graph. A captured op may enqueue GPU work only: no wait for the
// GPU, no event query, no host copy of device data, no work done by the calling thread (a replay skips it).
bool stream_is_capturing(cudaStream_t stream);

// The address a GPU kernel uses for element 0 of a pinned host tensor; a clear error when it is not mapped.
char* mapped_address(const at::Tensor& host, const char* op, const char* arg);

// Records that work just enqueued on `stream` reads or writes the pinned host tensor `host` over UVA: for the
// host_access_tracker (CPU access to the rows, and freeing our pinned buffers, wait for it), and for PyTorch's
// pinned-memory allocator when the memory is its own (Tensor.pin_memory()), which would otherwise hand the block
// to the next allocation as soon as the tensor is freed, while the kernel still writes it. Does nothing while
// `stream` is captured: the kernel runs at each replay, which neither record can see (and recording or querying
// their events during capture is not allowed); ordering replays with host access is the replaying caller's part.
void note_uva_use(const at::Tensor& host, UvaAccess access, const c10::cuda::CUDAStream& stream);

// Indices on `device`: as they are when already there; copied from another GPU; copied asynchronously from the
// host through a pinned copy taken at the call (so that changing the caller's tensor afterwards, pinned or not,
// cannot change what the kernels read).
at::Tensor indices_on(const at::Tensor& indices, const at::Device& device);

// Host indices copied now into pinned memory of our own (PyTorch's pinned allocator, which keeps the block until an
// asynchronous copy from it is done). A caller that checks these values and then copies them to the GPU with
// .to(device, non_blocking) uses exactly the values it checked, whatever the caller does to its own tensor.
at::Tensor private_pinned_copy(const at::Tensor& host_indices);

// Validates indices before anything is launched and returns their span: on the host for CPU indices; for CUDA
// indices with one one-block summary kernel (cuda/index_summary_kernel.h) and a wait for the indices' stream (the
// indices come to the host only to name a bad one). Both end in cpu/index_range_check.h (check_index_tensor), which
// words the error. `sorted`, when given, says whether CUDA indices are non-decreasing (a UVA share then needs no
// locality sort; false when unknown).
// Returns nothing in deferred mode or while `stream` is captured into a CUDA graph: no wait is allowed there, the
// kernels check instead and the error is raised later (cuda/device_index_error.h). CPU indices are refused under
// capture: the graph would replay their copy to the GPU from a temporary host buffer.
std::optional<IndexSpan> validate_indices(const at::Tensor& indices, int64_t num_rows, cudaStream_t stream,
                                          const char* op, bool* sorted = nullptr);

// The summary of CUDA indices (flat, contiguous, not empty), computed on their device's current stream and waited
// for.
IndexSummary summarize_cuda_indices(const at::Tensor& flat);

// Bytes of a table (num_rows rows, row_stride_bytes apart) that a batch touches: the span of its indices when
// known, else the whole table.
int64_t touched_bytes(int64_t num_rows, int64_t row_stride_bytes, const std::optional<IndexSpan>& span);

}  // namespace speedtorch
