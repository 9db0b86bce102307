// speedtorch::gather_dequant: rows of a bf16, row-wise int8 or block-scaled fp8 table, dequantized to bfloat16
// inside the gather (layouts in csrc/core/row_formats.h). One kernel for CPU and CUDA (a pinned host table with
// CUDA indices dispatches to CUDA, with CPU indices and device='cuda' to CPU) and a Meta kernel for shapes.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>
#include <string>

namespace speedtorch::ops {

// The C++ entry point through the dispatcher:
// speedtorch::gather_dequant(Tensor table, Tensor indices, str format, int dim, Device? device=None) -> Tensor
at::Tensor gather_dequant(const at::Tensor& table, const at::Tensor& indices, const std::string& format, int64_t dim,
                          std::optional<at::Device> device = std::nullopt);

at::Tensor gather_dequant_kernel(const at::Tensor& table, const at::Tensor& indices, c10::string_view format,
                                 int64_t dim, std::optional<at::Device> device);
// The kernel of check_gather_dequant_arguments (CompositeImplicitAutograd: metadata only, for the Python fake).
void check_gather_dequant_arguments_kernel(const at::Tensor& table, const at::Tensor& indices,
                                           c10::string_view format, int64_t dim);
at::Tensor gather_dequant_meta(const at::Tensor& table, const at::Tensor& indices, c10::string_view format,
                               int64_t dim, std::optional<at::Device> device);

}  // namespace speedtorch::ops
