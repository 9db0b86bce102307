// How GPU row kernels split a row among threads: the widest access (16, 8, 4, 2 or 1 bytes) that the row size,
// the row stride and both base addresses allow, and a power-of-two group of lanes per row so that short rows do
// not leave most of a warp idle.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/launch_shape.h"

namespace speedtorch {
namespace row_access {

// Largest of 16/8/4/2/1 dividing every value given.
inline int widest_access_bytes(std::initializer_list<uint64_t> values) {
  for (int width = 16; width > 1; width /= 2) {
    bool ok = true;
    for (const uint64_t v : values) ok = ok && (v % width == 0);
    if (ok) return width;
  }
  return 1;
}

// Lanes per row: the number of vectors in a row rounded up to a power of two, at most a warp.
inline int lanes_per_row(int64_t vectors_per_row) {
  int lanes = 1;
  while (lanes < 32 && lanes < vectors_per_row) lanes *= 2;
  return lanes;
}

// Enough blocks to give every row its lanes, capped at `max_blocks` (the grid strides over the rest).
inline unsigned grid_for(int64_t rows, int lanes, int max_blocks) {
  const int64_t threads = rows * lanes;
  const int64_t blocks = (threads + kThreadsPerBlock - 1) / kThreadsPerBlock;
  const int64_t cap = max_blocks < 1 ? 1 : max_blocks;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks < cap ? blocks : cap));
}

template <int Bytes>
struct Vector;
template <>
struct Vector<16> {
  using type = uint4;
};
template <>
struct Vector<8> {
  using type = uint2;
};
template <>
struct Vector<4> {
  using type = uint32_t;
};
template <>
struct Vector<2> {
  using type = uint16_t;
};
template <>
struct Vector<1> {
  using type = uint8_t;
};

// All bits set: NaN in float32, float16 and bfloat16 alike, so a row left unread for a bad index is never
// mistaken for data.
template <typename V>
__device__ __forceinline__ V all_ones() {
  V v;
  unsigned char* bytes = reinterpret_cast<unsigned char*>(&v);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(V)); ++i) bytes[i] = 0xFF;
  return v;
}

}  // namespace row_access
}  // namespace speedtorch
