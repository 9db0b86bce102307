// Host memory for the large CPU outputs of speedtorch's operators (rows gathered into a new CPU tensor), in
// transparent huge pages.
//
// A new tensor of tens of megabytes comes from a fresh mapping, and writing it first faults each 4 KiB page in: on
// the CPU machine a 64 MiB gather (1 thread) took 87 ms so, 46 ms in huge pages, index_select 85-95 ms
// (bench/RESULTS.md, issue 23 item 7). Advised MADV_HUGEPAGE, the same block faults 32 times. Only whole 2 MiB pages
// inside the block become huge (the block starts on one; its tail stays in 4 KiB pages), so it takes no more memory
// than asked for. Without transparent huge pages (the kernel's setting "never") the advice is ignored and nothing
// else changes. Blocks below 32 MiB come from PyTorch's CPU allocator (glibc reuses those: huge_page_output.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>

#include <cstddef>
#include <new>

namespace speedtorch {

// The allocator behind empty_cpu_output (blocks of >= 32 MiB mapped and advised, smaller ones from PyTorch's).
c10::Allocator* huge_page_output_allocator();

// The mapping behind it: `bytes` of fresh zeroed memory starting on a huge page and advised MADV_HUGEPAGE (nullptr
// when the mapping fails), and its release (the same `bytes`).
void* map_huge_pages(std::size_t bytes);
void unmap_huge_pages(void* start, std::size_t bytes);

// An allocator for standard containers (std::vector, robin_map's buckets) that may grow to gigabytes: blocks of
// >= 32 MiB mapped in huge pages (a random access into them misses the TLB far less), smaller ones from operator
// new. (IdIndex's per-slot arrays and maps: embedding/id_index.h.)
template <typename T>
struct HugePageAllocator {
  using value_type = T;
  static constexpr std::size_t kMappedBytes = std::size_t{32} << 20;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor)

  T* allocate(std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    if (bytes >= kMappedBytes) {
      if (void* start = map_huge_pages(bytes)) {
        return static_cast<T*>(start);
      }
      throw std::bad_alloc();
    }
    return static_cast<T*>(::operator new(bytes));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    const std::size_t bytes = n * sizeof(T);
    if (bytes >= kMappedBytes) {
      unmap_huge_pages(p, bytes);
    } else {
      ::operator delete(p);
    }
  }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
  template <typename U>
  bool operator!=(const HugePageAllocator<U>&) const noexcept {
    return false;
  }
};

// An uninitialised, contiguous CPU tensor of `shape` and `dtype` whose memory comes from
// huge_page_output_allocator(); otherwise an ordinary tensor (resizable, freed when its last reference goes).
at::Tensor empty_cpu_output(at::IntArrayRef shape, at::ScalarType dtype);

}  // namespace speedtorch
