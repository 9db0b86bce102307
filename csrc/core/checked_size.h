// Element and byte counts computed without silent overflow: every size a table, its optimizer state or a view of
// host memory is built from goes through here. A product past 64 bits used to wrap: too small a buffer (then writes
// past its end), a negative width, or sizes that torch's from_blob cannot handle, which aborts the process (its size
// computation throws inside a noexcept function). Here it is a c10::Error that names the quantity.
#pragma once

#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace speedtorch {

// a * b (both >= 0), or a c10::Error naming `what` when the product does not fit in int64.
inline int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t out = 0;
  TORCH_CHECK(!__builtin_mul_overflow(a, b, &out), what, ": ", a, " x ", b,
              " overflows a 64-bit size; no memory holds that much");
  return out;
}

// a + b (both >= 0), or a c10::Error naming `what` when the sum does not fit in int64.
inline int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t out = 0;
  TORCH_CHECK(!__builtin_add_overflow(a, b, &out), what, ": ", a, " + ", b,
              " overflows a 64-bit size; no memory holds that much");
  return out;
}

// Bytes of a dense tensor of `sizes` (each >= 0) with elements of `element_size` bytes. Every partial product of
// the non-zero sizes must fit, not only the total: a view of zero rows may still be multiplied out row by row.
inline int64_t checked_dense_bytes(c10::IntArrayRef sizes, int64_t element_size, const char* what) {
  int64_t bytes = element_size;
  bool empty = false;
  for (const int64_t s : sizes) {
    TORCH_CHECK(s >= 0, what, ": negative dimension ", s, " in size ", sizes);
    if (s == 0) {
      empty = true;
    } else {
      bytes = checked_mul(bytes, s, what);
    }
  }
  return empty ? 0 : bytes;
}

// Bytes from a strided view's first element to one past its last (0 for an empty view), strides >= 0.
inline int64_t checked_view_extent_bytes(c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t element_size,
                                         const char* what) {
  int64_t last = 0;  // offset of the last element, in elements
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    TORCH_CHECK(sizes[d] >= 0 && strides[d] >= 0, what, ": a view needs sizes and strides >= 0, got sizes ", sizes,
                " and strides ", strides);
    if (sizes[d] == 0) return 0;
    last = checked_add(last, checked_mul(sizes[d] - 1, strides[d], what), what);
  }
  return checked_mul(checked_add(last, 1, what), element_size, what);
}

}  // namespace speedtorch
