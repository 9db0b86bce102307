// Registers speedtorch::PinnedEmbedding (csrc/embedding/pinned_embedding.h) as torch.classes.speedtorch
// .PinnedEmbedding, for Python, TorchScript and C++ alike, with its files (save / load / open) and its pickled form
// inside torch.jit.save'd models (csrc/embedding/embedding_pickle.h).
// GCC (12) reports a false -Warray-bounds inside c10's tuple-to-IValue code for the 5-element pickled state.
#pragma GCC diagnostic ignored "-Warray-bounds"

#include <torch/custom_class.h>
#include <torch/library.h>

#include "embedding/embedding_pickle.h"
#include "embedding/pinned_embedding.h"
#include "optim/optimizer_config.h"

TORCH_LIBRARY_FRAGMENT(speedtorch, m) {
  using speedtorch::PinnedEmbedding;
  m.class_<PinnedEmbedding>("PinnedEmbedding")
      .def(torch::init<int64_t, int64_t, c10::ScalarType>(), "A num_rows x dim table in exact-size pinned host memory",
           {torch::arg("num_rows"), torch::arg("dim"), torch::arg("dtype") = static_cast<int64_t>(at::kFloat)})
      .def("gather", &PinnedEmbedding::gather, "Rows for indices, on device (default: the indices' device)",
           {torch::arg("indices"), torch::arg("device") = c10::IValue()})
      .def("gather_with_state", &PinnedEmbedding::gather_with_state,
           "(rows, optimizer state) for 1-D indices; state beside the rows is read with them, one record a row",
           {torch::arg("indices"), torch::arg("device") = c10::IValue()})
      .def("scatter_with_state_", &PinnedEmbedding::scatter_with_state_,
           "Writes rows and optimizer state (a step computed elsewhere) into distinct 1-D indices; sets the step count",
           {torch::arg("indices"), torch::arg("rows"), torch::arg("state"), torch::arg("step")})
      .def("scatter_", &PinnedEmbedding::scatter_, "Writes src into the rows named by indices (last occurrence wins)",
           {torch::arg("indices"), torch::arg("src")})
      .def("num_rows", &PinnedEmbedding::num_rows)
      .def("dim", &PinnedEmbedding::dim)
      .def("nbytes", &PinnedEmbedding::nbytes)
      .def("is_pinned", &PinnedEmbedding::is_pinned)
      .def("table", &PinnedEmbedding::table)
      .def("host_rows_in_use", &PinnedEmbedding::host_rows_in_use,
           "Whether a tensor from table(), state() or scatter_() is still alive (a row cache stands aside meanwhile)")
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
           "One optimizer step on the rows indices name (duplicates' gradients summed; sorted_unique=True: indices "
           "are strictly increasing, checked, and the summing pass is skipped; updated_rows, with sorted_unique: "
           "also receives each row's new weights, row i for indices[i], on the device that does the work)",
           {torch::arg("indices"), torch::arg("grad"), torch::arg("sorted_unique") = false,
            torch::arg("updated_rows") = c10::IValue()})
      .def("set_optimizer_options", &PinnedEmbedding::set_optimizer_options,
           "Changes the optimizer's hyper-parameters in place (all options given; state and step count kept)",
           {torch::arg("options")})
      .def_static("optimizer_defaults", &PinnedEmbedding::optimizer_defaults,
                  "Every option an optimizer accepts, with its default value")
      .def("optimizer", &PinnedEmbedding::optimizer)
      .def("optimizer_options", &PinnedEmbedding::optimizer_options)
      .def("state", &PinnedEmbedding::state)
      .def("step_count", &PinnedEmbedding::step_count)
      .def("set_step_count", &PinnedEmbedding::set_step_count, "", {torch::arg("step")})
      .def_static("state_width", &PinnedEmbedding::state_width,
                  "Floats of optimizer state per row for an optimizer, its options and a row width")
      .def_static("canonical_optimizer_name", &speedtorch::canonical_optimizer_name,
                  "The one name an optimizer is known by (\"Adam\" -> \"adam\", \"SparseAdam\" -> \"sparse_adam\"), as optimizer() "
                  "reports it")
      .def("save", &PinnedEmbedding::save,
           "Saves rows, optimizer state and configuration to path (+ .state.npy, .meta.json), atomically",
           {torch::arg("path")})
      .def_static("load", &PinnedEmbedding::load, "A table read from save()'s files (or a plain 2-D .npy)")
      .def_static("open", &PinnedEmbedding::open,
                  "A table over save()'s files, memory-mapped: mode 'r', 'r+' or 'c' (numpy's mmap_mode)")
      .def_static("create", &PinnedEmbedding::create,
                  "A zero table (and optimizer state) over new files at path, mapped as open(path, 'r+')")
      .def("flush", &PinnedEmbedding::flush, "Writes an 'r+' table back to its files (pages, step count, hashes)")
      .def("mapping", &PinnedEmbedding::mapping)
      .def("enable_cache", &PinnedEmbedding::enable_cache,
           "Caches the most recently used rows (at least num_rows) and their optimizer state in device memory",
           {torch::arg("num_rows"), torch::arg("device")})
      .def("disable_cache", &PinnedEmbedding::disable_cache, "Writes the row cache back and drops it")
      .def("cache_slots", &PinnedEmbedding::cache_slots)
      .def("cached_rows", &PinnedEmbedding::cached_rows)
      .def("flush_cache", &PinnedEmbedding::flush_cache, "Writes the row cache's updated rows back to the table")
      .def("set_sidecar", &PinnedEmbedding::set_sidecar,
           "Where torch.jit.save writes this table ('' keeps it inside the model)", {torch::arg("path")})
      .def("sidecar", &PinnedEmbedding::sidecar)
      .def("set_transfer_option", &PinnedEmbedding::set_transfer_option,
           "This table's own transfer setting (names as speedtorch.transfer_config()), over the process's",
           {torch::arg("name"), torch::arg("value")})
      .def("transfer_options", &PinnedEmbedding::transfer_options)
      .def("clear_transfer_options", &PinnedEmbedding::clear_transfer_options)
      // torch.export keeps a table it finds on a module as the real object (a constant of the exported program)
      // instead of flattening it into fake tensors: its rows are the table itself, not inputs to trace.
      .def("tracing_mode", [](const c10::intrusive_ptr<PinnedEmbedding>&) { return std::string("real"); })
      // Python's repr() and str() of a table (ScriptObject routes both magic methods to the class's own).
      .def("__repr__", &PinnedEmbedding::repr)
      .def("__str__", &PinnedEmbedding::repr)
      .def_pickle(
          [](const c10::intrusive_ptr<PinnedEmbedding>& self) { return speedtorch::pickle_embedding(self); },
          [](speedtorch::PickledEmbedding state) { return speedtorch::unpickle_embedding(std::move(state)); });
}
