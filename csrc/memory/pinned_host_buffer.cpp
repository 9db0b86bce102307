// Exact-size page-locked host memory: anonymous mmap, or a mapped file, + cudaHostRegister (see pinned_host_buffer.h).
#include "memory/pinned_host_buffer.h"

#include <ATen/ops/from_blob.h>
#include <c10/util/strides.h>
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <iterator>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include "core/checked_size.h"

#ifdef SPEEDTORCH_WITH_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>
#include <torch/version.h>

#include "memory/host_access_tracker.h"
#endif

namespace speedtorch {
namespace {

// Every buffer whose memory some writer must not write, by begin: mode 'r' mappings (speedtorch's operators refuse
// to write them, and GPUs may only read them), pinned or not, and 'r+' mappings that GPUs were allowed to pin for
// reads only.
struct ReadOnlyRange {
  std::uintptr_t end;
  bool host_writes_refused;  // true: nobody may write (mode 'r'); false: only GPUs may not
};
std::mutex read_only_ranges_mutex;
std::map<std::uintptr_t, ReadOnlyRange>& read_only_ranges() {
  static auto* ranges = new std::map<std::uintptr_t, ReadOnlyRange>();  // buffers may die during static destruction
  return *ranges;
}

void add_read_only_range(const void* data, std::size_t bytes, bool host_writes_refused) {
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  std::lock_guard<std::mutex> lock(read_only_ranges_mutex);
  read_only_ranges()[begin] = ReadOnlyRange{begin + bytes, host_writes_refused};
}

void remove_read_only_range(const void* data) {
  std::lock_guard<std::mutex> lock(read_only_ranges_mutex);
  read_only_ranges().erase(reinterpret_cast<std::uintptr_t>(data));
}

// The registered range holding `ptr`, if any.
std::optional<ReadOnlyRange> read_only_range_of(const void* ptr) {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(read_only_ranges_mutex);
  const auto& ranges = read_only_ranges();
  auto it = ranges.upper_bound(p);
  if (it == ranges.begin()) return std::nullopt;
  --it;
  if (p >= it->second.end) return std::nullopt;
  return it->second;
}

// Every live read-write (mode 'r+') file mapping, by begin: which file it maps (device and inode, so that any name
// of the file finds it), for the guard against saves replacing a mapped file (io/mapped_file_guard.h).
struct ReadWriteMapping {
  std::uintptr_t end;
  dev_t device;
  ino_t inode;
};
std::mutex read_write_mappings_mutex;
std::map<std::uintptr_t, ReadWriteMapping>& read_write_mappings() {
  static auto* mappings = new std::map<std::uintptr_t, ReadWriteMapping>();  // as read_only_ranges()
  return *mappings;
}

void remove_read_write_mapping(const void* data) {
  std::lock_guard<std::mutex> lock(read_write_mappings_mutex);
  read_write_mappings().erase(reinterpret_cast<std::uintptr_t>(data));
}

}  // namespace

bool is_device_read_only_host_memory(const void* ptr) { return read_only_range_of(ptr).has_value(); }

bool is_read_only_host_memory(const void* ptr) {
  const std::optional<ReadOnlyRange> range = read_only_range_of(ptr);
  return range.has_value() && range->host_writes_refused;
}

void check_host_memory_writable(const at::Tensor& tensor, const char* op, const char* arg) {
  if (!tensor.defined() || !tensor.is_cpu() || tensor.numel() == 0) return;
  TORCH_CHECK(!is_read_only_host_memory(tensor.storage().data()), op, ": ", arg, " is a read-only file mapping "
              "(speedtorch.data.open_npy / speedtorch.map_npy / PinnedEmbedding.open with mode 'r'): a write would "
              "never reach the file, and GPUs might not see it. Open the file with mode 'r+' (changes reach the "
              "file) or 'c' (copy-on-write), or load it into memory");
}

std::vector<FileMappingRange> read_write_mappings_of_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  std::vector<FileMappingRange> out;
  std::lock_guard<std::mutex> lock(read_write_mappings_mutex);
  for (const auto& [begin, mapping] : read_write_mappings()) {
    if (mapping.device == st.st_dev && mapping.inode == st.st_ino) {
      out.push_back({reinterpret_cast<const void*>(begin), static_cast<std::size_t>(mapping.end - begin)});
    }
  }
  return out;
}

