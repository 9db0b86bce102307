// speedtorch::ngram_hash: entry point and kernels (see ngram_hash_op.h).
#include "ngram_hash_op.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>

#include "engram/ngram_hash.h"

namespace speedtorch::ops {
namespace {
constexpr const char* kOp = "speedtorch.ngram_hash";
}  // namespace

at::Tensor ngram_hash(const at::Tensor& tokens, const at::Tensor& multipliers, const at::Tensor& bucket_sizes,
                      int64_t pad_id, const std::optional<at::Tensor>& document_starts) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("speedtorch::ngram_hash", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                                         const std::optional<at::Tensor>&)>();
  return op.call(tokens, multipliers, bucket_sizes, pad_id, document_starts);
}

at::Tensor ngram_hash_kernel(const at::Tensor& tokens, const at::Tensor& multipliers, const at::Tensor& bucket_sizes,
                             int64_t pad_id, const std::optional<at::Tensor>& document_starts) {
  return speedtorch::ngram_hash(tokens, multipliers, bucket_sizes, pad_id, document_starts, kOp);
}

at::Tensor ngram_hash_meta(const at::Tensor& tokens, const at::Tensor& multipliers, const at::Tensor& bucket_sizes,
                           int64_t pad_id, const std::optional<at::Tensor>& document_starts) {
  check_ngram_hash_arguments(tokens, multipliers, bucket_sizes, pad_id, document_starts, kOp);
  return at::empty_symint(ngram_hash_shape(tokens, multipliers), tokens.options().dtype(at::kLong).device(at::kMeta));
}

}  // namespace speedtorch::ops
