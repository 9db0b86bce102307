// The host<->GPU transfer engine and device-resident row operations (see row_transfer_cuda.h).
//
// Ordering: every kernel runs on the caller's current stream. Staged copies run on a pooled copy stream that first
// waits for the caller's stream (so it never touches memory the caller's earlier work still uses) and, for a
// gather, is waited for by the caller's stream before the call returns: later work on the caller's stream sees all
// rows. The staged share itself is done by the calling thread before the call returns.
#include "transfer/row_transfer_cuda.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <optional>

#include "cpu/index_range_check.h"
#include "cpu/row_copy_cpu.h"
#include "cpu/table_views.h"
#include "cuda/device_index_error.h"
#include "cuda/row_kernels.h"
#include "transfer/device_access.h"
#include "transfer/host_access_tracker.h"
#include "transfer/staging_ring.h"
#include "transfer/transfer_policy.h"

namespace speedtorch {
namespace {

// Below this many rows, sorting costs more than the translation misses it saves.
constexpr int64_t kMinSortedRows = 4096;

// The UVA share (the first `count` entries of `dev_idx`) as the kernels take it: sorted by table bucket, with each
// entry's batch position, when the rows touched span more than the GPU translates quickly; as given otherwise.
struct UvaShare {
  at::Tensor sorted;
  at::Tensor positions;
  GpuIndices view;
};

UvaShare uva_share(const at::Tensor& dev_idx, int64_t count, const at::Tensor& table, int64_t footprint,
                   const TransferConfig& config, int device, cudaStream_t stream) {
  UvaShare share;
  share.view = GpuIndices{dev_idx.const_data_ptr(), dev_idx.scalar_type() == at::kLong, count, nullptr};
  if (!config.sort_uva_indices || footprint <= config.uva_reach_bytes || count < kMinSortedRows) return share;
  const LocalitySortPlan plan =
      plan_locality_sort(share.view, table.size(0), table.stride(0) * table.element_size());
  const auto on_device = dev_idx.options();
  share.sorted = at::empty({count}, on_device);
  share.positions = at::empty({count}, on_device.dtype(at::kLong));
  const at::Tensor iota = at::empty({count}, on_device.dtype(at::kLong));
  const at::Tensor temp = at::empty({static_cast<int64_t>(plan.temp_bytes)}, on_device.dtype(at::kByte));
  launch_locality_sort(share.view, plan, temp.data_ptr(), share.sorted.data_ptr(),
                       share.positions.data_ptr<int64_t>(), iota.data_ptr<int64_t>(), full_grid(device), stream);
  share.view.data = share.sorted.const_data_ptr();
  share.view.positions = share.positions.const_data_ptr<int64_t>();
  return share;
}

// What a GPU scatter needs before it writes: one writer per row (the last occurrence) and an abort flag that a
// bad index sets, so the write is all or nothing.
struct WriterMask {
  at::Tensor keep;
  at::Tensor abort;
};

WriterMask mark_writers(const at::Tensor& dev_idx, int64_t num_rows, int device, cudaStream_t stream) {
  const int64_t count = dev_idx.numel();
  const auto on_device = dev_idx.options();
  WriterMask mask{at::empty({count}, on_device.dtype(at::kByte)), at::zeros({1}, on_device.dtype(at::kInt))};
  const at::Tensor scratch = at::empty({last_occurrence_scratch_bytes(count)}, on_device.dtype(at::kByte));
  launch_mark_last_occurrence(GpuIndices{dev_idx.const_data_ptr(), dev_idx.scalar_type() == at::kLong, count},
                              num_rows, scratch.data_ptr(), mask.keep.data_ptr<uint8_t>(),
                              mask.abort.data_ptr<int32_t>(), device_index_error_record(device), full_grid(device),
                              stream);
  return mask;
}

GpuRows gpu_rows(const at::Tensor& table, char* base) {
  return GpuRows{base, table.size(0), table.stride(0) * table.element_size(), table.size(1) * table.element_size()};
}

GpuIndices gpu_indices(const at::Tensor& indices, int64_t count) {
  return GpuIndices{indices.const_data_ptr(), indices.scalar_type() == at::kLong, count};
}

// Copy stream ordered after everything enqueued so far on `stream`.
c10::cuda::CUDAStream copy_stream_after(const c10::cuda::CUDAStream& stream, cudaEvent_t event, int device) {
  c10::cuda::CUDAStream copy = c10::cuda::getStreamFromPool(/*isHighPriority=*/false,
                                                            static_cast<c10::DeviceIndex>(device));
  C10_CUDA_CHECK(cudaEventRecord(event, stream.stream()));
  C10_CUDA_CHECK(cudaStreamWaitEvent(copy.stream(), event, 0));
  return copy;
}

// Whole rows per chunk: at least one, the ring being sized for the rows (staging_chunk_bytes_for).
int64_t rows_per_staging_chunk(const StagingRing& ring, const HostRows& rows) {
  const int64_t n = ring.chunk_bytes() / rows.row_bytes;
  TORCH_INTERNAL_ASSERT(n >= 1, "staging chunk of ", ring.chunk_bytes(), " bytes cannot hold a row of ",
                        rows.row_bytes, " bytes");
  return n;
}

// Staged gather of positions [first, count): CPU threads fill a chunk, the copy engine moves it while the next fills.
template <typename Index>
void staged_gather(const HostRows& rows, const Index* host_idx, int64_t first, int64_t count, char* out_device,
                   StagingRing& ring, cudaStream_t copy) {
  const int64_t rows_per_chunk = rows_per_staging_chunk(ring, rows);
  int slot = 0;
  for (int64_t begin = first; begin < count; begin += rows_per_chunk, slot = (slot + 1) % StagingRing::kChunks) {
    const int64_t n = std::min(rows_per_chunk, count - begin);
    C10_CUDA_CHECK(cudaEventSynchronize(ring.chunk_event(slot)));  // its previous copy has left the chunk
    gather_rows_cpu(rows, host_idx + begin, n, ring.chunk(slot));
    C10_CUDA_CHECK(cudaMemcpyAsync(out_device + begin * rows.row_bytes, ring.chunk(slot), n * rows.row_bytes,
                                   cudaMemcpyHostToDevice, copy));
    C10_CUDA_CHECK(cudaEventRecord(ring.chunk_event(slot), copy));
  }
}

// Staged scatter of positions [first, count): the copy engine brings chunks down ahead, CPU threads write the rows.
template <typename Index>
void staged_scatter(const HostRows& rows, const Index* host_idx, int64_t first, int64_t count, const char* src_device,
                    const uint8_t* host_keep, StagingRing& ring, cudaStream_t copy) {
  const int64_t rows_per_chunk = rows_per_staging_chunk(ring, rows);
  const int64_t chunks = (count - first + rows_per_chunk - 1) / rows_per_chunk;
  auto issue = [&](int64_t chunk) {
    const int slot = static_cast<int>(chunk % StagingRing::kChunks);
    const int64_t begin = first + chunk * rows_per_chunk;
    const int64_t n = std::min(rows_per_chunk, count - begin);
    C10_CUDA_CHECK(cudaEventSynchronize(ring.chunk_event(slot)));  // an earlier transfer may still use the chunk
    C10_CUDA_CHECK(cudaMemcpyAsync(ring.chunk(slot), src_device + begin * rows.row_bytes, n * rows.row_bytes,
                                   cudaMemcpyDeviceToHost, copy));
    C10_CUDA_CHECK(cudaEventRecord(ring.chunk_event(slot), copy));
  };
  for (int64_t c = 0; c < std::min<int64_t>(chunks, StagingRing::kChunks); ++c) issue(c);
  for (int64_t c = 0; c < chunks; ++c) {
    const int slot = static_cast<int>(c % StagingRing::kChunks);
    const int64_t begin = first + c * rows_per_chunk;
    const int64_t n = std::min(rows_per_chunk, count - begin);
    C10_CUDA_CHECK(cudaEventSynchronize(ring.chunk_event(slot)));
    // Chunks are written in order, so across chunks the last occurrence of a row still lands last.
    scatter_rows_cpu(rows, host_idx + begin, n, ring.chunk(slot), host_keep ? host_keep + (begin - first) : nullptr);
    if (c + StagingRing::kChunks < chunks) issue(c + StagingRing::kChunks);
  }
}

}  // namespace

void gather_pinned_to_cuda(const at::Tensor& table, const at::Tensor& indices, at::Tensor& out, const char* op) {
  const int device = out.get_device();
  c10::cuda::CUDAGuard guard(out.device());
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  const int64_t count = indices.numel();
  const HostRows rows = host_rows(table);
  const TransferConfig config = transfer_config();
  const void* key = table.storage().data();

  // Indices are validated before anything is launched, and their span sizes the plan. CUDA indices come to the
  // host only when the staged path needs them.
  std::optional<IndexSpan> span = validate_indices(indices, rows.num_rows, stream.stream(), op);
  const int64_t footprint = touched_bytes(rows.num_rows, rows.row_stride_bytes, span);
  const TransferPlan plan = plan_transfer(config, footprint, rows.row_bytes, count, at::get_num_threads());
  at::Tensor host_idx;
  if (indices.is_cpu() || plan.staged_rows > 0) host_idx = indices.cpu();
  if (!span.has_value() && host_idx.defined()) span = check_index_tensor(host_idx, rows.num_rows, op);
  char* out_ptr = static_cast<char*>(out.data_ptr());
  // The copy stream is ordered after the caller's earlier work but not after the UVA kernel: they run together.
  std::optional<BorrowedStagingRing> ring;
  std::optional<c10::cuda::CUDAStream> copy;
  if (plan.staged_rows > 0) {
    ring.emplace(device, staging_chunk_bytes_for(config, rows.row_bytes));
    copy = copy_stream_after(stream, (*ring)->start_event(), device);
  }
  if (plan.uva_rows > 0) {
    const at::Tensor dev_idx =
        indices_on(indices.is_cpu() ? indices.narrow(0, 0, plan.uva_rows) : indices, out.device());
    const UvaShare share = uva_share(dev_idx, plan.uva_rows, table, footprint, config, device, stream.stream());
    launch_row_gather(gpu_rows(table, mapped_address(table, op, "table")), share.view, out_ptr, device_index_error_record(device),
                      uva_max_blocks(device, config), stream.stream());
    note_uva_use(table, UvaAccess::kRead, stream);
  }
  if (plan.staged_rows > 0) {
    wait_for_uva_conflicts(key, UvaAccess::kRead);
    with_index_type(host_idx, [&](const auto* p) {
      staged_gather(rows, p, plan.uva_rows, count, out_ptr, **ring, copy->stream());
    });
    C10_CUDA_CHECK(cudaEventRecord((*ring)->done_event(), copy->stream()));
    C10_CUDA_CHECK(cudaStreamWaitEvent(stream.stream(), (*ring)->done_event(), 0));
  }
}

void scatter_cuda_to_pinned(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src,
                            const char* op) {
  const int device = src.get_device();
  c10::cuda::CUDAGuard guard(src.device());
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  const int64_t count = indices.numel();
  const HostRows rows = host_rows(table);
  const TransferConfig config = transfer_config();
  const void* key = table.storage().data();

  std::optional<IndexSpan> span = validate_indices(indices, rows.num_rows, stream.stream(), op);
  const int64_t footprint = touched_bytes(rows.num_rows, rows.row_stride_bytes, span);
  const TransferPlan plan = plan_transfer(config, footprint, rows.row_bytes, count, at::get_num_threads());
  at::Tensor host_idx;
  if (indices.is_cpu() || plan.staged_rows > 0) host_idx = indices.cpu();
  if (!span.has_value() && host_idx.defined()) span = check_index_tensor(host_idx, rows.num_rows, op);
  // The CPU writes below must not overtake UVA kernels still reading or writing these rows.
  if (plan.staged_rows > 0) wait_for_uva_conflicts(key, UvaAccess::kWrite);

  // One writer per row, as soon as a GPU kernel writes any share; bad CUDA indices abort the whole write.
  at::Tensor dev_idx;
  WriterMask writers;
  if (plan.uva_rows > 0) {
    dev_idx = indices_on(indices, src.device());
    writers = mark_writers(dev_idx, rows.num_rows, device, stream.stream());
  }
  // The copy stream waits for src and the keep mask, not for the UVA kernel launched next: they run together.
  std::optional<BorrowedStagingRing> ring;
  std::optional<c10::cuda::CUDAStream> copy;
  at::Tensor host_keep;
  if (plan.staged_rows > 0) {
    ring.emplace(device, staging_chunk_bytes_for(config, rows.row_bytes));
    copy = copy_stream_after(stream, (*ring)->start_event(), device);
    if (writers.keep.defined()) {
      host_keep = at::empty({plan.staged_rows}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
      C10_CUDA_CHECK(cudaMemcpyAsync(host_keep.data_ptr(), writers.keep.const_data_ptr<uint8_t>() + plan.uva_rows,
                                     plan.staged_rows, cudaMemcpyDeviceToHost, copy->stream()));
    }
  }
  if (plan.uva_rows > 0) {
    const UvaShare share = uva_share(dev_idx, plan.uva_rows, table, footprint, config, device, stream.stream());
    launch_row_scatter(gpu_rows(table, mapped_address(table, op, "table")), share.view,
                       static_cast<const char*>(src.const_data_ptr()), writers.keep.const_data_ptr<uint8_t>(),
                       writers.abort.const_data_ptr<int32_t>(), device_index_error_record(device),
                       uva_max_blocks(device, config), stream.stream());
    note_uva_use(table, UvaAccess::kWrite, stream);
  }
  if (plan.staged_rows > 0) {
    with_index_type(host_idx, [&](const auto* p) {
      staged_scatter(rows, p, plan.uva_rows, count, static_cast<const char*>(src.const_data_ptr()),
                     host_keep.defined() ? host_keep.const_data_ptr<uint8_t>() : nullptr, **ring, copy->stream());
    });
    // Every chunk copy (and the keep copy before them) was waited for: the copy stream holds nothing of ours.
  }
}

void gather_cuda_table(const at::Tensor& table, const at::Tensor& indices, at::Tensor& out, const char* op) {
  const int device = table.get_device();
  c10::cuda::CUDAGuard guard(table.device());
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  // Bad indices raise here; in deferred mode or under capture the kernels flag them (cuda/device_index_error.h).
  validate_indices(indices, table.size(0), stream.stream(), op);
  const at::Tensor dev_idx = indices_on(indices, table.device());
  launch_row_gather(gpu_rows(table, static_cast<char*>(table.data_ptr())), gpu_indices(dev_idx, indices.numel()),
                    static_cast<char*>(out.data_ptr()), device_index_error_record(device),
                    full_grid(device), stream.stream());
}

void scatter_cuda_table(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src, const char* op) {
  const int device = table.get_device();
  c10::cuda::CUDAGuard guard(table.device());
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  // Bad indices raise here; in deferred mode or under capture the kernels flag them (cuda/device_index_error.h).
  validate_indices(indices, table.size(0), stream.stream(), op);
  const at::Tensor dev_idx = indices_on(indices, table.device());
  const WriterMask writers = mark_writers(dev_idx, table.size(0), device, stream.stream());
  launch_row_scatter(gpu_rows(table, static_cast<char*>(table.data_ptr())), gpu_indices(dev_idx, indices.numel()),
                     static_cast<const char*>(src.const_data_ptr()), writers.keep.const_data_ptr<uint8_t>(),
                     writers.abort.const_data_ptr<int32_t>(), device_index_error_record(device), full_grid(device),
                     stream.stream());
}

}  // namespace speedtorch
