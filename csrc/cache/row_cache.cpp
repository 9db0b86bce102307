// RowCache (see row_cache.h): argument checks, the slot tensors, and the CPU routes; the GPU routes are in
// row_cache_cuda.cpp. Both routes share the logic's description (row_cache_slots.h) and the optimizer's math.
#include "cache/row_cache.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <vector>

#include "cpu/index_range_check.h"
#include "cpu/row_cache_cpu.h"
#include "cpu/row_optimizer_cpu.h"
#include "memory/pinned_host_buffer.h"
#include "metrics/transfer_counters.h"
#include "optim/row_optimizer.h"
#include "memory/host_access_tracker.h"
#ifdef SPEEDTORCH_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cache/row_cache_cuda.h"
#endif

namespace speedtorch {
namespace {

CacheHostRows cpu_host_rows(const at::Tensor& table, const at::Tensor& state) {
  CacheHostRows h{};
  h.rows = static_cast<char*>(table.data_ptr());
  h.row_stride_bytes = table.stride(0) * table.element_size();
  h.num_rows = table.size(0);
  h.row_bytes = table.size(1) * table.element_size();
  if (state.defined()) {
    h.state = state.data_ptr<float>();
    h.state_stride_floats = state.stride(0);
    h.state_floats = state.size(1);
  }
  return h;
}

// CPU code is about to read and write the host rows: earlier GPU work over UVA on them must be done.
void wait_for_host_rows(const at::Tensor& table, const at::Tensor& state) {
  wait_for_uva_conflicts(table.storage().data(), UvaAccess::kWrite);
  if (state.defined()) wait_for_uva_conflicts(state.storage().data(), UvaAccess::kWrite);
}

}  // namespace

RowCache::RowCache(int64_t num_rows, at::Device device, const at::Tensor& table, const at::Tensor& state)
    : device_(device) {
  TORCH_CHECK(num_rows >= 1, "RowCache: num_rows (the cache's rows) must be >= 1, got ", num_rows);
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), "RowCache: device must be a CUDA device or the CPU, got ", device);
#ifndef SPEEDTORCH_WITH_CUDA
  TORCH_CHECK(device.is_cpu(), "RowCache: this speedtorch library was built without CUDA; device must be 'cpu', got ",
              device);
#endif
  TORCH_CHECK(table.dim() == 2 && table.stride(1) == 1 && table.is_cpu(), "RowCache: the table must be a 2-D host "
              "tensor with contiguous rows");
  if (device_.is_cuda() && !device_.has_index()) device_ = at::Device(at::kCUDA, 0);
  const int64_t rows = std::max<int64_t>(1, std::min(num_rows, table.size(0)));  // more slots than rows: no use
  ways_ = std::min(kWays, rows);
  sets_ = (rows + ways_ - 1) / ways_;
  const int64_t n = slots();
  const at::TensorOptions on = at::TensorOptions().device(device_);
  ids_ = at::full({n}, -1, on.dtype(at::kLong));
  ticks_ = at::full({n}, -1, on.dtype(at::kLong));
  dirty_ = at::zeros({n}, on.dtype(at::kInt));
  state_loaded_ = at::zeros({n}, on.dtype(at::kInt));
  if (device_.is_cuda()) set_locks_ = at::zeros({sets_}, on.dtype(at::kInt));
  rows_ = at::zeros({n, table.size(1)}, on.dtype(table.scalar_type()));
  if (state.defined()) state_ = at::zeros({n, state.size(1)}, on.dtype(at::kFloat));
  lookups_ = at::zeros({2}, on.dtype(at::kLong));
#ifdef SPEEDTORCH_WITH_CUDA
  // The fills above are queued on this stream: the first call, on whatever stream, must come after them.
  if (device_.is_cuda()) last_stream_ = c10::cuda::getCurrentCUDAStream(device_.index()).unwrap();
#endif
  fold_handle_ = metrics::add_counter_fold([this] { fold_counts(); });
}

RowCache::~RowCache() {
  metrics::remove_counter_fold(fold_handle_);  // waits for a fold in progress
  try {
    fold_counts();
  } catch (const std::exception&) {
    // A destructor must not throw; only the last calls' counts are lost (e.g. a CUDA context already gone at exit).
  }
}

void RowCache::fold_counts() {
  std::lock_guard<std::mutex> hold(mutex_);
  std::array<int64_t, 2> counts{0, 0};
  if (device_.is_cpu()) {
    int64_t* held = lookups_.data_ptr<int64_t>();
    counts = {held[0], held[1]};
    held[0] = held[1] = 0;
  } else {
#ifdef SPEEDTORCH_WITH_CUDA
    counts = take_lookup_counts_gpu(last_stream_, lookups_);
#endif
  }
  if (counts[0] == 0 && counts[1] == 0) return;
  metrics::add_cache_lookups(counts[0], counts[1]);
  // Hits are read from the cache's memory, misses from the host table (over UVA from a GPU).
  const int64_t row_bytes = rows_.size(1) * rows_.element_size();
  const bool gpu = device_.is_cuda();
  metrics::add_rows_moved(gpu ? metrics::TransferPath::kGpuTable : metrics::TransferPath::kCpu,
                          metrics::Direction::kGather, counts[0], row_bytes);
  metrics::add_rows_moved(gpu ? metrics::TransferPath::kUva : metrics::TransferPath::kCpu,
                          metrics::Direction::kGather, counts[1], row_bytes);
}

