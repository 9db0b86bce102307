// speedtorch::gather_dequant on CPU threads (see gather_dequant_cpu.h): rows split across threads.
#include "cpu/gather_dequant_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>

namespace speedtorch {

template <typename Index>
void gather_dequant_cpu(const HostRows& table, RowFormat format, int64_t dim, const Index* indices, int64_t count,
                        c10::BFloat16* out) {
  // Each row is a cache (and often page) miss and dim conversions: a thousand rows are worth a thread.
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, dim));
  at::parallel_for(0, count, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = indices != nullptr ? static_cast<int64_t>(indices[i]) : i;
      const auto* src = reinterpret_cast<const uint8_t*>(table.base + row * table.row_stride_bytes);
      c10::BFloat16* dst = out + i * dim;
      for (int64_t j = 0; j < dim; ++j) dst[j] = dequantize_element(format, src, dim, j);
    }
  });
}

template void gather_dequant_cpu<int32_t>(const HostRows&, RowFormat, int64_t, const int32_t*, int64_t,
                                          c10::BFloat16*);
template void gather_dequant_cpu<int64_t>(const HostRows&, RowFormat, int64_t, const int64_t*, int64_t,
                                          c10::BFloat16*);

}  // namespace speedtorch
