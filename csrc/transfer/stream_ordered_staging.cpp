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
#include "transfer/transfer_policy.h"

namespace speedtorch {
namespace {

// What one host function needs, as raw pointers: the buffers stay alive through the pinned allocator's record of
// the stream and the table through the host access tracker, so the function releases no tensor (freeing one may
// call CUDA, which a host function must not). A transfer is cut into chunks, one host function each, so that the
// copy engine moves one chunk while the CPU threads copy the next.
struct HostRowCopy {
  HostRows table;
  const void* indices;  // the whole transfer's
  bool long_indices;
  int64_t count;        // the whole transfer's
  int64_t begin, end;   // this chunk's positions
  char* staging;        // the whole transfer's rows, dense
  bool gather;          // table -> staging; else staging -> table
  bool check;           // the first chunk of a transfer whose indices were not validated: check them all first
  int device;
  int threads;  // the option stream_ordered_threads where the copy was asked for (the host function's thread has its own)
  std::shared_ptr<std::atomic<bool>> bad;  // the check failed: no chunk copies anything
};

template <typename Index>
void copy_rows(const HostRowCopy& c, const Index* indices) {
  if (c.check) {
    const IndexRangeViolation bad = find_index_out_of_range(indices, c.count, c.table.num_rows);
    if (bad.found) {  // a gather's rows stay unwritten, a scatter writes none
      flag_index_error_from_host(c.device, bad.value, bad.position, c.table.num_rows);
      c.bad->store(true);
    }
  }
  if (c.bad->load()) return;
  const auto start = std::chrono::steady_clock::now();
  const int64_t offset = c.begin * c.table.row_bytes;
  if (c.gather) {
    gather_rows_cpu(c.table, indices + c.begin, c.end - c.begin, c.staging + offset);
  } else {
    scatter_rows_cpu(c.table, indices + c.begin, c.end - c.begin, c.staging + offset);
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

at::Tensor pinned_bytes(int64_t bytes) {
  return at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
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

// One transfer's chunks: the rows of each (staging_chunk_bytes of them, at least one row), and the fields every
// chunk's host function shares.
struct ChunkedCopy {
  HostRowCopy first;
  int64_t rows_per_chunk;

  ChunkedCopy(const at::Tensor& table, const at::Tensor& idx, const at::Tensor& staging, bool gather, bool checked,
              const c10::cuda::CUDAStream& stream) {
    const TransferConfig config = transfer_config();
    // check_deferred_index_errors visits the devices that have a record: this one must, to report the host's flag.
    if (!checked) (void)device_index_error_record(stream.device_index());
    first = HostRowCopy{host_rows(table), idx.const_data_ptr(), idx.scalar_type() == at::kLong, idx.numel(), 0, 0,
                        static_cast<char*>(staging.data_ptr()), gather, !checked, stream.device_index(),
                        copy_threads(config), std::make_shared<std::atomic<bool>>(false)};
    const int64_t row_bytes = std::max<int64_t>(1, first.table.row_bytes);
    rows_per_chunk = std::max<int64_t>(1, staging_chunk_bytes_for(config, row_bytes) / row_bytes);
  }

  // Enqueues the host function of the chunk starting at `begin` on `stream`; returns its end.
  int64_t enqueue(int64_t begin, cudaStream_t stream) const {
    HostRowCopy chunk = first;
    chunk.begin = begin;
    chunk.end = std::min(first.count, begin + rows_per_chunk);
    chunk.check = first.check && begin == 0;
    enqueue_host_row_copy(chunk, stream);
    return chunk.end;
  }
};

}  // namespace

void gather_pinned_in_stream_order(const at::Tensor& table, const at::Tensor& indices, at::Tensor& out,
                                   bool checked, const c10::cuda::CUDAStream& stream) {
  const int64_t count = indices.numel();
  if (count == 0) return;
  const int64_t row_bytes = table.size(1) * table.element_size();
  const at::Tensor idx = host_indices(indices, stream);
  const at::Tensor staging = pinned_bytes(count * row_bytes);
  const ChunkedCopy chunks(table, idx, staging, /*gather=*/true, checked, stream);
  // The copy engine on a stream of its own moves each chunk once its host function is done, while the next runs.
  const c10::cuda::CUDAStream copy = c10::cuda::getStreamFromPool(false, stream.device_index());
  wait_for(copy.stream(), stream.stream());  // `out` may still be in use by the caller's earlier work
  for (int64_t begin = 0; begin < count;) {
    const int64_t end = chunks.enqueue(begin, stream.stream());
    wait_for(copy.stream(), stream.stream());
    C10_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(out.data_ptr()) + begin * row_bytes,
                                   staging.const_data_ptr<uint8_t>() + begin * row_bytes, (end - begin) * row_bytes,
                                   cudaMemcpyHostToDevice, copy.stream()));
    begin = end;
  }
  wait_for(stream.stream(), copy.stream());
  note_uva_use(table, UvaAccess::kRead, stream);
  note_uva_use(idx, UvaAccess::kRead, stream);
  note_uva_use(staging, UvaAccess::kRead, stream);
}

void scatter_pinned_in_stream_order(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src,
                                    bool checked, const c10::cuda::CUDAStream& stream) {
  const int64_t count = indices.numel();
  if (count == 0) return;
  const int64_t row_bytes = table.size(1) * table.element_size();
  const at::Tensor idx = host_indices(indices, stream);
  const at::Tensor staging = pinned_bytes(count * row_bytes);
  const ChunkedCopy chunks(table, idx, staging, /*gather=*/false, checked, stream);
  // The copy engine brings each chunk down on a stream of its own; the host functions, in order on the caller's
  // stream (so a later duplicate still lands last), write each once it has arrived.
  const c10::cuda::CUDAStream copy = c10::cuda::getStreamFromPool(false, stream.device_index());
  wait_for(copy.stream(), stream.stream());  // what made `src`
  for (int64_t begin = 0; begin < count;) {
    const int64_t end = std::min(count, begin + chunks.rows_per_chunk);
    C10_CUDA_CHECK(cudaMemcpyAsync(staging.data_ptr<uint8_t>() + begin * row_bytes,
                                   static_cast<const char*>(src.const_data_ptr()) + begin * row_bytes,
                                   (end - begin) * row_bytes, cudaMemcpyDeviceToHost, copy.stream()));
    wait_for(stream.stream(), copy.stream());
    begin = chunks.enqueue(begin, stream.stream());
  }
  note_uva_use(table, UvaAccess::kWrite, stream);
  note_uva_use(idx, UvaAccess::kRead, stream);
  note_uva_use(staging, UvaAccess::kRead, stream);
}

}  // namespace speedtorch
