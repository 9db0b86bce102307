// Rows summed by index on CPU threads (see row_sum_cpu.h).
#include "cpu/row_sum_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

#include "cpu/helped_parallel_for.h"

namespace speedtorch {
namespace {

// Floats a thread must have to add before a second one is asked to help: 1 MiB of gradient rows, about a
// millisecond of work. A batch below that is summed by the calling thread: waking another costs more.
constexpr int64_t kGrainFloats = 1 << 18;

void add_rows(const float* __restrict src, float* __restrict out, int64_t dim) {
  for (int64_t j = 0; j < dim; ++j) out[j] += src[j];
}

}  // namespace

template <typename Index>
void sum_rows_by_index_cpu(const Index* rows, int64_t count, const float* src, int64_t dim, float* out,
                           int64_t out_rows) {
  if (dim == 0 || out_rows == 0) return;  // nothing to write (and `out` may be null: no memset of it)
  // Each lane owns a range of output rows and scans every position in order, so each row's sum keeps its order
  // whatever the number of lanes.
  const int64_t lanes = std::max<int64_t>(
      1, std::min<int64_t>({at::get_num_threads(), count * dim / kGrainFloats, out_rows}));
  auto sum_lane = [&](int64_t lane) {
    const int64_t lo = out_rows * lane / lanes;
    const int64_t hi = out_rows * (lane + 1) / lanes;
    std::memset(out + lo * dim, 0, static_cast<size_t>((hi - lo) * dim) * sizeof(float));
    for (int64_t i = 0; i < count; ++i) {
      const int64_t r = static_cast<int64_t>(rows[i]);
      if (r >= lo && r < hi) add_rows(src + i * dim, out + r * dim, dim);
    }
  };
  if (lanes == 1) return sum_lane(0);
  // Helpers, not an OpenMP region, which would wait for a thread the scheduler has not run (milliseconds on a loaded
  // machine; cpu/helped_parallel_for.h): the calling thread sums the lanes no helper has taken.
  helped_parallel_for(lanes, 1, [&](int64_t begin, int64_t end) {
    for (int64_t lane = begin; lane < end; ++lane) sum_lane(lane);
  });
}

template void sum_rows_by_index_cpu<int32_t>(const int32_t*, int64_t, const float*, int64_t, float*, int64_t);
template void sum_rows_by_index_cpu<int64_t>(const int64_t*, int64_t, const float*, int64_t, float*, int64_t);

}  // namespace speedtorch
