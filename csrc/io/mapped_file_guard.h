// One rule for every save onto a path that this process maps read-write (mode 'r+': PinnedEmbedding.open / create,
// speedtorch.data.open_npy). A save renames a new file over its target (io/atomic_file.h), and a mapping follows the
// file it mapped, not its name: renamed over, the mapping is left on an unlinked file and every later write through
// it is lost. So such a file is never replaced:
// - saving the very data the file holds (the whole mapped array, in its layout) writes the mapping back in place
//   (msync) instead: the file then holds the data, as a save would have left it;
// - saving anything else onto it is refused, before anything is written.
// Files are compared by device and inode, so other names of the same file (links, "t" and "t.npy") count.
// Mappings held by other processes are not known here (docs/persistence.md).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace speedtorch::io {

// True when `data` is the whole array that the file at `path` holds, in a read-write mapping of this process: the
// caller then writes the mapping back (flush_file_mapping_holding, or PinnedEmbedding's flush) instead of saving a
// new file. False when no read-write mapping of this process maps `path`. Throws c10::Error naming `what`
// otherwise: `path` is mapped read-write and `data` is something else.
bool saves_mapped_data_itself(const std::string& path, const at::Tensor& data, const std::string& what);

// Throws c10::Error naming `what` when this process maps `path` read-write: for writers that replace files.
void check_not_mapped_read_write(const std::string& path, const std::string& what);

}  // namespace speedtorch::io
