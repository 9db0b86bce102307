// Registers speedtorch::ContiguousParams (csrc/contiguous/contiguous_params.h) as torch.classes.speedtorch
// .ContiguousParams, for Python, TorchScript and C++ alike.
#include <torch/custom_class.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "contiguous/contiguous_params.h"

TORCH_LIBRARY_FRAGMENT(speedtorch, m) {
  using speedtorch::ContiguousParams;
  m.class_<ContiguousParams>("ContiguousParams")
      .def(torch::init<std::vector<at::Tensor>, std::vector<std::string>>(),
           "Moves params into one flat buffer per (device, dtype); params and their .grad become views of it",
           {torch::arg("params"), torch::arg("names")})
      .def("contiguous", &ContiguousParams::contiguous, "The flat parameters, one per group, for the optimizer")
      .def("original", &ContiguousParams::original, "The parameters as given (views of the flat buffers)")
      .def("grad_buffers", &ContiguousParams::grad_buffers, "The flat gradient buffers, one per group")
      .def("assert_buffer_is_valid", &ContiguousParams::assert_buffer_is_valid,
           "Raises naming the first parameter or group no longer viewing its flat buffer")
      .def("buffer_is_valid", &ContiguousParams::buffer_is_valid)
      .def("zero_grad", &ContiguousParams::zero_grad, "Zeroes the flat grads in place and re-points every .grad")
      .def("num_params", &ContiguousParams::num_params)
      .def("num_groups", &ContiguousParams::num_groups)
      .def("group_of", &ContiguousParams::group_of, "", {torch::arg("index")})
      .def("offset_of", &ContiguousParams::offset_of, "", {torch::arg("index")});
}
