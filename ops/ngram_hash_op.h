// speedtorch::ngram_hash: the row ids of every position's hashed n-grams (csrc/core/ngram_hash_math.h defines the
// hash). One kernel for CPU and CUDA (the route follows the tokens' device) and a Meta kernel for shapes.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace speedtorch::ops {

// The C++ entry point through the dispatcher:
// speedtorch::ngram_hash(Tensor tokens, Tensor multipliers, Tensor bucket_sizes, int pad_id,
//                        Tensor? document_starts=None) -> Tensor
at::Tensor ngram_hash(const at::Tensor& tokens, const at::Tensor& multipliers, const at::Tensor& bucket_sizes,
                      int64_t pad_id, const std::optional<at::Tensor>& document_starts = std::nullopt);

at::Tensor ngram_hash_kernel(const at::Tensor& tokens, const at::Tensor& multipliers, const at::Tensor& bucket_sizes,
                             int64_t pad_id, const std::optional<at::Tensor>& document_starts);
at::Tensor ngram_hash_meta(const at::Tensor& tokens, const at::Tensor& multipliers, const at::Tensor& bucket_sizes,
                           int64_t pad_id, const std::optional<at::Tensor>& document_starts);

}  // namespace speedtorch::ops
