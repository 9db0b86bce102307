// Saves onto a file this process maps read-write: written back in place or refused (see mapped_file_guard.h).
#include "io/mapped_file_guard.h"

#include <c10/util/Exception.h>

#include <vector>

#include "io/npy_file.h"
#include "memory/pinned_host_buffer.h"

namespace speedtorch::io {
namespace {

[[noreturn]] void refuse(const std::string& path, const std::string& what, const std::string& why) {
  TORCH_CHECK(false, what, ": ", path, " is mapped read-write by this process (mode 'r+': speedtorch.data.open_npy "
              "or PinnedEmbedding.open / create), and ", why, ": replacing the file would leave that mapping on the "
              "old, unlinked file, and every later write through it would be lost. Save elsewhere, or drop the "
              "mapping first; to write the mapped data back, save that very tensor or table (or flush() it)");
}

// Whether `data` is exactly the array `mapping` holds: its bytes where the file's data starts, its shape and type.
bool is_whole_array(const FileMappingRange& mapping, const at::Tensor& data, const std::string& path) {
  const NpyHeader h = mapped_npy_header(mapping.data, mapping.size, path);
  const bool same_type = data.scalar_type() == h.dtype ||
                         (data.scalar_type() == at::kBFloat16 && h.dtype == at::kUInt16);
  return data.device().is_cpu() && data.numel() > 0 && data.is_contiguous() && same_type &&
         data.sizes() == c10::IntArrayRef(h.shape) &&
         data.data_ptr() == static_cast<const char*>(mapping.data) + h.data_offset;
}

}  // namespace

bool saves_mapped_data_itself(const std::string& path, const at::Tensor& data, const std::string& what) {
  const std::vector<FileMappingRange> mappings = read_write_mappings_of_file(path);
  if (mappings.empty()) return false;
  for (const FileMappingRange& mapping : mappings) {
    if (data.defined() && is_whole_array(mapping, data, path)) return true;
  }
  refuse(path, what, "what is saved is not the array it maps (other data, a part of it, or another layout)");
}

void check_not_mapped_read_write(const std::string& path, const std::string& what) {
  if (!read_write_mappings_of_file(path).empty()) refuse(path, what, "a save must not replace it");
}

}  // namespace speedtorch::io
