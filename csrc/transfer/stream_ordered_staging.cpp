// Row copies by CPU threads at their place in a CUDA stream, moved by the copy engines (see stream_ordered_staging.h).
#include "transfer/stream_ordered_staging.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>

#include "cpu/helped_parallel_for.h"
#include "cpu/index_range_check.h"
#include "cpu/row_copy_cpu.h"
#include "cpu/table_views.h"
#include "cuda/device_index_error.h"
#include "metrics/transfer_counters.h"
#include "transfer/device_access.h"
#include "transfer/staging_ring.h"
#include "transfer/transfer_policy.h"

namespace speedtorch {
namespace {

// What one host function needs, as raw pointers: the staging chunks are pooled (transfer/staging_ring.h), the indices
// stay alive through the pinned allocator's record of the stream and the table through the host access tracker, so
// the function releases no tensor (freeing one may call CUDA, which a host function must not). A transfer is cut
// into chunks, one host function each, so that the copy engine moves one chunk while the CPU threads copy the next.
struct HostRowCopy {
  HostRows table;
  const void* indices;  // the whole transfer's
  bool long_indices;
  int64_t count;        // the whole transfer's
  int64_t begin, end;   // this chunk's positions
  char* staging;        // this chunk's rows, dense
  bool gather;          // table -> staging; else staging -> table
  bool check;           // the first chunk of a transfer whose indices were not validated: check them all first
  int device;
  int threads;          // stream_ordered_threads where the copy was asked for (the host function's thread has its own)
  std::shared_ptr<std::atomic<bool>> bad;  // the check failed: no chunk copies anything
};

template <typename Index>
void copy_rows(const HostRowCopy& c, const Index* indices) {
  if (c.check) {
    const IndexRangeViolation bad = find_index_out_of_range(indices, c.count, c.table.num_rows);
    if (bad.found) {  // no row is read from the table or written to it
      flag_index_error_from_host(c.device, bad.value, bad.position, c.table.num_rows);
      c.bad->store(true);
    }
  }
  if (c.bad->load()) return;
  const auto start = std::chrono::steady_clock::now();
  if (c.gather) {
    gather_rows_cpu(c.table, indices + c.begin, c.end - c.begin, c.staging);
  } else {
    scatter_rows_cpu(c.table, indices + c.begin, c.end - c.begin, c.staging);
  }
  const auto took = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start);
  metrics::add_stream_ordered_copy_time(c.gather ? metrics::Direction::kGather : metrics::Direction::kScatter,
                                        took.count());
}

void CUDART_CB run_host_row_copy(void* data) {
  const std::unique_ptr<HostRowCopy> c(static_cast<HostRowCopy*>(data));
  const HelpedThreadCount threads(c->threads);
  try {
    if (c->long_indices) {
      copy_rows(*c, static_cast<const int64_t*>(c->indices));
    } else {
      copy_rows(*c, static_cast<const int32_t*>(c->indices));
    }
  } catch (const std::exception& e) {
    // Only the helpers' bookkeeping allocates here. Nothing may leave a host function, and a copy half done would
    // train on wrong rows without a word: stop the process with the reason instead.
    std::fprintf(stderr, "speedtorch: a stream-ordered row copy failed (%s); aborting\n", e.what());
    std::abort();
  }
}

void enqueue_host_row_copy(const HostRowCopy& copy, cudaStream_t stream) {
  auto task = std::make_unique<HostRowCopy>(copy);
  C10_CUDA_CHECK(cudaLaunchHostFunc(stream, run_host_row_copy, task.get()));
  task.release();  // the host function owns it now
}

// `waiter` waits for everything enqueued on `stream` so far.
void wait_for(cudaStream_t waiter, cudaStream_t stream) {
  cudaEvent_t event = nullptr;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  cudaError_t status = cudaEventRecord(event, stream);
  if (status == cudaSuccess) status = cudaStreamWaitEvent(waiter, event, 0);
  C10_CUDA_CHECK_WARN(cudaEventDestroy(event));  // its resources go once the wait is done
  C10_CUDA_CHECK(status);
}

// The indices where the host functions read them: host ones copied now (the caller may change its tensor once the
// call returns), CUDA ones copied on the stream, after whatever made them.
at::Tensor host_indices(const at::Tensor& indices, const c10::cuda::CUDAStream& stream) {
  const at::Tensor flat = indices.reshape({-1});
  if (flat.is_cpu()) return private_pinned_copy(flat.contiguous());
  const at::Tensor here = indices_on(flat, at::Device(at::kCUDA, stream.device_index())).contiguous();
  at::Tensor host = at::empty({here.numel()}, here.options().device(at::kCPU).pinned_memory(true));
  C10_CUDA_CHECK(cudaMemcpyAsync(host.data_ptr(), here.const_data_ptr(), here.nbytes(), cudaMemcpyDeviceToHost,
                                 stream.stream()));
  return host;
}

int copy_threads(const TransferConfig& config) {
  if (config.stream_ordered_threads > 0) return static_cast<int>(config.stream_ordered_threads);
  return at::get_num_threads();
}

// One transfer's chunks, in a staging ring borrowed for the enqueueing (each chunk holds staging_chunk_bytes of
// rows, at least one row; chunk c uses the ring's slot c % kChunks), and the fields every chunk's host function
// shares. A slot is reused once the stream that last used it is past that use: the slot's event, waited for on a
// stream, never by the host.
struct ChunkedCopy {
  HostRowCopy first;
  int64_t row_bytes;
  BorrowedStagingRing ring;
  int64_t rows_per_chunk;