void flush_file_mapping_holding(const void* ptr) {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;
  {
    std::lock_guard<std::mutex> lock(read_write_mappings_mutex);
    const auto& mappings = read_write_mappings();
    auto it = mappings.upper_bound(p);
    TORCH_CHECK(it != mappings.begin() && p < std::prev(it)->second.end, "speedtorch: no read-write file mapping "
                "holds the memory to flush");
    begin = std::prev(it)->first;
    end = std::prev(it)->second.end;
  }
  // The caller holds a tensor of the mapping, so it stays mapped while it is written back.
  TORCH_CHECK(msync(reinterpret_cast<void*>(begin), end - begin, MS_SYNC) == 0, "speedtorch: writing a mapped file "
              "back (msync) failed: ", std::strerror(errno));
}

bool cuda_device_available() {
#ifdef SPEEDTORCH_WITH_CUDA
  static const bool available = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      (void)cudaGetLastError();  // a machine without a driver: clear the sticky error, run CPU-only
      return false;
    }
    return count > 0;
  }();
  return available;
#else
  return false;
#endif
}

bool is_pinned_host_memory(const void* ptr) {
#ifdef SPEEDTORCH_WITH_CUDA
  if (ptr == nullptr || !cuda_device_available()) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
#else
  (void)ptr;
  return false;
#endif
}

