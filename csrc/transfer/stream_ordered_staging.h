// Pinned host table <-> GPU rows with no SM and no wait on the calling thread: CPU threads copy the rows at their
// place in the caller's CUDA stream, the copy engines move them (the option stream_ordered_staging,
// transfer/transfer_policy.h).
//
// Why: a UVA kernel moves rows at the link's rate but takes SMs and memory bandwidth from the model's kernels beside
// it (a pipelined DLRM step: the model's memory-bound kernels ran 1.3-3.9x slower beside the row kernels, issue 30);
// the staged path of the transfer engine takes no SM, but its CPU copies run on the calling thread before the call
// returns, which then queues the model's next kernels late. Here the CPU copies are a host function in the stream
// (cudaLaunchHostFunc) that hands the rows to speedtorch's helper threads (cpu/helped_parallel_for.h): the call
// only enqueues, and later work on the stream sees the rows as after any other transfer.
//
// A gather enqueues: the indices to pinned host memory (CUDA indices: a copy), then for each chunk of rows
// (staging_chunk_bytes) a host function gathering them into a chunk of a pooled staging ring (transfer/
// staging_ring.h), whose copy to `out` runs on a pooled copy stream while the next chunk is gathered. A scatter: the
// chunks of `src` come down on the copy stream, and a host function on the caller's stream writes each into the table
// once it has arrived (in order, so the last occurrence of a duplicate index lands last). A ring's chunk is reused
// once the stream that last used it is past that use (its event, waited for on a stream): the pinned memory is a
// ring's, whatever the transfer's size. The index copy comes from PyTorch's pinned allocator, which keeps the block
// until the stream is past its use; the table's accesses are recorded for the host access tracker like a UVA
// kernel's, so CPU access and freeing the table wait for them.
//
// Limit: the CUDA driver runs every host function of a process on one thread, one at a time (bench/experiments/
// host_function_concurrency.py: four streams' 0.2 s host functions took 0.8 s), so two stream-ordered transfers on
// different streams (a step's write-back, the next batch's gather) copy one after the other on the CPU.
//
// Indices are validated by the caller before anything is enqueued, as for every route; in deferred mode the host
// function checks them itself and flags a bad one for speedtorch.check_index_errors (cuda/device_index_error.h):
// a gather then reads no row (`out` gets whatever the staging chunks held), a scatter writes nothing. Not for CUDA
// graph capture (a host function in a graph would replay a copy of buffers freed since) nor pageable tables: the
// caller routes those elsewhere.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>

namespace speedtorch {

// out[i] = table[indices[i]]: `table` pinned host rows (2-D, strided rows), `out` contiguous on the stream's GPU.
// `checked`: the indices were validated already (the host function then does not check them again).
void gather_pinned_in_stream_order(const at::Tensor& table, const at::Tensor& indices, at::Tensor& out,
                                   bool checked, const c10::cuda::CUDAStream& stream);

// table[indices[i]] = src[i], `src` contiguous on the stream's GPU; duplicate indices: the last occurrence wins.
void scatter_pinned_in_stream_order(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src,
                                    bool checked, const c10::cuda::CUDAStream& stream);

}  // namespace speedtorch
