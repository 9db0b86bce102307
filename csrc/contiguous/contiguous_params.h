// ContiguousParams: a model's parameters and gradients moved into one flat buffer per (device, dtype), each
// parameter and its .grad re-pointed to a view of it, so an optimizer (and clip_grad_norm_) can run a few large
// kernels over the flat buffers instead of a few per parameter. A torch::CustomClass (registered in
// ops/contiguous_params_class.cpp), so Python, TorchScript and C++ share one object.
//
// Two rules keep the views valid (docs/contiguous_params.md): parameters and gradients are updated in place only
// (assert_buffer_is_valid() names the one that was replaced), and nothing that depends on a parameter's shape or
// statistics runs on the flat buffers (use original() for that).
//
// A parameter that gets no gradient in a step has a slice of zeros in the flat gradient, not "no gradient": an
// optimizer over contiguous() steps it (momentum and weight decay move it), where one over the parameters would skip
// it. The Python class (python/speedtorch/contiguous.py) tracks which parameters have a gradient and makes
// torch.optim's steps leave the others as they were; C++ and TorchScript callers step every parameter.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/custom_class.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace speedtorch {

class ContiguousParams : public torch::CustomClassHolder {
 public:
  // params: leaf tensors that require grad, strided, floating or complex, on CPU or CUDA, each given once. names:
  // empty, or one per parameter (used in error messages). Existing .grad values are kept (copied into the flat
  // gradient buffer); missing ones start at zero.
  explicit ContiguousParams(std::vector<at::Tensor> params, std::vector<std::string> names = {});

  // One flat parameter per (device, dtype) group, in order of first appearance: a leaf that requires grad and whose
  // .grad is the group's flat gradient buffer. Hand these to any optimizer that updates parameters in place.
  std::vector<at::Tensor> contiguous() const;
  // The parameters as given (now views of the flat buffers), for anything that needs their shapes.
  std::vector<at::Tensor> original() const { return params_; }
  // The flat gradient buffers, one per group (the same tensors as contiguous()[g].grad while the buffer is valid).
  std::vector<at::Tensor> grad_buffers() const;

  // Throws c10::Error naming the first parameter (by index, and name when given) or group whose data or .grad no
  // longer views its flat buffer, and what replaced it.
  void assert_buffer_is_valid() const;
  bool buffer_is_valid() const { return !first_invalid().has_value(); }

  // Zeroes the flat gradient buffers in place and points every .grad (the parameters' and the flat ones) back at
  // its view, undoing a zero_grad(set_to_none=True) of a module or optimizer. Parameter data is not touched.
  void zero_grad();

  int64_t num_params() const { return static_cast<int64_t>(params_.size()); }
  int64_t num_groups() const { return static_cast<int64_t>(groups_.size()); }
  // Which group parameter i lives in, and its element offset in that group's flat buffers.
  int64_t group_of(int64_t i) const;
  int64_t offset_of(int64_t i) const;

 private:
  struct Group {
    Group(c10::Device device, c10::ScalarType dtype) : device(device), dtype(dtype) {}
    c10::Device device;
    c10::ScalarType dtype;
    int64_t numel = 0;  // including the alignment padding between parameters
    at::Tensor data;    // the flat parameter buffer
    at::Tensor flat;    // the leaf handed out by contiguous(): an alias of data that requires grad
    at::Tensor grad;    // the flat gradient buffer
  };
  struct Slot {
    int64_t group = 0;
    int64_t offset = 0;  // in elements
    at::Tensor data_view;  // where the parameter's data must live
    at::Tensor grad_view;  // where its .grad must live
  };

  std::string describe(size_t i) const;
  // Empty when parameter i's data is still its view of the flat buffer, else the error message.
  std::string data_problem(size_t i) const;
  std::optional<std::string> first_invalid() const;

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<Group> groups_;
  std::vector<Slot> slots_;
};

}  // namespace speedtorch
