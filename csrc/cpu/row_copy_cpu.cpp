// CPU row gather / scatter (see row_copy_cpu.h).
#include "cpu/row_copy_cpu.h"

#include "cpu/helped_parallel_for.h"


#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace speedtorch {
namespace {

// Rows are scattered over gigabytes: a thread that waits for each row in turn gets a few GB/s. Asking for each
// row's first cache line a few rows ahead keeps misses in flight per core; the hardware prefetchers fetch the rest
// of the row once its first line is read. Measured on the H100 host (bench/RESULTS.md, run 36), staged gathers of
// 512-byte rows: 32-35 GB/s with 16 threads like this, 28-34 without prefetching, and 17-25 when every line of the
// row was prefetched non-temporally (prefetchnta), which the copy to staging then missed.
constexpr int64_t kPrefetchDistance = 8;

inline void prefetch_row_start(const char* row) { __builtin_prefetch(row, /*rw=*/0, /*locality=*/3); }

// Which of `lanes` workers owns row `index`: a multiplicative hash, then a multiply-high into [0, lanes).
inline int64_t owner_lane(int64_t index, int64_t lanes) {
  const uint64_t h = static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull;
  return static_cast<int64_t>((static_cast<unsigned __int128>(h) * static_cast<uint64_t>(lanes)) >> 64);
}

// How many threads a copy of `bytes` gets. Below kSerialBytes, only the calling thread: waking another costs more
// than it saves (on the CPU machine, a VM, an idle one, a sleeping helper asked for starts within 3 us in half the
// calls, but in a third not within 400 us, queued behind the busy caller: a 256 KiB gather took 26 us with a
// helper asked for, 9 us alone). Above it, helpers that join when they can (cpu/helped_parallel_for.h), whatever
// the size: at::parallel_for splits the work up front and waits for every thread, also one the scheduler has not
// run yet, which costs a scheduling period (CFS's is 24 ms on a machine of 8 CPUs or more) however short the copy.
// Issue 23 item 7: a demo step's 512 KiB gather took 5 ms with 2 threads at a load of 10, 20 us alone. Issue 30
// item 4: copies of more than 4 MiB went to OpenMP until then, every 8 MiB chunk of a transfer's staged share among
// them, which runs on the calling thread before the call returns. On the 2-core CPU machine at a load of 18, a
// gather of 4 MiB and one row (8,193 spread 512-byte rows) with 2 threads took 24.0, 24.0 and 28.0 ms in the median
// of 200 calls through OpenMP, and 0.12-0.13 ms through the helpers (90th percentile 0.39-1.7 ms), three runs each
// in turns: the 23.97 ms of the `auto` gathers that once took that long a call on the GPU machine, where UVA alone
// took 1.6 ms.
constexpr int64_t kSerialBytes = 1 << 20;
constexpr int64_t kHelpedGrainBytes = 64 << 10;

// fn(begin, end) over [0, count), each item once, on as many threads as `bytes` (the whole call's) call for, in
// chunks of `grain` items.
template <typename Fn>
void for_ranges(int64_t count, int64_t bytes, int64_t grain, const Fn& fn) {
  if (bytes < kSerialBytes) return fn(0, count);
  helped_parallel_for(count, grain, fn);
}

// fn(begin, end) over the rows [0, count), each row once.
template <typename Fn>
void for_row_ranges(int64_t count, int64_t row_bytes, const Fn& fn) {
  const int64_t rb = std::max<int64_t>(1, row_bytes);
  for_ranges(count, count * row_bytes, std::max<int64_t>(1, kHelpedGrainBytes / rb), fn);
}

// Calls fn with the row size as a compile-time constant for the common ones (rows of 16 to 128 float32, or 32 to
// 256 half), else as a run-time value: a copy of a known size is a few vector moves in place of a call to memcpy.
template <typename Fn>
void with_row_bytes(int64_t row_bytes, Fn&& fn) {
  switch (row_bytes) {
    case 64: return fn(std::integral_constant<int64_t, 64>{});
    case 128: return fn(std::integral_constant<int64_t, 128>{});
    case 256: return fn(std::integral_constant<int64_t, 256>{});
    case 512: return fn(std::integral_constant<int64_t, 512>{});
    default: return fn(row_bytes);
  }
}

// Copies one row: memcpy, expanded in place when the size is a compile-time constant.
struct BaselineRowCopy {
  template <typename RowBytes>
  static void copy(char* dst, const char* src, RowBytes rb) { std::memcpy(dst, src, rb); }
};

#if defined(__x86_64__)
// Row sizes known at compile time to be whole 32-byte moves.
template <typename RowBytes>
constexpr bool kWhole32ByteMoves = false;
template <int64_t N>
constexpr bool kWhole32ByteMoves<std::integral_constant<int64_t, N>> = N % 32 == 0;

// The same in 32-byte AVX2 moves for such sizes (GCC expands a memcpy of known size in 16-byte ones).
struct Avx2RowCopy {
  template <typename RowBytes>
  __attribute__((target("avx2"))) static void copy(char* dst, const char* src, RowBytes rb) {
    if constexpr (!kWhole32ByteMoves<RowBytes>) {
      std::memcpy(dst, src, rb);
    } else {
      for (int64_t off = 0; off < rb; off += 32) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + off),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + off)));
      }
    }
  }
};
#endif

