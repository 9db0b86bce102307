// Row gather and scatter between a host table and a contiguous host buffer, on CPU threads.
//
// The rows are opaque bytes (row_bytes each, row_stride_bytes apart in the table), so one routine serves every
// dtype. These are the CPU-only product path, the staged half of the transfer engine, and the tests' reference.
// Indices must already be validated (cpu/index_range_check.h), but for gather_rows_checked_cpu.
#pragma once

#include <cstdint>

namespace speedtorch {

struct HostRows {
  char* base;                // row 0 of the table
  int64_t num_rows;
  int64_t row_stride_bytes;  // distance between consecutive rows
  int64_t row_bytes;         // bytes copied per row
};

// out[i] = table[indices[i]] for i in [0, count); `out` is dense (count * row_bytes).
template <typename Index>
void gather_rows_cpu(const HostRows& table, const Index* indices, int64_t count, char* out);

// gather_rows_cpu for indices not validated yet: each is checked before its row is read (no second pass over the
// indices). Returns -1, or the smallest position holding an index outside [0, num_rows): then `out` is partly
// written and must be discarded (cpu/index_range_check.h words the error).
template <typename Index>
int64_t gather_rows_checked_cpu(const HostRows& table, const Index* indices, int64_t count, char* out);

// table[indices[i]] = src[i]. Duplicate indices: the last occurrence wins, exactly as a sequential loop would,
// and no row is ever a mix of two sources. With `keep` (one byte per position, from a duplicate resolution done
// elsewhere) only positions with keep[i] != 0 are written and they must name distinct rows.
template <typename Index>
void scatter_rows_cpu(const HostRows& table, const Index* indices, int64_t count, const char* src,
                      const uint8_t* keep = nullptr);

}  // namespace speedtorch
