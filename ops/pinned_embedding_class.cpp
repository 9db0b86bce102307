// Registers speedtorch::PinnedEmbedding (csrc/embedding/pinned_embedding.h) as torch.classes.speedtorch
// .PinnedEmbedding, for Python, TorchScript and C++ alike.
#include <torch/custom_class.h>
#include <torch/library.h>

#include "embedding/pinned_embedding.h"

TORCH_LIBRARY_FRAGMENT(speedtorch, m) {
  using speedtorch::PinnedEmbedding;
  m.class_<PinnedEmbedding>("PinnedEmbedding")
      .def(torch::init<int64_t, int64_t, c10::ScalarType>(), "A num_rows x dim table in exact-size pinned host memory",
           {torch::arg("num_rows"), torch::arg("dim"), torch::arg("dtype") = static_cast<int64_t>(at::kFloat)})
      .def("gather", &PinnedEmbedding::gather, "Rows for indices, on device (default: the indices' device)",
           {torch::arg("indices"), torch::arg("device") = c10::IValue()})
      .def("scatter_", &PinnedEmbedding::scatter_, "Writes src into the rows named by indices (last occurrence wins)",
           {torch::arg("indices"), torch::arg("src")})
      .def("num_rows", &PinnedEmbedding::num_rows)
      .def("dim", &PinnedEmbedding::dim)
      .def("nbytes", &PinnedEmbedding::nbytes)
      .def("is_pinned", &PinnedEmbedding::is_pinned)
      .def("table", &PinnedEmbedding::table)
      .def("zero_", &PinnedEmbedding::zero_)
      .def("uniform_", &PinnedEmbedding::uniform_, "",
           {torch::arg("low") = -0.05, torch::arg("high") = 0.05, torch::arg("seed") = c10::IValue()})
      .def("normal_", &PinnedEmbedding::normal_, "",
           {torch::arg("mean") = 0.0, torch::arg("std") = 1.0, torch::arg("seed") = c10::IValue()})
      .def("copy_", &PinnedEmbedding::copy_, "", {torch::arg("src")})
      .def("set_optimizer", &PinnedEmbedding::set_optimizer,
           "Configures the fused optimizer (torch.optim names and options) and allocates its state",
           {torch::arg("kind"), torch::arg("options"), torch::arg("state_beside_rows") = true})
      .def("apply_gradients", &PinnedEmbedding::apply_gradients,
           "One optimizer step on the rows indices name (duplicates' gradients summed)",
           {torch::arg("indices"), torch::arg("grad")})
      .def("optimizer", &PinnedEmbedding::optimizer)
      .def("optimizer_options", &PinnedEmbedding::optimizer_options)
      .def("state", &PinnedEmbedding::state)
      .def("step_count", &PinnedEmbedding::step_count);
}
