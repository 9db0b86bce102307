// speedtorch::ngram_hash on CPU threads (see ngram_hash_cpu.h): positions split across threads.
#include "cpu/ngram_hash_cpu.h"

#include <ATen/Parallel.h>

namespace speedtorch {

template <typename Token>
void ngram_hash_cpu(const Token* tokens, const bool* starts, int64_t batch, int64_t seq, const NgramHashShape& shape,
                    const uint64_t* multipliers, const int64_t* sizes, const int64_t* offsets, int64_t* out) {
  const int64_t columns = (shape.max_order - 1) * shape.heads;
  // A position costs heads x orders multiply-xor-modulo steps: a few hundred nanoseconds.
  const int64_t grain = 1 + 4096 / (columns + 1);
  at::parallel_for(0, batch * seq, grain, [&](int64_t begin, int64_t end) {
    uint64_t values[kMaxNgramOrder];
    for (int64_t p = begin; p < end; ++p) {
      const int64_t b = p / seq;
      const int64_t t = p - b * seq;
      ngram_lookback(tokens + b * seq, starts != nullptr ? starts + b * seq : nullptr, t, shape.max_order,
                     shape.pad_id, values);
      for (int64_t h = 0; h < shape.heads; ++h) {
        ngram_head_rows(shape, values, h, multipliers, sizes, offsets, out + p * columns);
      }
    }
  });
}

template void ngram_hash_cpu<int32_t>(const int32_t*, const bool*, int64_t, int64_t, const NgramHashShape&,
                                      const uint64_t*, const int64_t*, const int64_t*, int64_t*);
template void ngram_hash_cpu<int64_t>(const int64_t*, const bool*, int64_t, int64_t, const NgramHashShape&,
                                      const uint64_t*, const int64_t*, const int64_t*, int64_t*);

}  // namespace speedtorch
