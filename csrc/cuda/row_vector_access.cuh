// How GPU row kernels split a row among threads: the widest access (16, 8, 4, 2 or 1 bytes) that the row size,
// the row stride and both base addresses allow, a power-of-two group of lanes per row so that short rows do not
// leave most of a warp idle, and the flavour of the accesses that cross PCIe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

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

// Rows in flight per group, at most `wanted`, halved while the batch would not fill `max_blocks` with them: a small
// batch is spread over more SMs instead (a 1,024-row lookup on 16 SMs ran 1.5x slower than on 64).
inline int rows_in_flight_for(int64_t rows, int lanes, int max_blocks, int wanted) {
  int r = wanted < 1 ? 1 : wanted;
  while (r > 1 && static_cast<int64_t>(grid_for((rows + r - 1) / r, lanes, max_blocks)) < max_blocks) r /= 2;
  return r;
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

// Accesses to rows read or written once per kernel (host rows over UVA above all). Streaming loads (ld.global.cs)
// and stores (st.global.cs) mark their lines evict-first instead of allocating them like any other line: over
// PCIe that took a stand-alone gather from 0.62 to 0.72-0.75 of memcpy and a scatter from 0.62 to 0.92 (issue 23's
// yardstick, bench/RESULTS.md). Both are coherent, so a kernel may also use them on rows it writes itself (the
// fused optimizer), which non-coherent (__ldg) loads would not allow.
// 16-bit element types (c10::Half, c10::BFloat16) go through their bits: the intrinsics take built-in types only.
template <typename V>
__device__ __forceinline__ V load_streaming(const V* p) {
  if constexpr (sizeof(V) == 2 && !std::is_arithmetic_v<V>) {
    const unsigned short bits = __ldcs(reinterpret_cast<const unsigned short*>(p));
    V v;
    memcpy(&v, &bits, sizeof(v));
    return v;
  } else {
    return __ldcs(p);
  }
}
template <typename V>
__device__ __forceinline__ void store_streaming(V* p, V v) {
  if constexpr (sizeof(V) == 2 && !std::is_arithmetic_v<V>) {
    unsigned short bits;
    memcpy(&bits, &v, sizeof(bits));
    __stcs(reinterpret_cast<unsigned short*>(p), bits);
  } else {
    __stcs(p, v);
  }
}

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