bool RowCache::fits(const at::Tensor& table, const at::Tensor& state) const {
  return table.size(1) == rows_.size(1) && table.scalar_type() == rows_.scalar_type() &&
         state.defined() == state_.defined() && (!state.defined() || state.size(1) == state_.size(1));
}

CacheSlots RowCache::view() {
  CacheSlots c{};
  c.ids = ids_.data_ptr<int64_t>();
  c.ticks = ticks_.data_ptr<int64_t>();
  c.dirty = dirty_.data_ptr<int32_t>();
  c.state_loaded = state_loaded_.data_ptr<int32_t>();
  if (set_locks_.defined()) c.set_locks = set_locks_.data_ptr<int32_t>();
  c.rows = static_cast<char*>(rows_.data_ptr());
  c.row_stride_bytes = rows_.stride(0) * rows_.element_size();
  if (state_.defined()) {
    c.state = state_.data_ptr<float>();
    c.state_stride_floats = state_.stride(0);
  }
  c.sets = sets_;
  c.ways = static_cast<int32_t>(ways_);
  c.lookups = lookups_.data_ptr<int64_t>();
  return c;
}

void RowCache::check_table(const at::Tensor& table, const at::Tensor& state, const char* op) const {
  TORCH_CHECK(fits(table, state), op, ": the row cache was built for another row or optimizer state layout; "
              "enable it again after set_optimizer");
}

at::Tensor RowCache::gather(const at::Tensor& table, const at::Tensor& state, const at::Tensor& indices,
                            std::optional<at::Device> device, const char* op) {
  std::lock_guard<std::mutex> hold(mutex_);
  check_table(table, state, op);
  TORCH_CHECK(indices.scalar_type() == at::kLong || indices.scalar_type() == at::kInt, op,
              ": indices must be int64 or int32, got ", indices.scalar_type());
  at::Device target = device.value_or(indices.device());
  if (target.is_cuda() && !target.has_index()) target = device_.is_cuda() ? device_ : at::Device(at::kCUDA, 0);
  std::vector<int64_t> shape = indices.sizes().vec();
  shape.push_back(table.size(1));
  const int64_t now = ++tick_;
  // Counted once the call went through (a bad index counts nothing); its rows are counted by fold_counts.
  const auto count_call = [&] {
    if (indices.numel() > 0) metrics::add_transfer_call(metrics::Direction::kGather);
  };
  if (device_.is_cpu()) {
    const at::Tensor ids = indices.reshape({-1}).to(at::kCPU).to(at::kLong).contiguous();
    check_index_tensor(ids, table.size(0), op);
    wait_for_host_rows(table, state);
    at::Tensor slot_of = at::empty({ids.numel()}, ids.options());
    const CacheSlots cache = view();
    const CacheHostRows host = cpu_host_rows(table, state);
    assign_cache_slots_cpu(cache, host, ids.const_data_ptr<int64_t>(), ids.numel(), now, false,
                           slot_of.data_ptr<int64_t>());
    at::Tensor out = at::empty({ids.numel(), table.size(1)}, at::TensorOptions().dtype(table.scalar_type()));
    read_cached_rows_cpu(cache, host, ids.const_data_ptr<int64_t>(), slot_of.const_data_ptr<int64_t>(), ids.numel(),
                         static_cast<char*>(out.data_ptr()));
    count_call();
    return out.reshape(shape).to(target);
  }
#ifdef SPEEDTORCH_WITH_CUDA
  c10::cuda::CUDAGuard guard(device_);
  const CacheTensors slots{ids_, ticks_, dirty_, state_loaded_, set_locks_, rows_, state_};
  const at::Tensor ids = cache_ids_on_gpu(last_stream_, slots, indices, table.size(0), device_, op);
  const CacheSlots cache = view();
  const at::Tensor slot_of = assign_cache_slots_gpu(cache, table, state, ids, now, false, op);
  at::Tensor out = read_cached_rows_gpu(cache, table, state, ids, slot_of, op).reshape(shape).to(target);
  count_call();
  return out;
#else
  TORCH_CHECK(false, op, ": this speedtorch library was built without CUDA");
#endif
}