// Rows [begin, end) of a gather. kChecked: each index is checked before its row is read, and the copy stops at the
// first one out of range, returning its position (-1: none).
template <bool kChecked, typename RowCopy, typename Index, typename RowBytes>
__attribute__((always_inline)) inline int64_t gather_range(const HostRows& table, const Index* indices,
                                                           int64_t begin, int64_t end, char* out, RowBytes rb) {
  // Locals, so the compiler need not reload them after each store to `out`.
  const char* base = table.base;
  const int64_t stride = table.row_stride_bytes;
  const uint64_t num_rows = static_cast<uint64_t>(table.num_rows);
  for (int64_t i = begin; i < end; ++i) {
    if (i + kPrefetchDistance < end) {
      const int64_t ahead = static_cast<int64_t>(indices[i + kPrefetchDistance]);
      if (!kChecked || static_cast<uint64_t>(ahead) < num_rows) prefetch_row_start(base + ahead * stride);
    }
    const int64_t index = static_cast<int64_t>(indices[i]);
    if (kChecked && static_cast<uint64_t>(index) >= num_rows) return i;  // negative ones too
    RowCopy::copy(out + i * rb, base + index * stride, rb);
  }
  return -1;
}

#if defined(__x86_64__)
// The same loop compiled for AVX2, chosen at run time (the library still runs on any x86-64): a row of known size
// is copied in 32-byte moves, half as many as the baseline's 16-byte ones. Rows in cache (a batch's rows spread
// over its positions, a hot table) are copied at the rate the core stores them.
template <bool kChecked, typename Index, typename RowBytes>
__attribute__((target("avx2"), flatten)) int64_t gather_range_avx2(const HostRows& table, const Index* indices,
                                                                   int64_t begin, int64_t end, char* out,
                                                                   RowBytes rb) {
  return gather_range<kChecked, Avx2RowCopy>(table, indices, begin, end, out, rb);
}

const bool kHasAvx2 = __builtin_cpu_supports("avx2");
#endif

template <bool kChecked, typename Index, typename RowBytes>
int64_t gather_range_best(const HostRows& table, const Index* indices, int64_t begin, int64_t end, char* out,
                          RowBytes rb) {
#if defined(__x86_64__)
  if (kHasAvx2) return gather_range_avx2<kChecked>(table, indices, begin, end, out, rb);
#endif
  return gather_range<kChecked, BaselineRowCopy>(table, indices, begin, end, out, rb);
}

