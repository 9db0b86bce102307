// Owns exact-size page-locked host memory for tables and optimizer state.
//
// PyTorch's pinned allocator rounds every request up to a power of two (a 5.12 GB table takes 8.69 GB); here a
// table costs its bytes rounded up to one page. Memory comes from an anonymous mmap (zero-filled by the kernel, so
// zero-initialised tables are free) and, when a CUDA device is present, is registered with
// cudaHostRegister(Mapped | Portable): every GPU of the host can read and write it directly over UVA.
//
// A buffer can also map a file (a .npy table opened in place): the file's pages are the table, shared with the
// page cache, read-only, written back to the file, or copy-on-write, as numpy.load's mmap_mode.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace speedtorch {

// How a file-backed buffer maps its file (numpy.load's mmap_mode names in brackets).
enum class FileMapping {
  kNone,         // anonymous memory, no file
  kReadOnly,     // ("r") MAP_PRIVATE, as torch.load(mmap=True): speedtorch's writing operators refuse it, and a
                 // plain torch write changes this process's copy of the page only, never the file (it never
                 // faults); registered read-only with CUDA, so GPU reads may not see such a write
  kReadWrite,    // ("r+") MAP_SHARED: writes reach the file (the kernel writes dirty pages back; flush() forces it).
                 // Linux lets GPUs pin shared file pages for writing only on tmpfs: elsewhere (ext4, xfs, ...)
                 // the pages are registered read-only (is_device_read_only()).
  kCopyOnWrite,  // ("c") MAP_PRIVATE: writes stay in this process's memory, the file never changes
};

class PinnedHostBuffer {
 public:
  // Allocates `bytes` (> 0) of zeroed host memory and page-locks it when a CUDA device is present. Destruction
  // waits for the UVA kernels still queued on the memory before it is unregistered and unmapped.
  // Throws c10::Error with an actionable message when the memory cannot be had.
  explicit PinnedHostBuffer(std::size_t bytes, bool pin = true);
  // Maps the whole (non-empty) file at `path` as `mapping` says (not kNone), page-locked when `pin` and a CUDA
  // device is present. Page-locking faults every page in: the file is read once, into the page cache, with no copy;
  // without it pages are read on first touch, but GPUs cannot reach the memory.
  PinnedHostBuffer(const std::string& path, FileMapping mapping, bool pin);
  ~PinnedHostBuffer();

  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;

  void* data() const { return data_; }
  // Bytes asked for.
  std::size_t size() const { return size_; }
  // Bytes actually mapped (size rounded up to the page size).
  std::size_t mapped_size() const { return mapped_size_; }
  // True when registered with CUDA (readable by GPU kernels through UVA).
  bool is_pinned() const { return pinned_; }
  // True when registered for GPU reads only (mode "r", or "r+" where the kernel refuses writable pins).
  bool is_device_read_only() const { return device_read_only_; }

  // Page-locks and registers the memory with CUDA when a device is present (a no-op when already pinned).
  void pin();
  // Unregisters the memory from CUDA so that discard() can release it, after waiting for the GPU work still queued
  // on it (memory/host_access_tracker.h).
  void unpin();
  // Returns the whole pages inside [offset, offset + bytes) to the OS (they read as zero afterwards). Used to
  // release a table while it is copied into a new layout, so both never exist at full size. Needs unpin() first.
  void discard(std::size_t offset, std::size_t bytes);

  // How the memory maps a file (kNone for anonymous memory), and which file.
  FileMapping mapping() const { return mapping_; }
  const std::string& path() const { return path_; }
  // For kReadWrite mappings: writes the dirty pages to the file and waits for the disk (msync). A no-op otherwise.
  void flush();

 private:
  // pin(), unmapping the memory if that fails (for the constructors).
  void pin_or_unmap();

  void* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t mapped_size_ = 0;
  bool pinned_ = false;
  bool device_read_only_ = false;
  bool gpu_writable_file_ = false;  // the mapped file lives on tmpfs / hugetlbfs (see pin())
  FileMapping mapping_ = FileMapping::kNone;
  std::string path_;
};

// A tensor of `sizes` and `dtype` whose storage is a fresh PinnedHostBuffer (zero-filled). The buffer lives as
// long as any tensor sharing the storage.
at::Tensor pinned_empty(at::IntArrayRef sizes, c10::ScalarType dtype);

// A tensor viewing `buffer` from `offset_bytes` with the given sizes and strides (in elements); it keeps the buffer
// alive. Several such views may share one buffer (e.g. a table's rows and their optimizer state side by side).
// Throws c10::Error unless every element lies within the buffer's size() bytes.
at::Tensor tensor_over(const std::shared_ptr<PinnedHostBuffer>& buffer, int64_t offset_bytes, at::IntArrayRef sizes,
                       at::IntArrayRef strides, c10::ScalarType dtype);

// Whether CUDA is usable in this process (library built with CUDA and a device present).
bool cuda_device_available();

// Whether `ptr` lies in page-locked host memory that GPUs can address (ours, torch's pin_memory, or any
// cudaHostRegister'ed range). Unlike Tensor::is_pinned(), it does not depend on PyTorch having initialised CUDA.
bool is_pinned_host_memory(const void* ptr);

// Whether `ptr` lies in a PinnedHostBuffer that GPUs may only read (a mode 'r' mapping, pinned or not, or an 'r+'
// one registered read-only): GPU kernels must not write there (the write would be an illegal address that ruins
// the CUDA context), so the operators refuse before launching.
bool is_device_read_only_host_memory(const void* ptr);

// Whether `ptr` lies in a PinnedHostBuffer mapping a file read-only (mode 'r'), pinned or not: a CPU write there
// is a SIGSEGV that kills the process.
bool is_read_only_host_memory(const void* ptr);

// Throws c10::Error naming `op` and `arg` when `tensor` is host memory mapped read-only (is_read_only_host_memory).
// Every operator that writes a caller's tensor calls it before writing.
void check_host_memory_writable(const at::Tensor& tensor, const char* op, const char* arg);

// The memory of one live file mapping: `size` bytes, the whole file, from `data`.
struct FileMappingRange {
  const void* data;
  std::size_t size;
};

// The read-write (kReadWrite) mappings this process holds of the file `path` names (the same device and inode,
// whatever the name): what io/mapped_file_guard.h guards. Empty when `path` does not exist.
std::vector<FileMappingRange> read_write_mappings_of_file(const std::string& path);

// Writes the dirty pages of the read-write file mapping holding `ptr` back to its file and waits for the disk
// (msync), as PinnedHostBuffer::flush does. Throws c10::Error when `ptr` lies in no such mapping.
void flush_file_mapping_holding(const void* ptr);

}  // namespace speedtorch
