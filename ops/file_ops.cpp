// File replacement for Python code whose bytes another library writes (speedtorch.jit_save: torch.jit.save writes
// the model): the same temporaries, permissions and atomic rename as speedtorch's own saves (csrc/io/atomic_file.h,
// csrc/io/file_mode.h), so one rule holds for every file the package writes.
#include <torch/library.h>

#include <string>

#include "embedding/embedding_pickle.h"
#include "io/atomic_file.h"

TORCH_LIBRARY_FRAGMENT(speedtorch, m) {
  // Creates an empty temporary beside `path`, unique to this call (another thread or process saving to the same
  // path gets another), with a new file's permissions; returns its name. The caller writes it, then replace_file.
  m.def("create_temporary_beside(str path) -> str",
        [](const std::string& path) { return speedtorch::io::create_temporary_beside(path, "speedtorch.jit_save"); });
  // Flushes `temporary` to disk, gives it the permissions of the file it replaces (when `path` exists), renames it
  // over `path` and flushes the directory: `path` holds the old bytes or the new ones, never a mix.
  m.def("replace_file(str temporary, str path) -> ()", [](const std::string& temporary, const std::string& path) {
    speedtorch::io::replace_file(temporary, path, "speedtorch.jit_save");
  });
  // Whether a sidecar that cannot be written makes pickling on this thread raise rather than fall back to inline
  // (embedding_pickle.h); returns the previous setting. jit_save turns it on around its save to a temporary.
  m.def("set_sidecar_failures_raise(bool raise_on_failure) -> bool",
        [](bool raise_on_failure) { return speedtorch::set_sidecar_failures_raise(raise_on_failure); });
}