template <bool kChecked, typename Index>
int64_t gather_rows(const HostRows& table, const Index* indices, int64_t count, char* out) {
  if (table.row_bytes == 0) {  // nothing to copy (the table and `out` may have no memory): only the check
    for (int64_t i = 0; kChecked && i < count; ++i) {
      if (static_cast<uint64_t>(indices[i]) >= static_cast<uint64_t>(table.num_rows)) return i;
    }
    return -1;
  }
  // Each range stops at its first bad index, so the smallest of those is the first bad position of all.
  std::atomic<int64_t> first_bad{-1};
  with_row_bytes(table.row_bytes, [&](auto rb) {
    for_row_ranges(count, rb, [&](int64_t begin, int64_t end) {
      const int64_t bad = gather_range_best<kChecked>(table, indices, begin, end, out, rb);
      int64_t seen = first_bad.load();
      while (bad >= 0 && (seen < 0 || bad < seen) && !first_bad.compare_exchange_weak(seen, bad)) {
      }
    });
  });
  return first_bad.load();
}

// Whether the indices are strictly increasing, hence distinct (one serial pass, stopping at the first descent).
template <typename Index>
bool strictly_increasing(const Index* indices, int64_t count) {
  for (int64_t i = 1; i < count; ++i) {
    if (indices[i] <= indices[i - 1]) return false;
  }
  return true;
}

}  // namespace

template <typename Index>
void gather_rows_cpu(const HostRows& table, const Index* indices, int64_t count, char* out) {
  gather_rows<false>(table, indices, count, out);
}

template <typename Index>
int64_t gather_rows_checked_cpu(const HostRows& table, const Index* indices, int64_t count, char* out) {
  return gather_rows<true>(table, indices, count, out);
}

template <typename Index>
void scatter_rows_cpu(const HostRows& table, const Index* indices, int64_t count, const char* src,
                      const uint8_t* keep) {
  const int64_t rb = table.row_bytes;
  if (rb == 0) return;  // nothing to copy (the table and `src` may have no memory)
  auto row = [&](int64_t i) { return table.base + static_cast<int64_t>(indices[i]) * table.row_stride_bytes; };
  // One writer per row already (a keep mask, or distinct indices: a step's write-back): split by position, and ask
  // for each destination row a few rows ahead, as the gather does for its sources (a store to a row not in cache
  // otherwise waits for its line to be read first).
  if (keep != nullptr || strictly_increasing(indices, count)) {
    for_row_ranges(count, rb, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t ahead = i + kPrefetchDistance;
        if (ahead < end && (keep == nullptr || keep[ahead])) __builtin_prefetch(row(ahead), /*rw=*/1, 3);
        if (keep == nullptr || keep[i]) std::memcpy(row(i), src + i * rb, rb);
      }
    });
    return;
  }
  // Duplicates may be anywhere, so split the work by row, not by position: every lane scans all positions in
  // order and writes only the rows it owns. Each row then has one writer, and its last occurrence lands last.
  const int64_t lanes = count * rb < kSerialBytes ? 1 : helped_thread_count();
  if (lanes <= 1) {
    for (int64_t i = 0; i < count; ++i) std::memcpy(row(i), src + i * rb, rb);
    return;
  }
  for_ranges(lanes, count * rb, /*grain=*/1, [&](int64_t lane_begin, int64_t lane_end) {
    for (int64_t lane = lane_begin; lane < lane_end; ++lane) {
      for (int64_t i = 0; i < count; ++i) {
        if (owner_lane(static_cast<int64_t>(indices[i]), lanes) == lane) std::memcpy(row(i), src + i * rb, rb);
      }
    }
  });
}

template void gather_rows_cpu<int32_t>(const HostRows&, const int32_t*, int64_t, char*);
template void gather_rows_cpu<int64_t>(const HostRows&, const int64_t*, int64_t, char*);
template int64_t gather_rows_checked_cpu<int32_t>(const HostRows&, const int32_t*, int64_t, char*);
template int64_t gather_rows_checked_cpu<int64_t>(const HostRows&, const int64_t*, int64_t, char*);
template void scatter_rows_cpu<int32_t>(const HostRows&, const int32_t*, int64_t, const char*, const uint8_t*);
template void scatter_rows_cpu<int64_t>(const HostRows&, const int64_t*, int64_t, const char*, const uint8_t*);

}  // namespace speedtorch
