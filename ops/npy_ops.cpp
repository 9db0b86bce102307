// The .npy operators (csrc/io): saving and loading tensors and tables with their optimizer state, from Python,
// TorchScript and C++ alike. They read and write files, not tensors' autograd history: kernels are catch-all (any
// device), schemas live here with their functions as library_settings.cpp does.
#include <c10/util/strides.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "embedding/embedding_pickle.h"
#include "io/content_hash.h"
#include "io/embedding_files.h"
#include "io/npy_file.h"
#include "io/write_cancellation.h"
#include "memory/pinned_host_buffer.h"
#include "optim/optimizer_config.h"

namespace speedtorch::ops {
namespace {

std::string save_npy_op(const at::Tensor& tensor, const std::string& path) {
  return io::hash_to_hex(io::save_npy(tensor, path));
}

std::string content_hash_op(const at::Tensor& tensor) {
  TORCH_CHECK(tensor.device().is_cpu(), "speedtorch.content_hash: the tensor must be in host memory, got one on ",
              tensor.device());
  // 2-D tensors (tables) are hashed a chunk at a time when strided, never copied whole.
  return tensor.dim() == 2 ? io::content_hash_of_rows(tensor) : io::content_hash_of(tensor.contiguous());
}

at::Tensor load_npy_op(const std::string& path, bool pinned) { return io::load_npy(path, pinned); }

void load_npy_into_op(const at::Tensor& tensor, const std::string& path) { (void)io::load_npy_into(tensor, path); }

std::tuple<std::string, std::vector<int64_t>> npy_header_op(const std::string& path) {
  const io::NpyHeader h = io::read_npy_header(path);
  return {h.descr, h.shape};
}

at::Tensor map_npy_op(const std::string& path, const std::string& mode, bool pin) {
  FileMapping mapping = FileMapping::kNone;
  if (mode == "r") mapping = FileMapping::kReadOnly;
  else if (mode == "r+") mapping = FileMapping::kReadWrite;
  else if (mode == "c") mapping = FileMapping::kCopyOnWrite;
  TORCH_CHECK(mapping != FileMapping::kNone, "speedtorch.map_npy: mode must be 'r', 'r+' or 'c' (numpy.load's "
              "mmap_mode), got '", mode, "'");
  auto buffer = std::make_shared<PinnedHostBuffer>(path, mapping, pin);
  // The header of what was mapped, not of an earlier read of the path (a save may have replaced it in between).
  const io::NpyHeader h = io::mapped_npy_header(buffer->data(), buffer->size(), path);
  TORCH_CHECK(h.data_bytes() > 0, "speedtorch.map_npy: ", path, " holds no data (shape ",
              c10::IntArrayRef(h.shape), "); load it instead");
  return tensor_over(buffer, h.data_offset, h.shape, c10::contiguous_strides(h.shape), h.dtype);
}

void save_embedding_files_op(const at::Tensor& table, const std::optional<at::Tensor>& state,
                             const std::string& optimizer, const c10::Dict<std::string, double>& options,
                             int64_t step, const std::string& path) {
  // Files name the optimizer canonically, whoever saves them (optim/optimizer_config.h).
  (void)io::save_embedding_files(path, table, state.value_or(at::Tensor()),
                                 optimizer.empty() ? optimizer : canonical_optimizer_name(optimizer), options, step,
                                 /*state_beside_rows=*/true);
}

std::tuple<std::vector<int64_t>, std::string, std::string, c10::Dict<std::string, double>, int64_t, int64_t>
read_embedding_meta_op(const std::string& path) {
  const io::EmbeddingMeta m = io::read_embedding_meta(path);
  return {std::vector<int64_t>{m.num_rows, m.dim}, io::dtype_name(m.dtype), m.optimizer, m.options.copy(), m.step,
          m.state_width};
}

void load_embedding_files_op(const at::Tensor& table, const std::optional<at::Tensor>& state,
                             const std::string& path, bool verify) {
  const io::EmbeddingMeta meta = io::read_embedding_meta(path);
  TORCH_CHECK(meta.optimizer.empty() || state.has_value(), "speedtorch.load_embedding_files_: ", path, " holds ",
              meta.optimizer, " state; pass a (", meta.num_rows, ", ", meta.state_width, ") float32 state tensor");
  io::load_embedding_files(path, meta, table, state.value_or(at::Tensor()), verify);
}

}  // namespace
}  // namespace speedtorch::ops

TORCH_LIBRARY_FRAGMENT(speedtorch, m) {
  using namespace speedtorch::ops;
  // `tensor` (any shape, device, strides) to a .npy file, streamed in chunks, atomically; returns the data's
  // content hash (16 hex digits).
  m.def("save_npy(Tensor tensor, str path) -> str", &save_npy_op);
  // The content hash save_npy returns for `tensor` (a host tensor: its bytes in C order), without writing anything:
  // tells a mapped file from another save of the same shape (the quantized serving model of torchscript_examples/).
  m.def("content_hash(Tensor tensor) -> str", &content_hash_op);
  // A path of a file saved beside a model as the loader takes it: absolute as it is, relative under
  // $SPEEDTORCH_SIDECAR_DIR when set, else relative to the current directory (PinnedEmbedding's sidecar rule).
  m.def("resolve_sidecar_path(str path) -> str", &speedtorch::resolve_sidecar_path);
  // A new tensor holding a .npy file, read straight into exact-size pinned memory (pinned=True) or ordinary memory.
  m.def("load_npy(str path, bool pinned=True) -> Tensor", &load_npy_op);
  // A .npy file into an existing tensor of its shape (any device, strides; floating types convert).
  m.def("load_npy_into_(Tensor(a!) tensor, str path) -> ()", &load_npy_into_op);
  // A .npy file's dtype string and shape, validated (truncation included).
  m.def("npy_header(str path) -> (str, int[])", &npy_header_op);
  // A tensor over the .npy file itself, memory-mapped: mode 'r', 'r+' (writes reach the file) or 'c'
  // (copy-on-write); page-locked when pin and a GPU is present.
  m.def("map_npy(str path, str mode='r', bool pin=True) -> Tensor", &map_npy_op);
  // A table and its optimizer state (any device) as PinnedEmbedding.save writes them (csrc/io/embedding_files.h).
  m.def("save_embedding_files(Tensor table, Tensor? state, str optimizer, Dict(str, float) options, int step, "
        "str path) -> ()",
        &save_embedding_files_op);
  // What save_embedding_files wrote: ([num_rows, dim], dtype, optimizer, options, step, state_width).
  m.def("read_embedding_meta(str path) -> (int[], str, str, Dict(str, float), int, int)", &read_embedding_meta_op);
  // Those files into existing tensors (any device), checking the content hashes when verify.
  m.def("load_embedding_files_(Tensor(a!) table, Tensor(b!)? state, str path, bool verify=True) -> ()",
        &load_embedding_files_op);
  // Stops every file write in progress at its next chunk, committing nothing (io/write_cancellation.h): what a
  // KeyboardInterrupt during a save calls.
  m.def("cancel_writes() -> ()", [] { speedtorch::io::cancel_writes_in_progress(); });
}
