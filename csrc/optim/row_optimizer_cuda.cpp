// GPU routes of the fused row optimizer (see row_optimizer.h).
//
// The batch is de-duplicated on the GPU (sorted distinct rows, gradients summed per row). For a pinned host table,
// the kernel updates the sorted rows over UVA; with an explicit uva_fraction, CPU threads update a share in place
// after its gradients come down (the automatic setting keeps every row on the GPU: measured faster). Everything
// table-sized stays in host memory.
#include "optim/row_optimizer_cuda.h"

#include <ATen/Parallel.h>
#include <ATen/ops/_unique2.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cpu/row_optimizer_cpu.h"
#include "cuda/row_optimizer_kernel.h"
#include "optim/row_optimizer.h"
#include "transfer/device_access.h"
#include "transfer/host_access_tracker.h"
#include "transfer/transfer_policy.h"

namespace speedtorch {

void apply_row_optimizer_cuda(const at::Tensor& weights, const at::Tensor& state, const at::Tensor& indices,
                              const at::Tensor& grad, const OptimizerHyper& hyper, int64_t global_step,
                              const char* op) {
  // The GPU that does the work: the table's, or the gradients' for a host table.
  const at::Device device = weights.is_cuda() ? weights.device() : grad.device();
  TORCH_CHECK(device.is_cuda(), op, ": a host table needs its gradients on a GPU or on the CPU, got ", grad.device());
  c10::cuda::CUDAGuard guard(device);
  const int dev = device.index();
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device.index());
  const int64_t num_rows = weights.size(0);
  const int64_t dim = weights.size(1);

  const std::optional<IndexSpan> span = validate_indices(indices, num_rows, stream.stream(), op);
  TORCH_CHECK(span.has_value(), op, ": optimizer steps check their indices before updating anything, which waits "
              "for the stream; they cannot run with deferred index checks or under CUDA graph capture");
  const at::Tensor dev_idx = indices_on(indices, device).to(at::kLong);
  const auto [unique, inverse, counts] = at::_unique2(dev_idx, /*sorted=*/true, /*return_inverse=*/true);
  const at::Tensor summed = at::zeros({unique.numel(), dim}, grad.options().device(device).dtype(at::kFloat))
                                .index_add_(0, inverse, grad.to(device, at::kFloat));
  const int64_t count = unique.numel();
  const TransferConfig config = transfer_config();

  if (weights.is_cuda()) {
    const OptimizerRows rows = optimizer_rows(weights, state, static_cast<char*>(weights.data_ptr()),
                                              state.data_ptr<float>());
    launch_row_optimizer(rows, hyper, global_step, unique.const_data_ptr<int64_t>(), summed.const_data_ptr<float>(),
                         count, full_grid(dev), config.optimizer_vec4, stream.stream());
    return;
  }

  // Pinned host table: split the distinct rows between the UVA kernel and CPU threads.
  const bool side_by_side = state.storage().data() == weights.storage().data();
  const int64_t record_stride = side_by_side ? weights.stride(0) * weights.element_size()
                                             : weights.stride(0) * weights.element_size() + state.stride(0) * 4;
  const int64_t row_bytes = dim * weights.element_size() + state.size(1) * 4;
  // Automatic: all rows over UVA. The vectorized kernel reached 65% of the PCIe bound alone on the H100 and only
  // 40% with a CPU share (the share's gradients must come down first, and its threads contend with the kernel's
  // traffic for host memory; bench/experiments/fused_step_variants.py). An explicit uva_fraction still splits.
  TransferPlan plan;
  if (config.uva_fraction < 0) {
    plan.uva_rows = count;
  } else {
    plan = plan_transfer(config, touched_bytes(num_rows, record_stride, span), row_bytes, count,
                         at::get_num_threads());
  }
  const void* weights_key = weights.storage().data();
  const void* state_key = state.storage().data();
  at::Tensor host_rows;
  at::Tensor host_grads;
  if (plan.staged_rows > 0) {
    // The CPU share is disjoint from the kernel's, so only UVA work enqueued before this step can conflict with
    // it: wait for that now, before our own kernel is noted.
    wait_for_uva_conflicts(weights_key, UvaAccess::kWrite);
    if (state_key != weights_key) wait_for_uva_conflicts(state_key, UvaAccess::kWrite);
    host_rows = unique.narrow(0, plan.uva_rows, plan.staged_rows).to(at::kCPU);
    host_grads = summed.narrow(0, plan.uva_rows, plan.staged_rows).to(at::kCPU);
  }
  if (plan.uva_rows > 0) {
    const OptimizerRows rows = optimizer_rows(weights, state, mapped_address(weights, op, "weights"),
                                              reinterpret_cast<float*>(mapped_address(state, op, "state")));
    launch_row_optimizer(rows, hyper, global_step, unique.const_data_ptr<int64_t>(), summed.const_data_ptr<float>(),
                         plan.uva_rows, uva_max_blocks(dev, config), config.optimizer_vec4, stream.stream());
    note_uva_use(weights, UvaAccess::kWrite, stream);
    if (state_key != weights_key) note_uva_use(state, UvaAccess::kWrite, stream);
  }
  if (plan.staged_rows > 0) {  // runs while the kernel updates the other share
    const OptimizerRows rows = optimizer_rows(weights, state, static_cast<char*>(weights.data_ptr()),
                                              state.data_ptr<float>());
    apply_row_optimizer_cpu(rows, hyper, global_step, host_rows.const_data_ptr<int64_t>(),
                            host_grads.const_data_ptr<float>(), plan.staged_rows);
  }
}

}  // namespace speedtorch
