// speedtorch::ngram_hash on tensors (see ngram_hash.h): checks, and the CPU route.
#include "engram/ngram_hash.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <limits>

#include "cpu/ngram_hash_cpu.h"

namespace speedtorch {
namespace {

// The first position holding a negative token, or -1.
template <typename Token>
int64_t first_negative(const Token* tokens, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (tokens[i] < 0) return i;
  }
  return -1;
}

// Each column's first row (the exclusive prefix sum of the sizes), after checking every size is >= 1 and that the
// table's rows fit in int64.
std::vector<int64_t> column_offsets(const at::Tensor& host_sizes, const char* op) {
  const int64_t* sizes = host_sizes.const_data_ptr<int64_t>();
  std::vector<int64_t> offsets(host_sizes.numel());
  int64_t first = 0;
  for (int64_t c = 0; c < host_sizes.numel(); ++c) {
    TORCH_CHECK_VALUE(sizes[c] >= 1, op, ": bucket_sizes holds ", sizes[c], " at flat position ", c,
                      "; every (order, head) column needs at least one row");
    TORCH_CHECK_VALUE(sizes[c] <= std::numeric_limits<int64_t>::max() - first, op,
                      ": bucket_sizes add up to more rows than int64 counts");
    offsets[c] = first;
    first += sizes[c];
  }
  return offsets;
}

}  // namespace

std::vector<c10::SymInt> ngram_hash_shape(const at::Tensor& tokens, const at::Tensor& multipliers) {
  return {tokens.sym_size(0), tokens.sym_size(1), (multipliers.sym_size(1) - 1) * multipliers.sym_size(0)};
}

void check_ngram_hash_arguments(const at::Tensor& tokens, const at::Tensor& multipliers,
                                const at::Tensor& bucket_sizes, int64_t pad_id,
                                const std::optional<at::Tensor>& document_starts, const char* op) {
  // Sizes are read as SymInts: this is also the Meta kernel's check, where they may be symbols.
  TORCH_CHECK(tokens.dim() == 2, op, ": tokens must be 2-D (batch, seq), got shape ", tokens.sym_sizes());
  TORCH_CHECK(tokens.scalar_type() == at::kLong || tokens.scalar_type() == at::kInt, op,
              ": tokens must be int64 or int32, got ", tokens.scalar_type());
  TORCH_CHECK(multipliers.dim() == 2 && multipliers.scalar_type() == at::kLong, op,
              ": multipliers must be a 2-D int64 tensor (heads, max_order), got ", multipliers.scalar_type(),
              " of shape ", multipliers.sym_sizes());
  const c10::SymInt heads = multipliers.sym_size(0);
  const c10::SymInt max_order = multipliers.sym_size(1);
  TORCH_CHECK(max_order >= 2 && max_order <= kMaxNgramOrder, op, ": multipliers has ", max_order,
              " columns, the longest n-gram's tokens: it must be in [2, ", kMaxNgramOrder, "]");
  TORCH_CHECK(heads >= 1 && (max_order - 1) * heads <= kMaxNgramColumns, op, ": ", heads, " heads of ",
              max_order - 1, " orders make ", heads * (max_order - 1), " columns; there must be 1 to ",
              kMaxNgramColumns);
  TORCH_CHECK(bucket_sizes.scalar_type() == at::kLong && bucket_sizes.dim() == 2 &&
                  bucket_sizes.sym_size(0) == max_order - 1 && bucket_sizes.sym_size(1) == heads,
              op, ": bucket_sizes must be int64 of shape (max_order - 1, heads) = (", max_order - 1, ", ", heads,
              ") (one size per n-gram order 2..", max_order, " and head), got ", bucket_sizes.scalar_type(),
              " of shape ", bucket_sizes.sym_sizes());
  TORCH_CHECK_VALUE(pad_id >= 0, op, ": pad_id must be >= 0 (a token id), got ", pad_id);
  TORCH_CHECK_VALUE(tokens.sym_size(1) >= max_order, op, ": the sequence has ", tokens.sym_size(1),
                    " tokens, fewer than the longest n-gram (", max_order, "); left-pad it with pad_id to ",
                    max_order, " tokens (padding hashes exactly as the positions before a sequence do)");
  TORCH_CHECK(multipliers.device() == tokens.device() && bucket_sizes.device() == tokens.device(), op,
              ": multipliers (", multipliers.device(), ") and bucket_sizes (", bucket_sizes.device(),
              ") must be on the tokens' device (", tokens.device(), ")");
  if (document_starts.has_value()) {
    TORCH_CHECK(document_starts->scalar_type() == at::kBool && document_starts->sym_sizes() == tokens.sym_sizes(),
                op, ": document_starts must be bool of the tokens' shape ", tokens.sym_sizes(), ", got ",
                document_starts->scalar_type(), " of shape ", document_starts->sym_sizes());
    TORCH_CHECK(document_starts->device() == tokens.device(), op, ": document_starts is on ",
                document_starts->device(), ", the tokens on ", tokens.device());
  }
}

at::Tensor ngram_hash(const at::Tensor& tokens, const at::Tensor& multipliers, const at::Tensor& bucket_sizes,
                      int64_t pad_id, const std::optional<at::Tensor>& document_starts, const char* op) {
  check_ngram_hash_arguments(tokens, multipliers, bucket_sizes, pad_id, document_starts, op);
  at::Tensor out = at::empty_symint(ngram_hash_shape(tokens, multipliers), tokens.options().dtype(at::kLong));
  const at::Tensor starts = document_starts.has_value() ? document_starts->contiguous() : at::Tensor();
  if (tokens.is_cuda()) {
#ifdef SPEEDTORCH_WITH_CUDA
    ngram_hash_cuda(tokens.contiguous(), multipliers.contiguous(), bucket_sizes.contiguous(), pad_id, starts, out, op);
    return out;
#else
    TORCH_CHECK(false, op, ": this speedtorch library was built without CUDA");
#endif
  }
  TORCH_CHECK(tokens.is_cpu(), op, ": tokens on ", tokens.device(), " are not supported");
  const at::Tensor toks = tokens.contiguous();
  const at::Tensor mult = multipliers.contiguous();
  const at::Tensor sizes = bucket_sizes.contiguous();
  const std::vector<int64_t> offsets = column_offsets(sizes, op);
  const NgramHashShape shape{multipliers.size(0), static_cast<int>(multipliers.size(1)), pad_id};
  const bool* starts_ptr = starts.defined() ? starts.const_data_ptr<bool>() : nullptr;
  const auto* mult_ptr = reinterpret_cast<const uint64_t*>(mult.const_data_ptr<int64_t>());
  auto run = [&](const auto* p) {
    const int64_t bad = first_negative(p, toks.numel());
    TORCH_CHECK_VALUE(bad < 0, op, ": tokens holds ", static_cast<int64_t>(bad < 0 ? 0 : p[bad]),
                      " at flat position ", bad, "; token ids must be >= 0");
    ngram_hash_cpu(p, starts_ptr, toks.size(0), toks.size(1), shape, mult_ptr, sizes.const_data_ptr<int64_t>(),
                   offsets.data(), out.data_ptr<int64_t>());
  };
  if (toks.scalar_type() == at::kLong) {
    run(toks.const_data_ptr<int64_t>());
  } else {
    run(toks.const_data_ptr<int32_t>());
  }
  return out;
}

}  // namespace speedtorch
