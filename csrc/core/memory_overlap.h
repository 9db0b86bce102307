// Whether two tensors may share memory: the check each in-place row operation makes between what it writes (a
// table, an optimizer state) and what it still reads (src, grad, indices), as torch's index_copy_ makes it
// (at::assert_no_overlap). Rows written while rows of the same memory are still to be read come out in whatever
// order the threads or GPU blocks ran: scatter_(t, arange(1, 6), t[0:5]) made every row equal to row 0.
//
// Compared by address, not by storage: PinnedEmbedding's weights and state are views of one buffer, each with a
// storage of its own (tensor_over), and a tensor made with from_blob over a table's memory has one too, so sharing a
// storage is not what decides. Each tensor stands for the bytes from its lowest element to its highest, gaps of a
// strided tensor included: a src in the gaps between a padded table's rows is refused too, though it shares no
// element (clone() it). Addresses are compared whatever the devices: with unified virtual addressing (every 64-bit
// CUDA platform) host and device memory share an address only when they are the same memory (a pinned host table
// seen from a GPU).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace speedtorch {

// [begin, end) of the bytes a tensor's elements lie in; empty (begin == end) for a tensor of no elements or no data.
struct ByteRange {
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;
};

inline ByteRange byte_range(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage() || t.numel() == 0) return {};
  const auto* data = static_cast<const char*>(t.const_data_ptr());
  if (data == nullptr) return {};
  int64_t lowest = 0;
  int64_t highest = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t span = (t.size(d) - 1) * t.stride(d);
    (span < 0 ? lowest : highest) += span;
  }
  const auto at = reinterpret_cast<std::uintptr_t>(data);
  const auto item = static_cast<std::uintptr_t>(t.element_size());
  return {at + static_cast<std::uintptr_t>(lowest) * item, at + static_cast<std::uintptr_t>(highest + 1) * item};
}

inline bool may_share_memory(const at::Tensor& a, const at::Tensor& b) {
  const ByteRange x = byte_range(a);
  const ByteRange y = byte_range(b);
  return x.begin < x.end && y.begin < y.end && x.begin < y.end && y.begin < x.end;
}

// Refuses, naming both and the way out, when `read` (which the operation `op` reads) may share memory with
// `written` (which it writes in place).
inline void check_no_overlap(const at::Tensor& written, const char* written_name, const at::Tensor& read,
                             const char* read_name, const char* op) {
  TORCH_CHECK(!may_share_memory(written, read), op, ": ", read_name, " and ", written_name, " share memory (", op,
              " writes ", written_name, " in place while it reads ", read_name,
              ", so the result would depend on the order of the writes); pass a copy: ", read_name, ".clone()");
}

}  // namespace speedtorch