  ChunkedCopy(const at::Tensor& table, const at::Tensor& idx, bool gather, bool checked,
              const c10::cuda::CUDAStream& stream, const TransferConfig& config = transfer_config())
      : row_bytes(table.size(1) * table.element_size()),
        ring(stream.device_index(), staging_chunk_bytes_for(config, std::max<int64_t>(1, row_bytes))),
        rows_per_chunk(std::max<int64_t>(1, ring->chunk_bytes() / std::max<int64_t>(1, row_bytes))) {
    // check_deferred_index_errors visits the devices that have a record: this one must, to report the host's flag.
    if (!checked) (void)device_index_error_record(stream.device_index());
    first = HostRowCopy{host_rows(table), idx.const_data_ptr(), idx.scalar_type() == at::kLong, idx.numel(), 0, 0,
                        nullptr, gather, !checked, stream.device_index(), copy_threads(config),
                        std::make_shared<std::atomic<bool>>(false)};
  }

  int64_t count() const { return first.count; }
  int64_t end_of(int64_t begin) const { return std::min(count(), begin + rows_per_chunk); }
  int slot_of(int64_t begin) const { return static_cast<int>((begin / rows_per_chunk) % StagingRing::kChunks); }
  char* staging(int64_t begin) const { return ring->chunk(slot_of(begin)); }

  // `stream` waits until the slot of the chunk at `begin` is free (its last user is done with it).
  void wait_for_slot(int64_t begin, cudaStream_t stream) const {
    C10_CUDA_CHECK(cudaStreamWaitEvent(stream, ring->chunk_event(slot_of(begin)), 0));
  }
  // The slot of the chunk at `begin` is free once `stream` is past this point.
  void release_slot(int64_t begin, cudaStream_t stream) const {
    C10_CUDA_CHECK(cudaEventRecord(ring->chunk_event(slot_of(begin)), stream));
  }

  // Enqueues the host function of the chunk starting at `begin` on `stream`.
  void enqueue(int64_t begin, cudaStream_t stream) const {
    HostRowCopy chunk = first;
    chunk.begin = begin;
    chunk.end = end_of(begin);
    chunk.staging = staging(begin);
    chunk.check = first.check && begin == 0;
    enqueue_host_row_copy(chunk, stream);
  }
};

}  // namespace

void gather_pinned_in_stream_order(const at::Tensor& table, const at::Tensor& indices, at::Tensor& out,
                                   bool checked, const c10::cuda::CUDAStream& stream) {
  if (indices.numel() == 0) return;
  const at::Tensor idx = host_indices(indices, stream);
  const ChunkedCopy chunks(table, idx, /*gather=*/true, checked, stream);
  // The host functions fill the chunks in order on the caller's stream; the copy engine moves each, on a stream of
  // its own, while the next is filled.
  const c10::cuda::CUDAStream copy = c10::cuda::getStreamFromPool(false, stream.device_index());
  wait_for(copy.stream(), stream.stream());  // `out` may still be in use by the caller's earlier work
  for (int64_t begin = 0; begin < chunks.count(); begin = chunks.end_of(begin)) {
    chunks.wait_for_slot(begin, stream.stream());
    chunks.enqueue(begin, stream.stream());
    wait_for(copy.stream(), stream.stream());
    C10_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(out.data_ptr()) + begin * chunks.row_bytes,
                                   chunks.staging(begin), (chunks.end_of(begin) - begin) * chunks.row_bytes,
                                   cudaMemcpyHostToDevice, copy.stream()));
    chunks.release_slot(begin, copy.stream());
  }
  wait_for(stream.stream(), copy.stream());
  note_uva_use(table, UvaAccess::kRead, stream);
  note_uva_use(idx, UvaAccess::kRead, stream);
}

void scatter_pinned_in_stream_order(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src,
                                    bool checked, const c10::cuda::CUDAStream& stream) {
  if (indices.numel() == 0) return;
  const at::Tensor idx = host_indices(indices, stream);
  const ChunkedCopy chunks(table, idx, /*gather=*/false, checked, stream);
  // The copy engine brings each chunk down on a stream of its own; the host functions, in order on the caller's
  // stream (so a later duplicate still lands last), write each into the table once it has arrived.
  const c10::cuda::CUDAStream copy = c10::cuda::getStreamFromPool(false, stream.device_index());
  wait_for(copy.stream(), stream.stream());  // what made `src`
  for (int64_t begin = 0; begin < chunks.count(); begin = chunks.end_of(begin)) {
    chunks.wait_for_slot(begin, copy.stream());
    C10_CUDA_CHECK(cudaMemcpyAsync(chunks.staging(begin),
                                   static_cast<const char*>(src.const_data_ptr()) + begin * chunks.row_bytes,
                                   (chunks.end_of(begin) - begin) * chunks.row_bytes, cudaMemcpyDeviceToHost,
                                   copy.stream()));
    wait_for(stream.stream(), copy.stream());
    chunks.enqueue(begin, stream.stream());
    chunks.release_slot(begin, stream.stream());
  }
  note_uva_use(table, UvaAccess::kWrite, stream);
  note_uva_use(idx, UvaAccess::kRead, stream);
}

}  // namespace speedtorch
