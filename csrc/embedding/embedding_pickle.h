// How a PinnedEmbedding travels inside a torch.jit.save'd model (def_pickle in ops/pinned_embedding_class.cpp), so
// torch.jit.load in Python and torch::jit::load in C++ get the same table, optimizer state and configuration back.
//
// The pickled state (version 1) is a tuple:
//   (int version,
//    Dict[str, str]   {"dtype", "optimizer", "sidecar", "table_hash", "state_hash"},
//    Dict[str, int]   {"num_rows", "dim", "step", "state_width", "state_beside_rows"},
//    Dict[str, float] the optimizer's options,
//    Tensor[]         [table] or [table, state] when inline; [] when in a sidecar)
//
// Inline: the rows (and state) are tensors of the model archive. Sidecar: when set_sidecar(path) was called, the
// table is saved to that path (PinnedEmbedding::save, atomically) as the model is pickled, unless the files there
// already hold exactly this table (PinnedEmbedding::save_unless_held: same step, configuration and content hashes),
// and the model records the path as given plus the files' content hashes. Pickling happens on torch.jit.save and
// also on copy.copy / copy.deepcopy of a scripted model: a copy leaves up-to-date files untouched, and a save of a
// changed table writes them. At load, a relative path is resolved against $SPEEDTORCH_SIDECAR_DIR
// if set, else the process's current directory; a missing, truncated or different sidecar (hash mismatch) is an
// error naming the file. Tables above SPEEDTORCH_INLINE_MAX_BYTES (default 64 MiB, weights + state) without a
// sidecar are saved inline with a warning (a copy of them is held in host memory while the model is written), and
// so is a table whose sidecar cannot be written: a refusal would come too late, as torch.jit.save truncates the
// target file before it pickles anything, and would destroy the model saved there before. Only inside a
// set_sidecar_failures_raise(true) (speedtorch.jit_save, which writes a temporary and keeps the old file) does a sidecar
// that cannot be written raise.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "embedding/pinned_embedding.h"

namespace speedtorch {

using PickledEmbedding = std::tuple<int64_t, c10::Dict<std::string, std::string>, c10::Dict<std::string, int64_t>,
                                    c10::Dict<std::string, double>, std::vector<at::Tensor>>;

constexpr int64_t kPickleVersion = 1;

PickledEmbedding pickle_embedding(const c10::intrusive_ptr<PinnedEmbedding>& embedding);
c10::intrusive_ptr<PinnedEmbedding> unpickle_embedding(PickledEmbedding state);

// Whether a sidecar that cannot be written makes pickling on this thread raise instead of falling back to inline
// (off by default); returns the previous setting. For callers that write the model to a temporary, so that nothing
// is lost by refusing (speedtorch.jit_save).
bool set_sidecar_failures_raise(bool raise_on_failure);

// The bytes above which a table needs a sidecar ($SPEEDTORCH_INLINE_MAX_BYTES, default 64 MiB).
int64_t inline_max_bytes();
// A sidecar path as the loader (and the saver) uses it: absolute paths as they are, relative ones under
// $SPEEDTORCH_SIDECAR_DIR when set, else as they are (relative to the current directory).
std::string resolve_sidecar_path(const std::string& path);

}  // namespace speedtorch
