// The hashed n-gram row id of one position and one hash head, written once for the CPU loop
// (cpu/ngram_hash_cpu.cpp) and the CUDA kernel (cuda/ngram_hash_kernel.cu). docs/engram.md states the same
// definition in words; tests/python/test_ngram_hash.py holds a plain-torch copy that must agree bit for bit.
//
// For the position t of a row of tokens, an n-gram order n (2 <= n <= N) and a hash head h:
//   v_k   = tokens[t - k] for k = 0 .. N-1, or pad_id where t - k lies before the row or before the document that
//           holds t (a document starts at every position where document_starts is set): the paper's padding
//           (arXiv 2601.07372), which pads the tokens before a sequence with the pad id. Once one lookback is
//           padding, every farther one is too.
//   mix_n = XOR over k < n of (v_k * multipliers[h][k]), in unsigned 64-bit arithmetic (products wrap modulo 2^64)
//   row   = offset[n-2][h] + (mix_n & (2^63 - 1)) % bucket_sizes[n-2][h]
// where offset is the exclusive prefix sum of bucket_sizes in row-major (order, head) order: every (order, head)
// pair owns its own range of rows of one table. With multipliers small enough that no product wraps (the paper bounds
// them by 2^63 / vocabulary size), the mask changes nothing and the ids equal the paper's multiplicative-XOR hash.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPEEDTORCH_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SPEEDTORCH_HOST_DEVICE inline
#endif

namespace speedtorch {

// Largest n-gram order (tokens per n-gram) and (order, head) columns the op takes: the kernels keep one position's
// lookback tokens and the columns' sizes and offsets in fixed arrays.
constexpr int kMaxNgramOrder = 8;
constexpr int kMaxNgramColumns = 256;

// The n-gram hash's shape: `heads` hash heads, n-grams of 2 .. max_order tokens, (max_order - 1) * heads columns.
struct NgramHashShape {
  int64_t heads;
  int max_order;
  int64_t pad_id;
};

// The lookback tokens v_0 .. v_{N-1} of position t in one row (`tokens` and `starts` point at the row's first
// position; `starts` may be null: no document starts).
template <typename Token>
SPEEDTORCH_HOST_DEVICE void ngram_lookback(const Token* tokens, const bool* starts, int64_t t, int max_order,
                                           int64_t pad_id, uint64_t* values) {
  values[0] = static_cast<uint64_t>(static_cast<int64_t>(tokens[t]));
  bool blocked = false;
  for (int k = 1; k < max_order; ++k) {
    // t - k belongs to another document when a document starts anywhere in (t - k, t].
    blocked = blocked || t - k < 0 || (starts != nullptr && starts[t - k + 1]);
    values[k] = blocked ? static_cast<uint64_t>(pad_id) : static_cast<uint64_t>(static_cast<int64_t>(tokens[t - k]));
  }
}

// Writes the N-1 row ids of head h (one per order, at out[(n-2) * heads + h]) from the lookback values.
// `multipliers` is heads x max_order, `sizes` and `offsets` (each column's first row) (max_order - 1) x heads, all
// row-major; every size is >= 1.
SPEEDTORCH_HOST_DEVICE void ngram_head_rows(const NgramHashShape& shape, const uint64_t* values, int64_t h,
                                            const uint64_t* multipliers, const int64_t* sizes,
                                            const int64_t* offsets, int64_t* out) {
  uint64_t mix = values[0] * multipliers[h * shape.max_order];
  for (int n = 2; n <= shape.max_order; ++n) {
    mix ^= values[n - 1] * multipliers[h * shape.max_order + n - 1];
    const int64_t column = (n - 2) * shape.heads + h;
    const uint64_t size = static_cast<uint64_t>(sizes[column]);
    out[column] = offsets[column] + static_cast<int64_t>((mix & 0x7FFFFFFFFFFFFFFFull) % size);
  }
}

}  // namespace speedtorch
