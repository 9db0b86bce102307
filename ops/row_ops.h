// The row operators' C++ entry points. They call through the dispatcher, so C++ callers get the same kernels,
// autograd and checks as Python and TorchScript callers (schemas in ops/schemas.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>

namespace speedtorch::ops {

// speedtorch::gather(Tensor table, Tensor indices, Device? device=None) -> Tensor
at::Tensor gather(const at::Tensor& table, const at::Tensor& indices, std::optional<at::Device> device = std::nullopt);

// speedtorch::scatter_(Tensor(a!) table, Tensor indices, Tensor src) -> Tensor(a!)
at::Tensor& scatter_(at::Tensor& table, const at::Tensor& indices, const at::Tensor& src);

// speedtorch::scatter_rows_(Tensor(a!) table, Tensor indices, Tensor src) -> (): what scatter_ does, returning
// nothing (the form functionalization accepts).
void scatter_rows_(at::Tensor& table, const at::Tensor& indices, const at::Tensor& src);

}  // namespace speedtorch::ops
