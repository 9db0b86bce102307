// CPU row gather / scatter (see row_copy_cpu.h).
#include "cpu/row_copy_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

namespace speedtorch {
namespace {

// Rows are scattered over gigabytes: a thread that waits for each row in turn gets a few GB/s. Asking for each
// row's first cache line a few rows ahead keeps misses in flight per core; the hardware prefetchers fetch the rest
// of the row once its first line is read. Measured on the H100 host (bench/RESULTS.md, run 36), staged gathers of
// 512-byte rows: 32-35 GB/s with 16 threads like this, 28-34 without prefetching, and 17-25 when every line of the
// row was prefetched non-temporally (prefetchnta), which the copy to staging then missed.
constexpr int64_t kPrefetchDistance = 8;
constexpr int64_t kGrainRows = 256;

inline void prefetch_row_start(const char* row) { __builtin_prefetch(row, /*rw=*/0, /*locality=*/3); }

// Which of `lanes` workers owns row `index`: a multiplicative hash, then a multiply-high into [0, lanes).
inline int64_t owner_lane(int64_t index, int64_t lanes) {
  const uint64_t h = static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull;
  return static_cast<int64_t>((static_cast<unsigned __int128>(h) * static_cast<uint64_t>(lanes)) >> 64);
}

// Rows a thread must have before a second one is woken: at least kGrainRows and 256 KiB. Below that, waking OpenMP
// threads costs more than the copy, and on a loaded machine far more (a parallel region waits for its slowest
// thread, which the scheduler may not run for milliseconds; bench/RESULTS.md, issue 16's CPU runs).
constexpr int64_t kGrainBytes = 256 << 10;

inline int64_t grain_rows(int64_t row_bytes) {
  return std::max<int64_t>(kGrainRows, kGrainBytes / std::max<int64_t>(1, row_bytes));
}

}  // namespace

template <typename Index>
void gather_rows_cpu(const HostRows& table, const Index* indices, int64_t count, char* out) {
  const int64_t rb = table.row_bytes;
  // Rows of zero width have no storage: memcpy of 0 bytes from a null pointer is still undefined behaviour.
  if (count == 0 || rb == 0) return;
  at::parallel_for(0, count, grain_rows(rb), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (i + kPrefetchDistance < end) {
        prefetch_row_start(table.base + static_cast<int64_t>(indices[i + kPrefetchDistance]) * table.row_stride_bytes);
      }
      std::memcpy(out + i * rb, table.base + static_cast<int64_t>(indices[i]) * table.row_stride_bytes, rb);
    }
  });
}

template <typename Index>
void scatter_rows_cpu(const HostRows& table, const Index* indices, int64_t count, const char* src,
                      const uint8_t* keep) {
  const int64_t rb = table.row_bytes;
  if (count == 0 || rb == 0) return;  // as in gather_rows_cpu
  auto row = [&](int64_t i) { return table.base + static_cast<int64_t>(indices[i]) * table.row_stride_bytes; };
  const int64_t grain = grain_rows(rb);
  if (keep != nullptr) {
    at::parallel_for(0, count, grain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        if (keep[i]) std::memcpy(row(i), src + i * rb, rb);
      }
    });
    return;
  }
  // Duplicates may be anywhere, so split the work by row, not by position: every worker scans all positions in
  // order and writes only the rows it owns. Each row then has one writer, and its last occurrence lands last.
  const int64_t lanes = at::get_num_threads();
  if (lanes <= 1 || count < 2 * grain) {
    for (int64_t i = 0; i < count; ++i) std::memcpy(row(i), src + i * rb, rb);
    return;
  }
  at::parallel_for(0, lanes, 1, [&](int64_t lane_begin, int64_t lane_end) {
    for (int64_t lane = lane_begin; lane < lane_end; ++lane) {
      for (int64_t i = 0; i < count; ++i) {
        if (owner_lane(static_cast<int64_t>(indices[i]), lanes) == lane) std::memcpy(row(i), src + i * rb, rb);
      }
    }
  });
}

template void gather_rows_cpu<int32_t>(const HostRows&, const int32_t*, int64_t, char*);
template void gather_rows_cpu<int64_t>(const HostRows&, const int64_t*, int64_t, char*);
template void scatter_rows_cpu<int32_t>(const HostRows&, const int32_t*, int64_t, const char*, const uint8_t*);
template void scatter_rows_cpu<int64_t>(const HostRows&, const int64_t*, int64_t, const char*, const uint8_t*);

}  // namespace speedtorch
