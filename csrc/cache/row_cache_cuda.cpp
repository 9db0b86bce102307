// GPU routes of RowCache (see row_cache_cuda.h).
#include "cache/row_cache_cuda.h"

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/_unique2.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

#include "cuda/row_cache_kernel.h"
#include "cuda/row_optimizer_kernel.h"
#include "metrics/transfer_counters.h"
#include "optim/row_optimizer.h"
#include "transfer/device_access.h"
#include "memory/host_access_tracker.h"
#include "transfer/transfer_policy.h"

namespace speedtorch {

namespace {

c10::cuda::CUDAStream current_stream(const at::Tensor& on) {
  return c10::cuda::getCurrentCUDAStream(on.device().index());
}

// The current stream waits (on the GPU) for the cache's previous call when that ran on another stream, and the slot
// tensors are marked as used there, so the caching allocator keeps them until that work is done.
void enter_stream(std::optional<c10::Stream>& last_stream, const CacheTensors& slots,
                  const c10::cuda::CUDAStream& stream) {
  if (last_stream.has_value() && *last_stream != stream.unwrap()) {
    at::cuda::CUDAEvent previous;
    previous.record(c10::cuda::CUDAStream(*last_stream));
    previous.block(stream);
    for (const at::Tensor* t : {&slots.ids, &slots.ticks, &slots.dirty, &slots.state_loaded, &slots.set_locks,
                               &slots.rows, &slots.state}) {
      if (t->defined()) c10::cuda::CUDACachingAllocator::recordStream(t->storage().data_ptr(), stream);
    }
  }
  last_stream = stream.unwrap();
}

CacheHostRows mapped_host_rows(const at::Tensor& table, const at::Tensor& state, const char* op) {
  CacheHostRows h{};
  h.rows = mapped_address(table, op, "table");
  h.row_stride_bytes = table.stride(0) * table.element_size();
  h.num_rows = table.size(0);
  h.row_bytes = table.size(1) * table.element_size();
  if (state.defined()) {
    h.state = reinterpret_cast<float*>(mapped_address(state, op, "state"));
    h.state_stride_floats = state.stride(0);
    h.state_floats = state.size(1);
  }
  return h;
}

// Write-backs and host-side updates write the host table over UVA: host access waits for them.
void note_host_writes(const at::Tensor& table, const at::Tensor& state, const c10::cuda::CUDAStream& stream) {
  note_uva_use(table, UvaAccess::kWrite, stream);
  if (state.defined() && state.storage().data() != table.storage().data()) {
    note_uva_use(state, UvaAccess::kWrite, stream);
  }
}

}  // namespace

at::Tensor cache_ids_on_gpu(std::optional<c10::Stream>& last_stream, const CacheTensors& slots,
                            const at::Tensor& indices,
                            int64_t num_rows, at::Device device, const char* op) {
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device.index());
  enter_stream(last_stream, slots, stream);
  const at::Tensor flat = indices.reshape({-1});
  const std::optional<IndexSpan> span = validate_indices(flat, num_rows, stream.stream(), op);
  TORCH_CHECK(span.has_value(), op, ": a table with a row cache checks its indices before using them, which waits "
              "for the stream; it cannot run with deferred index checks (speedtorch.set_deferred_index_checks) or "
              "inside CUDA graph capture; disable_cache() first");
  return indices_on(flat, device).to(at::kLong).contiguous();
}

at::Tensor assign_cache_slots_gpu(const CacheSlots& cache, const at::Tensor& table,
                                  const at::Tensor& state, const at::Tensor& ids, int64_t now, bool for_update,
                                  const char* op) {
  const c10::cuda::CUDAStream stream = current_stream(ids);
  const CacheHostRows host = mapped_host_rows(table, state, op);
  const int64_t count = ids.numel();
  at::Tensor slot_of = at::empty({count}, ids.options());
  launch_assign_cache_slots(cache, host, ids.const_data_ptr<int64_t>(), count, now, for_update,
                            slot_of.data_ptr<int64_t>(), stream.stream());
  note_host_writes(table, state, stream);
  return slot_of;
}

at::Tensor read_cached_rows_gpu(const CacheSlots& cache, const at::Tensor& table,
                                const at::Tensor& state, const at::Tensor& ids, const at::Tensor& slot_of,
                                const char* op) {
  const c10::cuda::CUDAStream stream = current_stream(ids);
  const CacheHostRows host = mapped_host_rows(table, state, op);
  at::Tensor out = at::empty({ids.numel(), table.size(1)}, ids.options().dtype(table.scalar_type()));
  launch_read_cached_rows(cache, host, ids.const_data_ptr<int64_t>(), slot_of.const_data_ptr<int64_t>(), ids.numel(),
                          static_cast<char*>(out.data_ptr()), stream.stream());
  note_uva_use(table, UvaAccess::kRead, stream);
  return out;
}

