// The backend kernels of gather / scatter_ as the dispatcher sees them: csrc/transfer/checked_row_transfer.h under
// the operators' names (argument checks, output allocation, routing). Registered for CPU and CUDA alike
// (ops/register_cpu.cpp, ops/register_cuda.cpp) because one call may span both: a pinned host table with CUDA
// indices dispatches to CUDA, a pinned host table with CPU indices and device='cuda' dispatches to CPU.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>

namespace speedtorch::ops {

at::Tensor gather_kernel(const at::Tensor& table, const at::Tensor& indices, std::optional<at::Device> device);
// Kernel of scatter_rows_ (scatter_ is its composite wrapper that returns the table).
void scatter_kernel(at::Tensor& table, const at::Tensor& indices, const at::Tensor& src);

// The kernel of check_gather_arguments (CompositeImplicitAutograd: it reads metadata only, so FakeTensors and
// symbolic sizes pass straight through it).
void check_gather_arguments_kernel(const at::Tensor& table, const at::Tensor& indices);

// Shape-only versions for the Meta key (and the shape checks the kernels above share).
at::Tensor gather_meta(const at::Tensor& table, const at::Tensor& indices, std::optional<at::Device> device);
void scatter_meta(at::Tensor& table, const at::Tensor& indices, const at::Tensor& src);

}  // namespace speedtorch::ops