void RowCache::apply_gradients(const at::Tensor& table, const at::Tensor& state, const at::Tensor& indices,
                               const at::Tensor& grad, const OptimizerHyper& hyper, int64_t global_step,
                               const char* op) {
  std::lock_guard<std::mutex> hold(mutex_);
  check_table(table, state, op);
  check_row_optimizer_arguments(table, state, indices, grad, hyper, global_step, op);
  check_step_inputs_apart(table, state, indices, grad, op);
  if (indices.numel() == 0) return;
  const at::Tensor rows_grad = grad.reshape({-1, table.size(1)});
  const int64_t now = ++tick_;
  if (device_.is_cpu()) {
    // The host CPU route's de-duplication (optim/row_optimizer.cpp): the same sums, bit for bit.
    const at::Tensor idx = indices.reshape({-1}).to(at::kCPU).contiguous();
    check_index_tensor(idx, table.size(0), op);
    const auto [unique, summed] = sum_duplicate_rows_cpu(idx, rows_grad);
    metrics::add_optimizer_step(idx.numel(), unique.numel());
    metrics::add_optimizer_rows(metrics::OptimizerRoute::kCpu, unique.numel());
    wait_for_host_rows(table, state);
    at::Tensor slot_of = at::empty({unique.numel()}, unique.options());
    const CacheSlots cache = view();
    assign_cache_slots_cpu(cache, cpu_host_rows(table, state), unique.const_data_ptr<int64_t>(), unique.numel(), now,
                           true, slot_of.data_ptr<int64_t>());
    const at::Tensor cached = at::nonzero(slot_of >= 0).reshape({-1});
    const at::Tensor uncached = at::nonzero(slot_of < 0).reshape({-1});
    const at::Tensor cached_slots = slot_of.index_select(0, cached).contiguous();
    const at::Tensor cached_grads = summed.index_select(0, cached).contiguous();
    apply_row_optimizer_cpu(
        optimizer_rows(rows_, state_, static_cast<char*>(rows_.data_ptr()), state_.data_ptr<float>()),
                            hyper, global_step, cached_slots.const_data_ptr<int64_t>(),
                            cached_grads.const_data_ptr<float>(), cached_slots.numel());
    if (uncached.numel() > 0) {  // sets that overflowed in this call: those rows are updated on the host
      const at::Tensor host_rows = unique.index_select(0, uncached).contiguous();
      const at::Tensor host_grads = summed.index_select(0, uncached).contiguous();
      apply_row_optimizer_cpu(
          optimizer_rows(table, state, static_cast<char*>(table.data_ptr()), state.data_ptr<float>()), hyper,
          global_step, host_rows.const_data_ptr<int64_t>(), host_grads.const_data_ptr<float>(), host_rows.numel());
    }
    return;
  }
#ifdef SPEEDTORCH_WITH_CUDA
  // Updated rows go back to the host over UVA (write-backs, and rows of overflowing sets): refused up front for host
  // memory GPUs may only read, as the host path refuses it (a GPU write there ruins the CUDA context).
  for (const at::Tensor* t : {&table, &state}) {
    TORCH_CHECK(!is_device_read_only_host_memory(t->storage().data()), op, ": ",
                t == &table ? "the table" : "the optimizer state", " is mapped from a file that GPUs may only read "
                "(mode 'r', or 'r+' where Linux refuses writable GPU pins of shared file pages: anything but tmpfs), "
                "and a row cache on a GPU writes updated rows back over UVA; disable_cache() and pass CPU gradients, "
                "or open it with mode 'c' and save() checkpoints, or load() it");
  }
  c10::cuda::CUDAGuard guard(device_);
  const CacheTensors slots{ids_, ticks_, dirty_, state_loaded_, set_locks_, rows_, state_};
  const at::Tensor ids = cache_ids_on_gpu(last_stream_, slots, indices, table.size(0), device_, op);
  const auto [unique, summed] = sum_duplicates_gpu(ids, rows_grad);
  metrics::add_optimizer_step(ids.numel(), unique.numel());  // the routes: step_cached_rows_gpu
  const at::Tensor slot_of = assign_cache_slots_gpu(view(), table, state, unique, now, true, op);
  step_cached_rows_gpu(rows_, state_, table, state, unique, slot_of, summed, hyper, global_step, op);
#else
  TORCH_CHECK(false, op, ": this speedtorch library was built without CUDA");
#endif
}

void RowCache::flush(const at::Tensor& table, const at::Tensor& state, bool empty) {
  std::lock_guard<std::mutex> hold(mutex_);
  check_table(table, state, "RowCache.flush");
  if (device_.is_cpu()) {
    wait_for_host_rows(table, state);
    flush_cache_slots_cpu(view(), cpu_host_rows(table, state), empty);
    return;
  }
#ifdef SPEEDTORCH_WITH_CUDA
  const CacheTensors slots{ids_, ticks_, dirty_, state_loaded_, set_locks_, rows_, state_};
  flush_cache_gpu(last_stream_, view(), table, state, empty, slots, "RowCache.flush");
#endif
}

int64_t RowCache::cached_rows() {
  std::lock_guard<std::mutex> hold(mutex_);
#ifdef SPEEDTORCH_WITH_CUDA
  if (device_.is_cuda()) {
    wait_for_cache_gpu(last_stream_);
  }
#endif
  return (ids_ >= 0).sum().item<int64_t>();
}

}  // namespace speedtorch