std::pair<at::Tensor, at::Tensor> sum_duplicates_gpu(const at::Tensor& ids, const at::Tensor& grad) {
  // The host path's de-duplication (optim/row_optimizer_cuda.cpp): the same sums, bit for bit.
  const auto [unique, inverse, counts] = at::_unique2(ids, /*sorted=*/true, /*return_inverse=*/true);
  at::Tensor summed = at::zeros({unique.numel(), grad.size(1)}, grad.options().device(ids.device()).dtype(at::kFloat))
                          .index_add_(0, inverse, grad.to(ids.device(), at::kFloat));
  return {unique, summed};
}

void step_cached_rows_gpu(const at::Tensor& slot_rows, const at::Tensor& slot_state,
                          const at::Tensor& table, const at::Tensor& state, const at::Tensor& rows,
                          const at::Tensor& slot_of, const at::Tensor& grads, const OptimizerHyper& hyper,
                          int64_t global_step, const char* op) {
  const c10::cuda::CUDAStream stream = current_stream(rows);
  const int device = rows.device().index();
  const TransferConfig config = transfer_config();
  const OptimizerRows in_slots = optimizer_rows(slot_rows, slot_state, static_cast<char*>(slot_rows.data_ptr()),
                                                slot_state.data_ptr<float>());
  const int64_t on_host = (slot_of < 0).sum().item<int64_t>();  // waits: the usual case launches one kernel
  metrics::add_optimizer_rows(metrics::OptimizerRoute::kGpuTable, rows.numel() - on_host);
  metrics::add_optimizer_rows(metrics::OptimizerRoute::kUva, on_host);
  if (on_host == 0) {
    launch_row_optimizer(in_slots, hyper, global_step, slot_of.const_data_ptr<int64_t>(),
                         grads.const_data_ptr<float>(), rows.numel(), device_table_launch(device, config),
                         config.optimizer_vec4, device_index_error_record(device), stream.stream());
    return;
  }
  // Sets that overflowed in this call: those rows are updated where they are, on the host, over UVA.
  const at::Tensor cached = at::nonzero(slot_of >= 0).reshape({-1});
  const at::Tensor uncached = at::nonzero(slot_of < 0).reshape({-1});
  const at::Tensor cached_slots = slot_of.index_select(0, cached).contiguous();
  const at::Tensor cached_grads = grads.index_select(0, cached).contiguous();
  launch_row_optimizer(in_slots, hyper, global_step, cached_slots.const_data_ptr<int64_t>(),
                       cached_grads.const_data_ptr<float>(), cached_slots.numel(), device_table_launch(device, config),
                       config.optimizer_vec4, device_index_error_record(device), stream.stream());
  const at::Tensor host_rows = rows.index_select(0, uncached).contiguous();
  const at::Tensor host_grads = grads.index_select(0, uncached).contiguous();
  const OptimizerRows on_host_rows = optimizer_rows(table, state, mapped_address(table, op, "table"),
                                                    reinterpret_cast<float*>(mapped_address(state, op, "state")));
  launch_row_optimizer(on_host_rows, hyper, global_step, host_rows.const_data_ptr<int64_t>(),
                       host_grads.const_data_ptr<float>(), host_rows.numel(), uva_launch(device, config),
                       config.optimizer_vec4, device_index_error_record(device), stream.stream());
  note_host_writes(table, state, stream);
}

void flush_cache_gpu(std::optional<c10::Stream>& last_stream, const CacheSlots& cache, const at::Tensor& table,
                     const at::Tensor& state,
                     bool empty, const CacheTensors& slots, const char* op) {
  c10::cuda::CUDAGuard guard(slots.ids.device());
  const c10::cuda::CUDAStream stream = current_stream(slots.ids);
  enter_stream(last_stream, slots, stream);
  const CacheHostRows host = mapped_host_rows(table, state, op);
  launch_flush_cache_slots(cache, host, empty, stream.stream());
  note_host_writes(table, state, stream);
  // The host rows are read (or written) next, on this thread.
  wait_for_uva_conflicts(table.storage().data(), UvaAccess::kWrite);
  if (state.defined()) wait_for_uva_conflicts(state.storage().data(), UvaAccess::kWrite);
}

std::array<int64_t, 2> take_lookup_counts_gpu(const std::optional<c10::Stream>& last_stream, at::Tensor& lookups) {
  if (!last_stream.has_value()) return {0, 0};  // no call has run: nothing counted
  c10::cuda::CUDAGuard guard(lookups.device());
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(c10::cuda::CUDAStream(*last_stream).stream(), &capture));
  if (capture != cudaStreamCaptureStatusNone) return {0, 0};  // nothing may wait there now: counted at a later read
  // On the stream of the cache's last call: the copy waits for its kernels, and the zeroing comes before any later
  // call's (a call on another stream first waits for this one, enter_stream).
  const c10::cuda::CUDAStreamGuard on_last{c10::cuda::CUDAStream(*last_stream)};
  const at::Tensor held = lookups.to(at::kCPU);
  lookups.zero_();
  return {held[0].item<int64_t>(), held[1].item<int64_t>()};
}

void wait_for_cache_gpu(const std::optional<c10::Stream>& last_stream) {
  if (last_stream.has_value()) c10::cuda::CUDAStream(*last_stream).synchronize();
}

}  // namespace speedtorch
