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

namespace speedtorch {

// The allocator behind empty_cpu_output (blocks of >= 32 MiB mapped and advised, smaller ones from PyTorch's).
c10::Allocator* huge_page_output_allocator();

// An uninitialised, contiguous CPU tensor of `shape` and `dtype` whose memory comes from
// huge_page_output_allocator(); otherwise an ordinary tensor (resizable, freed when its last reference goes).
at::Tensor empty_cpu_output(at::IntArrayRef shape, at::ScalarType dtype);

}  // namespace speedtorch
