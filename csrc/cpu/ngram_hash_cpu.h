// speedtorch::ngram_hash on CPU threads: the row ids of every position's n-grams (core/ngram_hash_math.h).
#pragma once

#include <cstdint>

#include "core/ngram_hash_math.h"

namespace speedtorch {

// tokens: batch x seq, row-major; starts: the same shape, or null. multipliers, sizes and offsets as
// ngram_head_rows() takes them. out: batch x seq x columns. Values are not checked here (the caller has).
template <typename Token>
void ngram_hash_cpu(const Token* tokens, const bool* starts, int64_t batch, int64_t seq, const NgramHashShape& shape,
                    const uint64_t* multipliers, const int64_t* sizes, const int64_t* offsets, int64_t* out);

}  // namespace speedtorch
