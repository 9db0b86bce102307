// GPU routes of the fused row optimizer (see row_optimizer.h).
//
// The batch is de-duplicated on the GPU (sorted distinct rows, gradients summed per row). For a pinned host table,
// the kernel updates the sorted rows over UVA; with an explicit uva_fraction, CPU threads update a share in place
// after its gradients come down (the automatic setting keeps every row on the GPU: measured faster). Everything
// table-sized stays in host memory.
#include "optim/row_optimizer_cuda.h"

#include <ATen/Parallel.h>
#include <ATen/ops/_unique2.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/le.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cpu/index_range_check.h"
#include "cpu/row_optimizer_cpu.h"
#include "cuda/device_index_error.h"
#include "cuda/row_optimizer_kernel.h"
#include "metrics/transfer_counters.h"
#include "optim/row_optimizer.h"
#include "transfer/device_access.h"
#include "memory/host_access_tracker.h"
#include "transfer/transfer_policy.h"

namespace speedtorch {
namespace {

// Indices checked before anything is updated, with their span. A step reads the indices back to the host (the
// de-duplication's output size) and waits for the stream, so it cannot be captured into a CUDA graph: refused with
// what to do instead. Under deferred index checks, CUDA indices told sorted_unique are not read back at all (no
// span: the host does not wait): the kernels check each row's range and that it is above the row before it,
// flagging what fails (speedtorch.check_index_errors() reports it) and leaving that row alone. Without the claim,
// de-duplication reads the batch back anyway, and the kernels check the range of what it returns.
std::optional<IndexSpan> validated_span(const at::Tensor& indices, int64_t num_rows, cudaStream_t stream,
                                        bool sorted_unique, const char* op) {
  TORCH_CHECK(!stream_is_capturing(stream), op, ": an optimizer step cannot be captured into a CUDA graph: it "
              "de-duplicates the batch (torch.unique), whose size only the host learns; run the step outside the "
              "captured region (capture the forward and backward only)");
  if (indices.is_cuda() && deferred_index_checks()) return std::nullopt;
  // CPU indices are checked on the host in any mode.
  return sorted_unique ? check_sorted_unique_indices(indices, num_rows, op)
                       : validate_indices(indices, num_rows, stream, op);
}

// One update per distinct row: the sorted distinct rows (int64, on the GPU) and their summed float32 gradients.
struct DistinctRows {
  at::Tensor rows;
  at::Tensor grads;
  int64_t count() const { return rows.numel(); }
};

DistinctRows sum_duplicate_rows(const at::Tensor& dev_idx, const at::Tensor& grad, const at::Device& device) {
  const auto [unique, inverse, counts] = at::_unique2(dev_idx, /*sorted=*/true, /*return_inverse=*/true);
  at::Tensor summed = at::zeros({unique.numel(), grad.size(1)}, grad.options().device(device).dtype(at::kFloat))
                          .index_add_(0, inverse, grad.to(device, at::kFloat));
  return {unique, summed};
}

// What a step asks of its kernels besides the update: the batch's updated rows also written to `updated` (when
// given), and the rows' order checked on the GPU (a sorted_unique claim the host did not check).
struct StepExtras {
  const std::optional<at::Tensor>& updated;
  bool rows_must_increase;
};

OptimizerRows with_extras(OptimizerRows rows, const StepExtras& extras) {
  if (extras.updated.has_value()) rows.updated = static_cast<char*>(extras.updated->data_ptr());
  rows.rows_must_increase = extras.rows_must_increase;
  return rows;
}

void step_gpu_resident_table(const at::Tensor& weights, const at::Tensor& state, const DistinctRows& batch,
                             const OptimizerHyper& hyper, int64_t global_step, int device, cudaStream_t stream,
                             const StepExtras& extras) {
  const OptimizerRows rows = with_extras(
      optimizer_rows(weights, state, static_cast<char*>(weights.data_ptr()), state.data_ptr<float>()), extras);
  const TransferConfig config = transfer_config();
  launch_row_optimizer(rows, hyper, global_step, batch.rows.const_data_ptr<int64_t>(),
                       batch.grads.const_data_ptr<float>(), batch.count(), device_table_launch(device, config),
                       config.optimizer_vec4, device_index_error_record(device), stream);
  metrics::add_optimizer_rows(metrics::OptimizerRoute::kGpuTable, batch.count());
}

// The split of a pinned table's distinct rows. Automatic: all rows over UVA. The vectorized kernel reached 65% of
// the PCIe bound alone on the H100 and only 40% with a CPU share (the share's gradients must come down first, and
// its threads contend with the kernel's traffic for host memory; bench/experiments/fused_step_variants.py). An
// explicit uva_fraction still splits, through the transfer policy, but only rows the host checked (`span`): CPU
// threads have no error record to flag a bad row in, so unchecked rows all go to the kernel.
TransferPlan plan_optimizer_split(const TransferConfig& config, const at::Tensor& weights, const at::Tensor& state,
                                  const std::optional<IndexSpan>& span, int64_t count) {
  if (config.uva_fraction < 0 || !span.has_value()) return TransferPlan{count, 0};
  const int64_t row_bytes = weights.size(1) * weights.element_size() + state.size(1) * state.element_size();
  return plan_transfer(config, touched_bytes(weights.size(0), optimizer_record_stride_bytes(weights, state), span), row_bytes,
                       count, at::get_num_threads());
}

// The CPU share of a pinned table's step: its rows and gradients, brought to the host after UVA work enqueued
// before this step (which may still use these rows) has completed.
struct CpuShare {
  at::Tensor rows;
  at::Tensor grads;
};

CpuShare cpu_share_after_earlier_uva_work(const at::Tensor& weights, const at::Tensor& state,
                                          const DistinctRows& batch, const TransferPlan& plan) {
  // Before our own kernel is noted: the CPU share is disjoint from the kernel's, so only earlier work conflicts.
  wait_for_uva_conflicts(weights.storage().data(), UvaAccess::kWrite);
  if (state.storage().data() != weights.storage().data()) {
    wait_for_uva_conflicts(state.storage().data(), UvaAccess::kWrite);
  }
  return {batch.rows.narrow(0, plan.uva_rows, plan.staged_rows).to(at::kCPU),
          batch.grads.narrow(0, plan.uva_rows, plan.staged_rows).to(at::kCPU)};
}

void launch_uva_share(const at::Tensor& weights, const at::Tensor& state, const DistinctRows& batch,
                      const OptimizerHyper& hyper, int64_t global_step, int64_t uva_rows,
                      const TransferConfig& config, const c10::cuda::CUDAStream& stream, const char* op,
                      const StepExtras& extras) {
  const OptimizerRows rows = with_extras(optimizer_rows(weights, state, mapped_address(weights, op, "weights"),
                                                        reinterpret_cast<float*>(mapped_address(state, op, "state"))),
                                         extras);
  const int device = stream.device_index();
  launch_row_optimizer(rows, hyper, global_step, batch.rows.const_data_ptr<int64_t>(),
                       batch.grads.const_data_ptr<float>(), uva_rows, uva_launch(device, config),
                       config.optimizer_vec4, device_index_error_record(device), stream.stream());
  note_uva_use(weights, UvaAccess::kWrite, stream);
  if (state.storage().data() != weights.storage().data()) note_uva_use(state, UvaAccess::kWrite, stream);
}

// Pinned host table: the kernel updates the first plan.uva_rows distinct rows over UVA while CPU threads update the
// rest in place.
void step_pinned_table(const at::Tensor& weights, const at::Tensor& state, const DistinctRows& batch,
                       const std::optional<IndexSpan>& span, const OptimizerHyper& hyper, int64_t global_step,
                       int device, const c10::cuda::CUDAStream& stream, const char* op, const StepExtras& extras) {
  const TransferConfig config = transfer_config();
  const TransferPlan plan = plan_optimizer_split(config, weights, state, span, batch.count());
  CpuShare cpu;
  if (plan.staged_rows > 0) cpu = cpu_share_after_earlier_uva_work(weights, state, batch, plan);
  if (plan.uva_rows > 0) {
    launch_uva_share(weights, state, batch, hyper, global_step, plan.uva_rows, config, stream, op, extras);
  }
  if (plan.staged_rows > 0) {  // runs while the kernel updates the other share
    const OptimizerRows rows =
        optimizer_rows(weights, state, static_cast<char*>(weights.data_ptr()), state.data_ptr<float>());
    apply_row_optimizer_cpu(rows, hyper, global_step, cpu.rows.const_data_ptr<int64_t>(),
                            cpu.grads.const_data_ptr<float>(), plan.staged_rows);
    if (extras.updated.has_value()) {  // the CPU share's new rows join the kernel's on the GPU
      extras.updated->narrow(0, plan.uva_rows, plan.staged_rows).copy_(weights.index_select(0, cpu.rows));
    }
  }
  metrics::add_optimizer_rows(metrics::OptimizerRoute::kUva, plan.uva_rows);
  metrics::add_optimizer_rows(metrics::OptimizerRoute::kCpu, plan.staged_rows);
}

}  // namespace

void apply_row_optimizer_cuda(const at::Tensor& weights, const at::Tensor& state, const at::Tensor& indices,
                              const at::Tensor& grad, const OptimizerHyper& hyper, int64_t global_step,
                              const char* op, bool sorted_unique, const std::optional<at::Tensor>& updated_rows) {
  // The GPU that does the work: the table's, or the gradients' for a host table.
  const at::Device device = weights.is_cuda() ? weights.device() : grad.device();
  TORCH_CHECK(device.is_cuda(), op, ": a host table needs its gradients on a GPU or on the CPU, got ", grad.device());
  c10::cuda::CUDAGuard guard(device);
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device.index());
  // The values checked are the values used: host indices are copied into memory of our own before the check (the
  // copy to the GPU is asynchronous, and would otherwise read the caller's tensor after the check, when a changed
  // id could reach the CPU share unchecked; the kernels check their rows themselves as well).
  const at::Tensor ids = indices.is_cpu() ? private_pinned_copy(indices) : indices;
  const std::optional<IndexSpan> span = validated_span(ids, weights.size(0), stream.stream(), sorted_unique, op);
  const at::Tensor dev_ids = (ids.is_cpu() ? ids.to(device, /*non_blocking=*/true) : indices_on(ids, device))
                                 .to(at::kLong);
  // Checked distinct: the rows and gradients go to the kernel as they are.
  const DistinctRows batch = sorted_unique ? DistinctRows{dev_ids, grad.to(device, at::kFloat).contiguous()}
                                           : sum_duplicate_rows(dev_ids, grad, device);
  const StepExtras extras{updated_rows, sorted_unique && !span.has_value()};
  if (weights.is_cuda()) {
    step_gpu_resident_table(weights, state, batch, hyper, global_step, device.index(), stream.stream(), extras);
  } else {
    step_pinned_table(weights, state, batch, span, hyper, global_step, device.index(), stream, op, extras);
  }
  metrics::add_optimizer_step(indices.numel(), batch.count());
}

}  // namespace speedtorch
