// How both ModelRunners hand answers back (model_runner.h): host float tensors, contiguous, complete on return.
#pragma once

#include <torch/torch.h>

namespace speedtorch::serving {

inline torch::Tensor to_host_float(const torch::Tensor& t) { return t.to(torch::kCPU, torch::kFloat).contiguous(); }

}  // namespace speedtorch::serving
