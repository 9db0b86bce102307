// Row copies by CPU threads at their place in a CUDA stream, moved by the copy engines (see stream_ordered_staging.h).
#include "transfer/stream_ordered_staging.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>

#include "cpu/helped_parallel_for.h"
#include "cpu/index_range_check.h"
#include "cpu/row_copy_cpu.h"
#include "cpu/table_views.h"
#include "cuda/device_index_error.h"
#include "transfer/device_access.h"

namespace speedtorch {
namespace {

// What one host function needs, as raw pointers: the buffers stay alive through the pinned allocator's record of
// the stream and the table through the host access tracker, so the function releases no tensor (freeing one may
// call CUDA, which a host function must not).
struct HostRowCopy {
  HostRows table;
  const void* indices;
  bool long_indices;
  int64_t count;
  char* staging;  // `count` dense rows of table.row_bytes
  bool gather;    // table -> staging; else staging -> table
  bool check;     // the indices were not validated before (deferred mode)
  int device;
  int threads;  // at::get_num_threads() where the copy was asked for (the host function's thread has its own)
};

template <typename Index>
void copy_rows(const HostRowCopy& c, const Index* indices) {
  if (c.check) {
    const IndexRangeViolation bad = find_index_out_of_range(indices, c.count, c.table.num_rows);
    if (bad.found) {  // nothing is copied: a gather's rows stay unwritten, a scatter writes none
      flag_index_error_from_host(c.device, bad.value, bad.position, c.table.num_rows);
      return;
    }
  }
  if (c.gather) {
    gather_rows_cpu(c.table, indices, c.count, c.staging);
  } else {
    scatter_rows_cpu(c.table, indices, c.count, c.staging);
  }
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

at::Tensor pinned_bytes(int64_t bytes) {
  return at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
}

// The indices where the host function reads them: host ones copied now (the caller may change its tensor once the
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

HostRowCopy row_copy(const at::Tensor& table, const at::Tensor& idx, const at::Tensor& staging, bool gather,
                     bool checked, const c10::cuda::CUDAStream& stream) {
  // check_deferred_index_errors visits the devices that have a record: this one must, to report the host's flag.
  if (!checked) (void)device_index_error_record(stream.device_index());
  return HostRowCopy{host_rows(table), idx.const_data_ptr(), idx.scalar_type() == at::kLong, idx.numel(),
                     static_cast<char*>(staging.data_ptr()), gather, !checked, stream.device_index(),
                     at::get_num_threads()};
}

}  // namespace

void gather_pinned_in_stream_order(const at::Tensor& table, const at::Tensor& indices, at::Tensor& out,
                                   bool checked, const c10::cuda::CUDAStream& stream) {
  const int64_t count = indices.numel();
  if (count == 0) return;
  const int64_t bytes = count * table.size(1) * table.element_size();
  const at::Tensor idx = host_indices(indices, stream);
  const at::Tensor staging = pinned_bytes(bytes);
  enqueue_host_row_copy(row_copy(table, idx, staging, /*gather=*/true, checked, stream), stream.stream());
  note_uva_use(table, UvaAccess::kRead, stream);
  C10_CUDA_CHECK(cudaMemcpyAsync(out.data_ptr(), staging.const_data_ptr(), bytes, cudaMemcpyHostToDevice,
                                 stream.stream()));
  note_uva_use(idx, UvaAccess::kRead, stream);
  note_uva_use(staging, UvaAccess::kRead, stream);
}

void scatter_pinned_in_stream_order(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src,
                                    bool checked, const c10::cuda::CUDAStream& stream) {
  const int64_t count = indices.numel();
  if (count == 0) return;
  const int64_t bytes = count * table.size(1) * table.element_size();
  const at::Tensor staging = pinned_bytes(bytes);
  C10_CUDA_CHECK(cudaMemcpyAsync(staging.data_ptr(), src.const_data_ptr(), bytes, cudaMemcpyDeviceToHost,
                                 stream.stream()));
  const at::Tensor idx = host_indices(indices, stream);
  enqueue_host_row_copy(row_copy(table, idx, staging, /*gather=*/false, checked, stream), stream.stream());
  note_uva_use(table, UvaAccess::kWrite, stream);
  note_uva_use(idx, UvaAccess::kRead, stream);
  note_uva_use(staging, UvaAccess::kRead, stream);
}

}  // namespace speedtorch