PinnedHostBuffer::PinnedHostBuffer(std::size_t bytes, bool pin_now) : size_(bytes) {
  TORCH_CHECK(bytes > 0, "speedtorch: cannot allocate an empty host buffer");
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  TORCH_CHECK(bytes <= SIZE_MAX - page, "speedtorch: host buffer size ", bytes, " bytes overflows");
  mapped_size_ = (bytes + page - 1) / page * page;
  void* p = mmap(nullptr, mapped_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TORCH_CHECK(p != MAP_FAILED, "speedtorch: could not reserve ", bytes, " bytes of host memory (mmap: ",
              std::strerror(errno), "); the table and its optimizer state must fit in host RAM");
  data_ = p;
  if (pin_now) pin_or_unmap();
}

PinnedHostBuffer::PinnedHostBuffer(const std::string& path, FileMapping mapping, bool pin_now)
    : mapping_(mapping), path_(path) {
  TORCH_CHECK(mapping != FileMapping::kNone, "speedtorch: a file-backed buffer needs a mapping mode");
  // One descriptor, opened once: the caller reads the header from the memory mapped here, never from another open
  // of the path, which a save may have replaced in between.
  const int fd = ::open(path.c_str(), (mapping == FileMapping::kReadWrite ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "speedtorch: cannot open ", path, " to map it: ", std::strerror(errno),
              mapping == FileMapping::kReadWrite && errno == EACCES ? " (mode 'r+' needs write permission)" : "");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
    const int err = errno;
    ::close(fd);
    TORCH_CHECK(false, "speedtorch: cannot map ", path, ": ", st.st_size <= 0 ? "the file is empty" : std::strerror(err));
  }
  size_ = static_cast<std::size_t>(st.st_size);
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  mapped_size_ = (size_ + page - 1) / page * page;
  // Mode 'r' maps private pages, as torch.load(mmap=True) does: torch has no read-only tensors, and a write into a
  // PROT_READ mapping is a SIGSEGV that kills the process; here it changes this process's copy of the page only.
  // MAP_NORESERVE for 'r': a writable private mapping is otherwise charged in full against the memory commit
  // limit, so a file larger than RAM + swap could not be opened read-only at all (only pages a stray write copies
  // take memory). 'c' is made to be written: it keeps the charge, so running out of memory fails at open.
  int flags = MAP_SHARED;
  if (mapping == FileMapping::kReadOnly) flags = MAP_PRIVATE | MAP_NORESERVE;
  if (mapping == FileMapping::kCopyOnWrite) flags = MAP_PRIVATE;
  void* p = mmap(nullptr, mapped_size_, PROT_READ | PROT_WRITE, flags, fd, 0);
  const int err = errno;
  // Linux lets GPUs pin shared file pages for writing only on memory filesystems (others must be able to write
  // pages back at any time): elsewhere an 'r+' mapping is registered read-only from the start.
  struct statfs fs {};
  gpu_writable_file_ = ::fstatfs(fd, &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == HUGETLBFS_MAGIC);
  ::close(fd);  // the mapping keeps the file
  TORCH_CHECK(p != MAP_FAILED, "speedtorch: could not map ", path, " (mmap: ", std::strerror(err), ")");
  data_ = p;
  // Known from the start, pinned or not: the operators refuse to write it before they try.
  if (mapping == FileMapping::kReadOnly) add_read_only_range(data_, mapped_size_, /*host_writes_refused=*/true);
  if (mapping == FileMapping::kReadWrite) {
    std::lock_guard<std::mutex> lock(read_write_mappings_mutex);
    read_write_mappings()[reinterpret_cast<std::uintptr_t>(data_)] =
        ReadWriteMapping{reinterpret_cast<std::uintptr_t>(data_) + size_, st.st_dev, st.st_ino};
  }
  if (pin_now) pin_or_unmap();
}

void PinnedHostBuffer::flush() {
  if (mapping_ != FileMapping::kReadWrite) return;
  TORCH_CHECK(msync(data_, mapped_size_, MS_SYNC) == 0, "speedtorch: writing ", path_, " back (msync) failed: ",
              std::strerror(errno));
}

void PinnedHostBuffer::pin_or_unmap() {
  try {
    pin();
  } catch (...) {  // a constructor that throws runs no destructor: release the mapping here
    remove_read_only_range(data_);
    remove_read_write_mapping(data_);
    munmap(data_, mapped_size_);
    data_ = nullptr;
    throw;
  }
}

void PinnedHostBuffer::pin() {
#ifdef SPEEDTORCH_WITH_CUDA
  if (pinned_ || !cuda_device_available()) return;
  // PyTorch reports Tensor::is_pinned() only once it has initialised CUDA itself: do it now, so our tables
  // answer true from the start.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6)
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
#else
  at::globalContext().lazyInitCUDA();
#endif
  unsigned flags = cudaHostRegisterMapped | cudaHostRegisterPortable;
  // A read-only file mapping is registered read-only for the GPU too. Its pages are private (MAP_PRIVATE): Linux 6.5
  // and later copy each one into this process as they pin it long-term (GPU and CPU then share the copy); older
  // kernels pin the page cache's page, and a CPU write then gets a private copy that GPUs do not see.
  // Shared file pages outside memory filesystems cannot be pinned for writing (the kernel must be able to write
  // them back while pinned): GPUs then read the table, and writes go through the CPU.
  bool read_only = mapping_ == FileMapping::kReadOnly || (mapping_ == FileMapping::kReadWrite && !gpu_writable_file_);
  if (read_only) flags |= cudaHostRegisterReadOnly;
  cudaError_t err = cudaHostRegister(data_, mapped_size_, flags);
  if (err != cudaSuccess && mapping_ == FileMapping::kReadWrite && !read_only) {
    (void)cudaGetLastError();  // a kernel stricter than its filesystem suggests: fall back to reads only
    read_only = true;
    err = cudaHostRegister(data_, mapped_size_, flags | cudaHostRegisterReadOnly);
  }
  if (err != cudaSuccess && mapping_ == FileMapping::kReadOnly) {
    // Mode 'r' maps private pages: should a driver refuse to pin them read-only, a writable pin serves GPU reads as
    // well (each page is copied into this process, as for 'c'); GPU writes stay refused by the operators.
    (void)cudaGetLastError();
    err = cudaHostRegister(data_, mapped_size_, flags & ~cudaHostRegisterReadOnly);
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    TORCH_CHECK(false, "speedtorch: could not page-lock ", size_, " bytes of host memory",
                path_.empty() ? "" : " mapped from ", path_, " (cudaHostRegister: ", cudaGetErrorString(err),
                "); free host RAM or raise the locked-memory limit (ulimit -l)",
                path_.empty() ? "" : "; some kernels refuse to pin shared file mappings for writing: try mode 'c' "
                "or load the table instead");
  }
  pinned_ = true;
  device_read_only_ = read_only;
  // A mode 'r' mapping is registered from its construction; an 'r+' one becomes read-only for GPUs only here.
  if (read_only && mapping_ != FileMapping::kReadOnly) {
    add_read_only_range(data_, mapped_size_, /*host_writes_refused=*/false);
  }
#endif
}

void PinnedHostBuffer::unpin() {
#ifdef SPEEDTORCH_WITH_CUDA
  if (pinned_) {
    // Kernels still queued on the memory must finish before it leaves the GPU's address space.
    release_uva_accesses_in(data_, mapped_size_);
    if (device_read_only_ && mapping_ != FileMapping::kReadOnly) remove_read_only_range(data_);
    device_read_only_ = false;
    C10_CUDA_CHECK(cudaHostUnregister(data_));
    pinned_ = false;
  }
#endif
}

void PinnedHostBuffer::discard(std::size_t offset, std::size_t bytes) {
  TORCH_CHECK(!pinned_, "speedtorch: cannot discard pages of page-locked memory; unpin() first");
  TORCH_CHECK(mapping_ == FileMapping::kNone, "speedtorch: cannot discard pages of a file mapping (", path_, ")");
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t begin = (offset + page - 1) / page * page;
  const std::size_t end = std::min(offset + bytes, mapped_size_) / page * page;
  if (end <= begin) return;
  TORCH_CHECK(madvise(static_cast<char*>(data_) + begin, end - begin, MADV_DONTNEED) == 0,
              "speedtorch: madvise(MADV_DONTNEED) failed: ", std::strerror(errno));
}

PinnedHostBuffer::~PinnedHostBuffer() {
  if (data_ == nullptr) return;
  remove_read_only_range(data_);  // the address range may be reused by writable memory next
  remove_read_write_mapping(data_);
#ifdef SPEEDTORCH_WITH_CUDA
  if (pinned_) {
    // UVA kernels still queued on the memory (a table dropped right after a scatter_ from the GPU, or after an
    // optimizer step) would touch it after munmap: wait for them first.
    release_uva_accesses_in(data_, mapped_size_);
    // Never throw from a destructor; an unregister failure (e.g. at driver shutdown) only leaks the lock.
    if (cudaHostUnregister(data_) != cudaSuccess) (void)cudaGetLastError();
  }
#endif
  munmap(data_, mapped_size_);
}

at::Tensor pinned_empty(at::IntArrayRef sizes, c10::ScalarType dtype) {
  const int64_t bytes =
      checked_dense_bytes(sizes, static_cast<int64_t>(c10::elementSize(dtype)), "speedtorch.pinned_empty");
  // A zero-size table still gets one page so every table has a valid, pinned base pointer.
  auto buffer = std::make_shared<PinnedHostBuffer>(bytes == 0 ? 1 : static_cast<std::size_t>(bytes));
  return tensor_over(buffer, 0, sizes, c10::contiguous_strides(sizes), dtype);
}

at::Tensor tensor_over(const std::shared_ptr<PinnedHostBuffer>& buffer, int64_t offset_bytes, at::IntArrayRef sizes,
                       at::IntArrayRef strides, c10::ScalarType dtype) {
  TORCH_CHECK(offset_bytes >= 0 && static_cast<std::size_t>(offset_bytes) <= buffer->size(),
              "speedtorch: view offset ", offset_bytes, " outside a buffer of ", buffer->size(), " bytes");
  TORCH_CHECK(sizes.size() == strides.size(), "speedtorch: a view needs one stride per size, got sizes ", sizes,
              " and strides ", strides);
  // The last byte the view reaches must lie in the buffer: a view past its end (a file that shrank between reading
  // its header and mapping it) would fault on the first read there. Computed with overflow checks before from_blob
  // computes it: torch aborts the process on sizes whose bytes overflow.
  const int64_t extent = checked_view_extent_bytes(sizes, strides, static_cast<int64_t>(c10::elementSize(dtype)),
                                                   "speedtorch: a view of host memory");
  TORCH_CHECK(static_cast<std::size_t>(extent) <= buffer->size() - static_cast<std::size_t>(offset_bytes),
              "speedtorch: a view of sizes ", sizes, " and strides ", strides, " (", dtype, ") from byte ",
              offset_bytes, " reaches past the end of a buffer of ", buffer->size(),
              " bytes (the file is shorter than its header says?)");
  void* data = static_cast<char*>(buffer->data()) + offset_bytes;
  return at::from_blob(
      data, sizes, strides, [keep = buffer](void*) mutable { keep.reset(); },
      at::TensorOptions().dtype(dtype).device(at::kCPU));
}

}  // namespace speedtorch
