// Fused row optimizer: checks, de-duplication, routing (see row_optimizer.h); the CPU route.
#include "optim/row_optimizer.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <c10/util/Exception.h>

#include <cstdint>

#include "core/checked_size.h"
#include "core/memory_overlap.h"
#include "cpu/distinct_indices_cpu.h"
#include "cpu/index_range_check.h"
#include "cpu/row_optimizer_cpu.h"
#include "cpu/row_sum_cpu.h"
#include "cpu/table_views.h"
#include "memory/pinned_host_buffer.h"
#include "metrics/transfer_counters.h"
#include "memory/host_access_tracker.h"
#ifdef SPEEDTORCH_WITH_CUDA
#include "optim/row_optimizer_cuda.h"
#include "transfer/device_access.h"
#endif

namespace speedtorch {
namespace {

WeightType weight_type(c10::ScalarType t) {
  switch (t) {
    case at::kFloat: return WeightType::kFloat;
    case at::kHalf: return WeightType::kHalf;
    case at::kBFloat16: return WeightType::kBFloat16;
    default: break;
  }
  TORCH_CHECK(false, "speedtorch optimizer: weights must be float32, float16 or bfloat16, got ", t);
}

}  // namespace

int64_t optimizer_record_stride_bytes(const at::Tensor& weights, const at::Tensor& state) {
  const int64_t weights_stride = weights.stride(0) * weights.element_size();
  const int64_t state_stride = state.stride(0) * state.element_size();
  // Read from the addresses, not the storages: PinnedEmbedding's weights and state are views of one buffer, each
  // with a storage of its own (tensor_over), so their storage pointers always differ.
  const auto weights_at = reinterpret_cast<std::uintptr_t>(weights.data_ptr());
  const auto state_at = reinterpret_cast<std::uintptr_t>(state.data_ptr());
  const auto weights_bytes = static_cast<std::uintptr_t>(weights.size(1) * weights.element_size());
  const auto state_bytes = static_cast<std::uintptr_t>(state.size(1) * state.element_size());
  const bool beside = weights_stride == state_stride && state_at >= weights_at + weights_bytes &&
                      state_at + state_bytes <= weights_at + static_cast<std::uintptr_t>(weights_stride);
  return beside ? weights_stride : weights_stride + state_stride;
}

OptimizerRows optimizer_rows(const at::Tensor& weights, const at::Tensor& state, char* weights_base,
                             float* state_base) {
  return OptimizerRows{weights_base,    weights.stride(0) * weights.element_size(), weight_type(weights.scalar_type()),
                       state_base,      state.stride(0),                             weights.size(1),
                       weights.size(0)};
}

namespace {

// a * b of sizes, symbolic or not; checked against overflow when both are known (meta tensors may be huge).
c10::SymInt sym_mul(const c10::SymInt& a, const c10::SymInt& b, const char* op) {
  const auto x = a.maybe_as_int();
  const auto y = b.maybe_as_int();
  if (x && y) return c10::SymInt(checked_mul(*x, *y, op));
  return a * b;
}

}  // namespace

// Sizes are read as SymInts: under torch.compile / export with dynamic shapes this runs as the Meta kernel on
// tensors whose sizes are symbols (numel() or size() would throw there).
void check_row_optimizer_arguments(const at::Tensor& weights, const at::Tensor& state, const at::Tensor& indices,
                                   const at::Tensor& grad, const OptimizerHyper& hyper, int64_t global_step,
                                   const char* op) {
  TORCH_CHECK(global_step >= 1, op, ": step must be >= 1, got ", global_step);
  TORCH_CHECK(weights.dim() == 2 && weights.sym_stride(1) == 1, op,
              ": weights must be 2-D (num_rows, dim) with contiguous rows, got shape ", weights.sym_sizes(),
              " and strides ", weights.sym_strides());
  weight_type(weights.scalar_type());
  const c10::SymInt& n = weights.sym_size(0);
  const c10::SymInt& d = weights.sym_size(1);
  const c10::SymInt need = sym_mul(state_slots(hyper), d, op) + kStateHeaderFloats;
  TORCH_CHECK(state.dim() == 2 && state.scalar_type() == at::kFloat && state.sym_size(0) == n &&
                  state.sym_stride(1) == 1 && state.sym_size(1) >= need,
              op, ": state must be float32 (", n, ", >= ", need, ") with contiguous rows for this optimizer, got ",
              state.scalar_type(), " of shape ", state.sym_sizes());
  TORCH_CHECK(state.device() == weights.device(), op, ": state is on ", state.device(), " but weights are on ",
              weights.device());
  TORCH_CHECK(indices.scalar_type() == at::kLong || indices.scalar_type() == at::kInt, op,
              ": indices must be int64 or int32, got ", indices.scalar_type());
  TORCH_CHECK(at::isFloatingType(grad.scalar_type()), op, ": grad must be floating point, got ",
              grad.scalar_type());
  TORCH_CHECK(grad.dim() >= 1 && grad.sym_size(-1) == d && grad.sym_numel() == sym_mul(indices.sym_numel(), d, op),
              op, ": grad must have shape indices.shape + (", d, ",) = ", indices.sym_numel(), " rows, got ",
              grad.sym_sizes());
}

IndexSpan check_sorted_unique_indices(const at::Tensor& indices, int64_t num_rows, const char* op) {
  const at::Tensor flat = indices.reshape({-1});
  if (flat.is_cpu()) return check_sorted_unique_index_tensor(flat.contiguous(), num_rows, op);
  if (flat.numel() == 0) return IndexSpan{};
#ifdef SPEEDTORCH_WITH_CUDA
  // One summary kernel and one wait (transfer/device_access.h); the host words the error.
  const at::Tensor contiguous = flat.contiguous();
  const IndexSummary summary = summarize_cuda_indices(contiguous);
  if (summary.first_not_increasing >= 0 || summary.min < 0 || summary.max >= num_rows) {
    check_sorted_unique_index_tensor(contiguous.cpu(), num_rows, op);  // throws with the position
  }
  return IndexSpan{summary.min, summary.max};
#else
  TORCH_CHECK(false, op, ": this speedtorch library was built without CUDA");
#endif
}

std::pair<at::Tensor, at::Tensor> sum_duplicate_rows_cpu(const at::Tensor& indices, const at::Tensor& grad) {
  const at::Tensor idx = indices.contiguous();
  const int64_t count = idx.numel();
  const at::Tensor distinct = at::empty({count}, idx.options().dtype(at::kLong));
  const at::Tensor inverse = at::empty({count}, idx.options().dtype(at::kLong));
  int64_t num_distinct = 0;
  with_index_type(idx, [&](const auto* p) {
    num_distinct = distinct_indices_cpu(p, count, distinct.data_ptr<int64_t>(), inverse.data_ptr<int64_t>());
  });
  const at::Tensor grad_float = grad.to(at::kCPU, at::kFloat).contiguous();
  at::Tensor summed = at::empty({num_distinct, grad.size(1)}, grad_float.options());
  sum_rows_by_index_cpu(inverse.const_data_ptr<int64_t>(), count, grad_float.const_data_ptr<float>(), grad.size(1),
                        summed.data_ptr<float>(), num_distinct);
  return {distinct.narrow(0, 0, num_distinct), summed};
}

void check_updated_rows(const at::Tensor& updated_rows, const at::Tensor& weights, const at::Tensor& indices,
                        const at::Device& device, bool sorted_unique, const char* op) {
  TORCH_CHECK(sorted_unique, op, ": updated_rows needs sorted_unique=True (row i of updated_rows is the row of "
              "indices[i], which de-duplication would reorder)");
  TORCH_CHECK(updated_rows.dim() == 2 && updated_rows.size(0) == indices.numel() &&
                  updated_rows.size(1) == weights.size(1),
              op, ": updated_rows must have shape (", indices.numel(), ", ", weights.size(1), ") (one row per index), "
              "got ", updated_rows.sizes());
  TORCH_CHECK(updated_rows.scalar_type() == weights.scalar_type(), op, ": updated_rows must have the table's dtype ",
              weights.scalar_type(), ", got ", updated_rows.scalar_type());
  TORCH_CHECK(updated_rows.is_contiguous(), op, ": updated_rows must be contiguous");
  TORCH_CHECK(updated_rows.device() == device, op, ": updated_rows must be on ", device,
              " (where the step runs), got ", updated_rows.device());
  check_no_overlap(weights, "the weights", updated_rows, "updated_rows", op);
}

void check_step_inputs_apart(const at::Tensor& weights, const at::Tensor& state, const at::Tensor& indices,
                             const at::Tensor& grad, const char* op) {
  for (const at::Tensor* written : {&weights, &state}) {
    const char* name = written == &weights ? "the weights" : "the optimizer state";
    check_no_overlap(*written, name, grad, "grad", op);
    check_no_overlap(*written, name, indices, "indices", op);
  }
}

void apply_row_optimizer(const at::Tensor& weights, const at::Tensor& state, const at::Tensor& indices,
                         const at::Tensor& grad, const OptimizerHyper& hyper, int64_t global_step, const char* op,
                         bool sorted_unique, const std::optional<at::Tensor>& updated_rows) {
  check_row_optimizer_arguments(weights, state, indices, grad, hyper, global_step, op);
  check_step_inputs_apart(weights, state, indices, grad, op);
  if (updated_rows.has_value()) {
    const at::Device device = weights.is_cuda() ? weights.device() : grad.device();
    check_updated_rows(*updated_rows, weights, indices, device, sorted_unique, op);
  }
  // Before any route: the CPU writing a mode 'r' mapping is a SIGSEGV, a GPU writing it ruins the CUDA context.
  check_host_memory_writable(weights, op, "weights");
  check_host_memory_writable(state, op, "state");
  if (indices.numel() == 0) return;
  const at::Tensor flat = indices.reshape({-1});
  if (weights.size(1) == 0) {
    // Rows of no columns: nothing to update, but bad indices still raise (checked on the host: any device).
    const at::Tensor host = flat.cpu().contiguous();
    sorted_unique ? check_sorted_unique_index_tensor(host, weights.size(0), op)
                  : check_index_tensor(host, weights.size(0), op);
    return;
  }
  const at::Tensor rows_grad = grad.reshape({flat.numel(), weights.size(1)});
  if (weights.is_cuda() || rows_grad.is_cuda()) {
#ifdef SPEEDTORCH_WITH_CUDA
    // A GPU kernel writes the rows and state in place: host memory GPUs may only read is refused up front.
    for (const at::Tensor* t : {&weights, &state}) {
      TORCH_CHECK(!t->is_cpu() || !is_device_read_only_host_memory(t->storage().data()), op, ": ",
                  t == &weights ? "the table" : "the optimizer state", " is mapped from a file that GPUs may only "
                  "read (mode 'r', or 'r+' where Linux refuses writable GPU pins of shared file pages: anything but "
                  "tmpfs); pass CPU gradients, or open it with mode 'c' and save() checkpoints, or load() it");
    }
    return apply_row_optimizer_cuda(weights, state, flat, rows_grad, hyper, global_step, op, sorted_unique,
                                    updated_rows);
#else
    TORCH_CHECK(false, op, ": this speedtorch library was built without CUDA");
#endif
  }
  // CPU threads update the rows: indices on a GPU come to the host (CUDA indices with CPU rows and gradients).
  const at::Tensor idx = flat.to(at::kCPU).contiguous();
  at::Tensor unique;
  at::Tensor summed;
  if (sorted_unique) {
    // Already one gradient per distinct row: checked, then used as they are.
    check_sorted_unique_indices(idx, weights.size(0), op);
    unique = idx.to(at::kLong);
    summed = rows_grad.to(at::kFloat).contiguous();
  } else {
    check_index_tensor(idx, weights.size(0), op);
    std::tie(unique, summed) = sum_duplicate_rows_cpu(idx, rows_grad);
  }
  wait_for_uva_conflicts(weights.storage().data(), UvaAccess::kWrite);
  wait_for_uva_conflicts(state.storage().data(), UvaAccess::kWrite);
  const OptimizerRows rows = optimizer_rows(weights, state, static_cast<char*>(weights.data_ptr()),
                                            state.data_ptr<float>());
  apply_row_optimizer_cpu(rows, hyper, global_step, unique.const_data_ptr<int64_t>(),
                          summed.const_data_ptr<float>(), unique.numel());
  if (updated_rows.has_value()) {  // host memory: no link to cross
    at::Tensor out = *updated_rows;
    at::index_select_out(out, weights, 0, unique);
  }
  metrics::add_optimizer_step(idx.numel(), unique.numel());
  metrics::add_optimizer_rows(metrics::OptimizerRoute::kCpu, unique.numel());
}

}  // namespace speedtorch
