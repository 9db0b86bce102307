// Huge-page host memory for large CPU outputs (see huge_page_output.h).
#include "memory/huge_page_output.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

namespace speedtorch {
namespace {

constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

// Blocks from this size on are mapped here. glibc maps such a block afresh for every allocation (32 MiB is the
// largest its adaptive mmap threshold grows to), so each call faults every page in; a smaller block is served from
// its heap once one of that size was freed, pages already in. Measured on the CPU machine (1 thread, rows of 512
// bytes): a 64 MiB gather 87 ms in 4 KiB pages, 46 ms in huge pages; a 16 MiB one 3-8 ms from glibc's heap and
// 10 ms mapped here every call.
constexpr std::size_t kMappedBytes = std::size_t{32} << 20;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// What the deleter needs to unmap a block.
struct MappedBlock {
  void* start;
  std::size_t bytes;
};

void unmap_block(void* context) {
  auto* block = static_cast<MappedBlock*>(context);
  munmap(block->start, block->bytes);
  delete block;
}

class HugePageOutputAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) override {
    if (n < kMappedBytes) return c10::GetCPUAllocator()->allocate(n);
    static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t bytes = round_up(n, page);
    void* start = map_huge_pages(bytes);
    if (start == nullptr) return c10::GetCPUAllocator()->allocate(n);  // which reports the failure its own way
    return {start, new MappedBlock{start, bytes}, &unmap_block, c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

}  // namespace

void* map_huge_pages(std::size_t n) {
  static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t bytes = round_up(n, page);
  // One huge page more than needed, then the unaligned head and the tail beyond `bytes` go back.
  void* raw = mmap(nullptr, bytes + kHugePageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto raw_begin = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t begin = round_up(raw_begin, kHugePageBytes);
  const std::size_t head = begin - raw_begin;  // at most a huge page less one page: the tail keeps >= a page
  if (head > 0) munmap(raw, head);
  munmap(reinterpret_cast<void*>(begin + bytes), kHugePageBytes - head);
  void* start = reinterpret_cast<void*>(begin);
  madvise(start, bytes, MADV_HUGEPAGE);  // advice: ignored where transparent huge pages are off
  return start;
}

void unmap_huge_pages(void* start, std::size_t n) {
  static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  munmap(start, round_up(n, page));
}

c10::Allocator* huge_page_output_allocator() {
  static HugePageOutputAllocator allocator;
  return &allocator;
}

at::Tensor empty_cpu_output(at::IntArrayRef shape, at::ScalarType dtype) {
  return at::detail::empty_generic(shape, huge_page_output_allocator(), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   dtype, std::nullopt);
}

}  // namespace speedtorch
